"""Experiment-directory files: atomic checkpoint writes and loading.

Layout of ``exp/DIR``::

    config.yaml       resolved ExperimentConfig (tokenizer/cmvn paths relative to DIR)
    tokenizer.json    the tokenizer
    cmvn.json         global CMVN stats (optional)
    epoch{N}.pt       training checkpoints (model, optimizer, scheduler, counters)
    model.pt          weights used for decoding (last epoch, or an average)
    train.log, tensorboard/
"""
from __future__ import annotations

import os
from typing import Any, Dict

import torch

FORMAT_VERSION = 1
MODEL_FILE = "model.pt"


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temporary file in the same directory, fsync, then rename: a kill never leaves a torn file."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_model_weights(model: torch.nn.Module, path: str | os.PathLike, **meta: Any) -> None:
    save_atomic({"format_version": FORMAT_VERSION, "model": model.state_dict(), **meta}, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Dict[str, Any]:
    path = os.fspath(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot load checkpoint: {exc}") from exc
    version = ckpt.get("format_version") if isinstance(ckpt, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format version {version!r}, this asrkit reads {FORMAT_VERSION}")
    return ckpt
