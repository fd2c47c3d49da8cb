"""Shared fixtures: real synthetic speech (espeak-ng) in Kaldi data dirs, made once per test session."""
from __future__ import annotations

import locale
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Short sentences keep the end-to-end tests fast; disjoint splits are taken from these by the tool.
SHORT_SENTENCES = """THE CAT SAT ON THE MAT
A DOG RAN IN THE PARK
SHE READ A GOOD BOOK
WE WALKED HOME TOGETHER
THE SUN IS VERY WARM
HE DRANK A CUP OF TEA
BIRDS SING IN THE MORNING
IT WAS A QUIET NIGHT
THE DOOR WAS OPEN
MY FRIEND LIKES MUSIC
THE RIVER RUNS FAST
THEY PLAYED A GAME
""".strip().splitlines()


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """data/{train,dev,test} with 8/2/2 utterances of clean espeak-ng speech (about 1.5 s each)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    root = tmp_path_factory.mktemp("corpus")
    sentences = root / "sentences.txt"
    sentences.write_text("\n".join(SHORT_SENTENCES) + "\n")
    subprocess.run([sys.executable, str(REPO / "tools" / "make_synthetic_corpus.py"), "--out", str(root / "data"),
                    "--num-train", "8", "--num-dev", "2", "--num-test", "2", "--seed", "3", "--no-noise",
                    "--train-synths", "espeak", "--num-test-unseen", "0",
                    "--sentences", str(sentences), "--no-progress"], check=True)
    return root / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny test models run fastest on one thread; more threads only contend (and subprocess tests add their own).
    ASRKIT_TEST_THREADS=N runs the suite with N threads, to check that no result depends on the thread count."""
    import torch

    torch.set_num_threads(int(os.environ.get("ASRKIT_TEST_THREADS", "1")))


@pytest.fixture
def c_locale():
    """The C locale (ASCII) for the test, as on a minimal container or a CI runner without LANG: a file
    opened with the locale's encoding instead of UTF-8 fails on non-ASCII text then (when Python is not in
    UTF-8 mode)."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


@pytest.fixture
def not_installed(monkeypatch):
    """``not_installed("onnx", ...)``: until the test ends, importing these packages (or their submodules) fails as
    it does where they are not installed (sys.modules[name] = None makes ``import name`` raise
    ModuleNotFoundError)."""
    def hide(*packages: str) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in packages:
                monkeypatch.delitem(sys.modules, name)
        for package in packages:
            monkeypatch.setitem(sys.modules, package, None)

    return hide
