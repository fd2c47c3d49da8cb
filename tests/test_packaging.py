"""setup.py and LICENSE: the core install leaves the optional packages out, every optional package has the extra
that asrkit/extras.py names, `dev` holds every extra, and the license is Apache-2.0 as the ASF publishes it."""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from asrkit.extras import EXTRA_OF

REPO = Path(__file__).resolve().parents[1]
# SHA-256 of https://www.apache.org/licenses/LICENSE-2.0.txt
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
COPYRIGHT = "Copyright 2026 the asrkit authors"
TEST_ONLY = {"librosa"}  # references the tests compare against, in dev only


@pytest.fixture(scope="module")
def setup_args() -> dict:
    """The keyword arguments setup.py passes to setuptools.setup (run with setup() replaced)."""
    old = Path.cwd()
    os.chdir(REPO)  # setup.py reads its files by relative path
    try:
        with mock.patch("setuptools.setup") as setup:
            runpy.run_path(str(REPO / "setup.py"))
    finally:
        os.chdir(old)
    return setup.call_args.kwargs


def names(requirements) -> set:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_license_is_the_asf_text_with_our_copyright_line(setup_args):
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.count(COPYRIGHT) == 1
    template = text.replace(COPYRIGHT, "Copyright [yyyy] [name of copyright owner]")
    assert hashlib.sha256(template.encode("utf-8")).hexdigest() == APACHE_2_SHA256
    assert setup_args["license"] == "Apache-2.0" and setup_args["license_files"] == ["LICENSE"]


def test_core_install_leaves_out_what_only_some_commands_use(setup_args):
    core = names(setup_args["install_requires"])
    optional = set().union(*(names(reqs) for extra, reqs in setup_args["extras_require"].items()))
    assert core & optional == set()
    assert {"librosa", "scipy", "matplotlib", "onnx", "onnxruntime", "onnxscript", "webdataset"} <= optional
    assert "tensorboard" in core  # training writes its scalars for TensorBoard (a guide requirement)


def test_each_optional_package_is_installed_by_the_extra_its_error_names(setup_args):
    extras = setup_args["extras_require"]
    provided_by = importlib.metadata.packages_distributions()  # module -> installed distributions
    for module, extra in EXTRA_OF.items():
        dists = names(provided_by[module])
        assert dists & names(extras[extra]), f"{module}: no distribution of {sorted(dists)} in [{extra}]"
    # and the other way round: every package of an extra (but dev's and bench's own) has its error
    for extra, reqs in extras.items():
        if extra not in ("dev", "bench"):
            assert extra in EXTRA_OF.values(), f"[{extra}] is named by no error of asrkit/extras.py"


def test_dev_holds_every_extra_so_make_test_installs_everything(setup_args):
    extras = setup_args["extras_require"]
    dev = set(extras["dev"])
    for extra, reqs in extras.items():
        if extra != "bench":  # the peer decoders pin numpy<2: a venv of their own (tools/install/setup_bench_env.sh)
            assert set(reqs) <= dev, extra
    assert TEST_ONLY <= names(dev)


def test_every_asrkit_module_imports_without_the_optional_packages():
    """What a core install has: no module imports an optional package when it is imported, only where it is used."""
    hidden = sorted(set(EXTRA_OF) | TEST_ONLY)
    code = ("import importlib, pkgutil, sys\n"
            f"for name in {hidden!r}: sys.modules[name] = None\n"
            "import asrkit\n"
            "mods = [m.name for m in pkgutil.walk_packages(asrkit.__path__, 'asrkit.')]\n"
            "mods.remove('asrkit.__main__')  # importing it runs the CLI\n"
            "for m in mods: importlib.import_module(m)\n"
            "print(len(mods))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) > 50
