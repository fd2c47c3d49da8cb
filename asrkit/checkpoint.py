"""The on-disk format of experiment dirs (ASR models and LMs alike): atomic checkpoint writes, a format
version, safe loading, the checkpoint index, RNG state, averaging.

Layout of ``exp/DIR``::

    config.yaml        resolved ExperimentConfig (tokenizer/cmvn paths relative to DIR)
    tokenizer.json     the tokenizer
    cmvn.json          global CMVN stats (optional)
    epoch{E}.pt        checkpoint at the end of epoch E (0-based), with its validation metrics
    step{S}.pt         checkpoint after optimizer step S (train.save_every_steps), mid-epoch
    checkpoints.json   index: every kept checkpoint with epoch, step, metrics; which one is the latest
    model.pt           weights used for decoding (last epoch, or an average: asrkit average)
    steps.tsv          per-step training loss, learning rate and gradient norm (rank 0)
    train.log, tensorboard/, attention/

A checkpoint holds everything needed to continue as if never stopped: model, optimizer, scheduler,
AMP scaler, sampler position and the RNG states of every rank. Files are written to a temporary
name and renamed, and the index is rewritten (atomically) only after the checkpoint it names
exists, so a kill at any moment leaves a loadable latest checkpoint. Old files are deleted only
after the index stops naming them: the best ``train.keep_best`` epoch checkpoints by
``train.best_metric`` and the latest one (for resuming) are kept.

Checkpoints hold tensors and plain containers only and are read with ``torch.load(weights_only=True)``:
loading a model dir from a stranger never runs code. Format 2 is the composed AsrModel (parts named
``encoder``, ``ctc``, ``decoder``); format 1 dirs (the four model classes before it) are refused by name.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from asrkit.atomic import atomic_write

FORMAT_VERSION = 2
MODEL_FILE = "model.pt"
INDEX_FILE = "checkpoints.json"
METRICS = {"valid_loss": "min", "valid_acc": "max"}  # best_metric -> which end is better
# The only names the trainer gives checkpoints: an index naming anything else (``../x``, an absolute path) is
# refused, since pruning deletes the files an index names.
CHECKPOINT_NAME = re.compile(r"(epoch|step)[0-9]+\.pt")

log = logging.getLogger("asrkit.train")


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temporary file in the same directory, fsync, then rename: a kill never leaves a torn file."""
    with atomic_write(path, "wb", fsync=True) as fh:
        torch.save(obj, fh)


def save_model_weights(model: torch.nn.Module, path: str | os.PathLike, **meta: Any) -> None:
    save_atomic({"format_version": FORMAT_VERSION, "model": model.state_dict(), **meta}, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Dict[str, Any]:
    """A checkpoint's dict, loaded without running any code (``weights_only``), of this format version."""
    path = os.fspath(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused: the file holds more than tensors and plain containers, and loading "
                         f"it could run code ({str(exc).splitlines()[0]})") from exc
    except (OSError, RuntimeError, EOFError) as exc:
        raise ValueError(f"{path}: cannot load checkpoint: {exc}") from exc
    version = ckpt.get("format_version") if isinstance(ckpt, dict) else None
    if version != FORMAT_VERSION:
        hint = (" (written by asrkit before models were composed of parts; retrain it with the current "
                "configs)" if version == 1 else "")
        raise ValueError(f"{path}: checkpoint format version {version!r}, this asrkit reads {FORMAT_VERSION}{hint}")
    return ckpt


def load_weights(module: torch.nn.Module, ckpt: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Load a checkpoint's ``model`` weights into ``module``. Weights of another structure or shapes (a checkpoint
    of another config) are one ValueError line naming ``path`` and what does not fit, never torch's list."""
    state = ckpt.get("model")
    if not (isinstance(state, Mapping) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items())):
        raise ValueError(f"{os.fspath(path)}: no model weights in it (expected 'model': names to tensors)")
    own = module.state_dict()
    shapes = [f"{k}: {tuple(state[k].shape)} in the file, {tuple(v.shape)} in the model" for k, v in own.items()
              if k in state and state[k].shape != v.shape]
    wrong = [_listed("missing", [k for k in own if k not in state]),
             _listed("unexpected", [k for k in state if k not in own]), _listed("other shapes", shapes)]
    if any(wrong):
        raise ValueError(f"{os.fspath(path)}: the weights do not fit the model its config builds "
                         f"({'; '.join(w for w in wrong if w)})")
    module.load_state_dict(state)


def _listed(what: str, items: Sequence[str], limit: int = 3) -> str:
    """``missing 5 (a, b, c, ...)``; empty for no items."""
    if not items:
        return ""
    return f"{what} {len(items)} ({', '.join(items[:limit])}{', ...' if len(items) > limit else ''})"


def rng_state() -> Dict[str, Any]:
    """This process's random generators (python, numpy, torch CPU and CUDA), as tensors and plain containers."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    py = state["python"]  # a checkpoint's lists come back as lists: random.setstate wants tuples
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _excerpt(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error quotes a value from a file, never a flood of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_json_atomic(path: str, obj: Any) -> None:
    with atomic_write(path, fsync=True) as fh:
        json.dump(obj, fh, indent=1)


class CheckpointIndex:
    """``checkpoints.json``: the kept checkpoints (``file``, ``epoch``, ``step``, ``end_of_epoch`` and the
    validation metrics of epoch checkpoints) and ``latest``, the file to resume from."""

    def __init__(self, exp_dir: str):
        self.exp_dir = exp_dir
        self.path = os.path.join(exp_dir, INDEX_FILE)
        self.entries: List[Dict[str, Any]] = []
        self.latest: Optional[str] = None
        if os.path.isfile(self.path):
            try:
                with open(self.path, encoding="utf-8") as fh:
                    data = json.load(fh)
                self.entries, self.latest = list(data["checkpoints"]), data.get("latest")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}: unreadable checkpoint index ({exc}); delete it and the *.pt "
                                 f"files to start again") from exc
            for i, entry in enumerate(self.entries):
                self._check_entry(entry, f"entry {i}")
            if self.latest is not None:
                self._check_name(self.latest, "latest")

    def _check_name(self, name: Any, where: str) -> None:
        if not (isinstance(name, str) and CHECKPOINT_NAME.fullmatch(name)):
            raise ValueError(f"{self.path}: {where}: {_excerpt(name)} is not a checkpoint name the trainer writes "
                             f"(epochN.pt or stepN.pt in the experiment dir); delete the index and the *.pt "
                             f"files to start again")

    def _check_entry(self, entry: Any, where: str) -> None:
        """An entry as the trainer writes it: a mapping with a checkpoint ``file`` name and integer ``epoch``
        and ``step`` (they order the entries)."""
        if not isinstance(entry, dict):
            raise ValueError(f"{self.path}: {where}: expected a mapping with file, epoch and step, got "
                             f"{_excerpt(entry)}")
        self._check_name(entry.get("file"), f"{where}: file")
        for key in ("epoch", "step"):
            if type(entry.get(key)) is not int:  # bool is an int subclass, and no count
                raise ValueError(f"{self.path}: {where}: {key} must be an integer, got {_excerpt(entry.get(key))}")

    def latest_entry(self) -> Optional[Dict[str, Any]]:
        return next((e for e in self.entries if e["file"] == self.latest), None)

    def add(self, entry: Dict[str, Any], keep_best: int, best_metric: str) -> List[str]:
        """Record ``entry`` (its file already written) as the latest, save the index, and return the
        files no longer needed (not among the best ``keep_best`` epoch checkpoints, not the latest)."""
        self._check_entry(entry, "new entry")
        self.entries = [e for e in self.entries if e["file"] != entry["file"]] + [entry]
        self.latest = entry["file"]
        keep = {self.latest} | {e["file"] for e in self.best(keep_best, best_metric)}
        drop = [e["file"] for e in self.entries if e["file"] not in keep]
        self.entries = [e for e in self.entries if e["file"] in keep]
        _write_json_atomic(self.path, {"format_version": FORMAT_VERSION, "latest": self.latest,
                                       "checkpoints": self.entries})
        return drop

    def best(self, k: int, metric: str) -> List[Dict[str, Any]]:
        """The ``k`` best epoch checkpoints by ``metric``; without that metric, the ``k`` most recent."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric '{metric}' (choose from: {', '.join(METRICS)})")
        epochs = [e for e in self.entries if e.get("end_of_epoch")]
        scored = [e for e in epochs if isinstance(e.get(metric), (int, float)) and np.isfinite(e[metric])]
        if not scored:
            return sorted(epochs, key=lambda e: -e["step"])[: max(k, 0)]
        sign = 1.0 if METRICS[metric] == "min" else -1.0
        return sorted(scored, key=lambda e: (sign * e[metric], -e["step"]))[: max(k, 0)]

    def remove_files(self, files: Sequence[str]) -> None:
        for name in files:
            try:
                os.remove(os.path.join(self.exp_dir, name))
            except FileNotFoundError:
                pass


def average_state_dicts(states: Sequence[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Element-wise mean of floating-point tensors (accumulated in float64); other tensors (counters)
    are taken from the first state dict."""
    if not states:
        raise ValueError("no state dicts to average")
    keys = list(states[0])
    for i, s in enumerate(states[1:], 1):
        if list(s) != keys:
            raise ValueError(f"state dict {i} has different keys from state dict 0: cannot average")
    out = {}
    for k in keys:
        t = states[0][k]
        if torch.is_floating_point(t):
            acc = torch.zeros_like(t, dtype=torch.float64)
            for s in states:
                acc += s[k].to(torch.float64)
            out[k] = (acc / len(states)).to(t.dtype)
        else:
            out[k] = t.clone()
    return out


def average_best(exp_dir: str, k: int, metric: str, out: Optional[str] = None) -> Tuple[str, List[str]]:
    """Average the model weights of the ``k`` best epoch checkpoints of ``exp_dir`` by ``metric`` into
    ``out`` (default ``exp_dir/model.pt``). Returns the output path and the averaged files."""
    if k < 1:
        raise ValueError(f"--best must be at least 1, got {k}")
    index = CheckpointIndex(exp_dir)
    if not any(e.get("end_of_epoch") for e in index.entries):
        raise ValueError(f"{exp_dir}: no epoch checkpoint recorded in {INDEX_FILE} (is it a trained experiment?)")
    chosen = index.best(k, metric)
    if not any(metric in e for e in chosen):
        log.warning("%s: no %s recorded (trained without --valid-data?): averaging the %d most recent epochs",
                    exp_dir, metric, len(chosen))
    if len(chosen) < k:
        log.warning("%s: only %d epoch checkpoints are kept (train.keep_best); averaging those", exp_dir, len(chosen))
    files = [e["file"] for e in chosen]
    states = [load_checkpoint(os.path.join(exp_dir, f))["model"] for f in files]
    out = out or os.path.join(exp_dir, MODEL_FILE)
    save_atomic({"format_version": FORMAT_VERSION, "model": average_state_dicts(states), "averaged": files,
                 "metric": metric, "epochs": [e["epoch"] for e in chosen]}, out)
    return out, files
