"""An exported model from a stranger runs no code: a ``.onnx`` must be ONNX, and TorchScript (whose loading runs code
stored in the file) loads only with the explicit opt-in ``trust_torchscript`` / ``--trust-torchscript``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest
import soundfile as sf
import torch

import asrkit
from asrkit.cli import main
from asrkit.pipeline.export import (FORMAT_NAME, FORMAT_VERSION, TS_EXTRA_FILE, ExportError, _tokenizer_json,
                                    load_exported)
from asrkit.text.tokenizer import CharTokenizer

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # torch 2.14 deprecates TorchScript


class _WritesAFile(torch.nn.Module):
    """A TorchScript module whose loading creates ``target``: ``__setstate__`` runs in torch.jit.load, and
    ``torch.from_file(shared=True)`` creates the file it maps (its result is used, so the op is not optimised away)."""

    def __init__(self, target: str):
        super().__init__()
        self.target = target

    def forward(self, wav: torch.Tensor, wav_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return wav, wav_lens

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:
        return self.target, self.training

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:
        self.target = state[0]
        self.training = bool(torch.from_file(self.target, True, 8, dtype=torch.uint8).numel() == 8) and state[1]


def _stranger(tmp_path: Path, name: str) -> Tuple[Path, Path]:
    """A crafted TorchScript archive with valid asrkit export metadata (so the loader's checks pass), and the file
    its code writes when loaded."""
    marker = tmp_path / f"written_by_{name}"
    tokenizer = CharTokenizer.train(["AB"])
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "sample_rate": 16000, "frame_shift": 0.04,
            "vocab_size": tokenizer.vocab_size, "tokenizer": _tokenizer_json(tokenizer), "min_samples": 400,
            "max_samples": None}
    path = tmp_path / name
    torch.jit.script(_WritesAFile(str(marker))).save(str(path), _extra_files={TS_EXTRA_FILE: json.dumps(meta)})
    assert path.read_bytes()[:2] == b"PK" and not marker.exists()
    return path, marker


def test_the_crafted_archive_does_run_code_when_trusted(tmp_path):
    """The threat is real: loading this archive writes a file (so 'nothing written' below means something)."""
    path, marker = _stranger(tmp_path, "mine.ts")
    load_exported(path, trust_torchscript=True)
    assert marker.exists()


def test_torchscript_named_onnx_is_refused_and_runs_nothing(tmp_path, capsys):
    path, marker = _stranger(tmp_path, "stranger.onnx")
    audio = tmp_path / "a.wav"
    sf.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    assert main(["transcribe", "--model", str(path), "--no-progress", str(audio)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"asrkit transcribe: {path}: named .onnx but not an ONNX file (a zip archive, as TorchScript "
                   f"files are): refused unread"]
    for trust in (False, True):  # a .onnx is ONNX or nothing, whatever the caller trusts
        with pytest.raises(ExportError, match=r"stranger.onnx: named .onnx but not an ONNX file"):
            asrkit.load_model(path, trust_torchscript=trust)
    assert main(["transcribe", "--model", str(path), "--trust-torchscript", "--no-progress", str(audio)]) != 0
    assert "named .onnx but not an ONNX file" in capsys.readouterr().err
    # asrkit decode takes experiment dirs only: an exported file is refused before it is opened
    with pytest.raises(SystemExit):
        main(["decode", "--model", str(path), "--data", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "no such directory" in capsys.readouterr().err
    assert not marker.exists()


def test_torchscript_loads_only_with_the_opt_in(tmp_path, capsys):
    path, marker = _stranger(tmp_path, "stranger.ts")
    audio = tmp_path / "a.wav"
    sf.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    assert main(["transcribe", "--model", str(path), "--no-progress", str(audio)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"asrkit transcribe: {path}: a TorchScript file, and loading one runs code stored in it: load "
                   f"it only from an author you trust, with --trust-torchscript (Python: trust_torchscript=True), "
                   f"or use an ONNX export"]
    with pytest.raises(ExportError, match=r"stranger.ts: a TorchScript file, and loading one runs code"):
        asrkit.load_model(path)
    with pytest.raises(ExportError, match=r"stranger.ts: a TorchScript file, and loading one runs code"):
        load_exported(path)
    assert not marker.exists()
    help_text = " ".join(_transcribe_help().split())
    assert "--trust-torchscript" in help_text and "runs code stored in it" in help_text


def _transcribe_help() -> str:
    from asrkit.cli.transcribe import build_parser

    return build_parser().format_help()
