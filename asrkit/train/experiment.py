"""Setting up an experiment dir: copied inputs, resolved config, the resume-or-refuse decision, logging.

``asrkit train`` into a directory that already holds checkpoints of the same experiment resumes
from the latest one; a directory holding a *different* experiment (another config, tokenizer or
CMVN) is refused rather than overwritten, unless ``overwrite`` is asked for, which deletes its
checkpoints, weights, step log and tensorboard events first. Only the keys in :data:`RESUMABLE`
may change between a run and its continuation (e.g. more epochs).
"""
from __future__ import annotations

import filecmp
import glob
import logging
import os
import shutil
import sys
from dataclasses import replace
from typing import Any, Callable, List, Optional, Tuple

from asrkit.config import ConfigError, ExperimentConfig, flatten_dict, load_config, save_config, to_dict
from asrkit.checkpoint import INDEX_FILE, MODEL_FILE, CheckpointIndex

# Settings that do not change what is being trained, so a resumed run may use other values.
RESUMABLE = frozenset({"train.epochs", "train.log_interval", "train.save_every_steps", "train.keep_best",
                       "train.max_nonfinite_steps", "train.plot_attention", "data.num_workers"})
RESUME_MODES = ("auto", "require", "overwrite")
STEP_LOG = "steps.tsv"


class ExperimentError(ValueError):
    """The experiment dir cannot be used as asked; the message says why and what to do."""


def config_differences(old: ExperimentConfig, new: ExperimentConfig) -> List[str]:
    """``key: old -> new`` for every setting that differs, except the :data:`RESUMABLE` ones."""
    a, b = flatten_dict(to_dict(old)), flatten_dict(to_dict(new))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in RESUMABLE and a.get(k) != b.get(k)]


def _state_files(exp_dir: str) -> List[str]:
    names = [INDEX_FILE, MODEL_FILE]
    found = [n for n in names if os.path.exists(os.path.join(exp_dir, n))]
    for pattern in ("epoch*.pt", "step*.pt"):
        found += sorted(os.path.basename(p) for p in glob.glob(os.path.join(exp_dir, pattern)))
    return found


def _differs(src: Optional[str], dst: str) -> bool:
    if src is None or not os.path.isfile(dst):
        return src is not None or os.path.isfile(dst)
    return not filecmp.cmp(src, dst, shallow=False)


def _wipe(exp_dir: str) -> None:
    for name in _state_files(exp_dir) + [STEP_LOG]:
        path = os.path.join(exp_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    for sub in ("tensorboard", "attention"):
        shutil.rmtree(os.path.join(exp_dir, sub), ignore_errors=True)


def prepare_experiment(cfg: Any, exp_dir: str, tokenizer_path: Optional[str] = None,
                       cmvn_path: Optional[str] = None, resume: str = "auto", write: bool = True,
                       load: Callable[[str], Any] = load_config) -> Tuple[Any, bool]:
    """Check ``exp_dir`` against ``cfg``, copy the tokenizer and CMVN stats into it and write the resolved
    ``config.yaml`` (paths relative to ``exp_dir``, so the directory can be moved).

    ``cfg``: an ExperimentConfig, or any config with a ``tokenizer`` section (an LM's, read back with
    ``load``; without a ``cmvn`` key no stats are copied). ``resume``: ``auto`` (continue if there are
    checkpoints), ``require`` (error if there are none) or ``overwrite`` (delete the old experiment's files
    first). ``write=False`` only checks (ranks > 0).
    Returns the resolved config and whether training resumes from a checkpoint.
    """
    if resume not in RESUME_MODES:
        raise ValueError(f"resume must be one of {', '.join(RESUME_MODES)}, got {resume!r}")
    tok_src = tokenizer_path or cfg.tokenizer.path
    if not os.path.isfile(tok_src):
        raise FileNotFoundError(
            f"tokenizer '{tok_src}' not found: create one with 'asrkit train-tokenizer --text DATA/text OUT.json'")
    has_cmvn = isinstance(cfg, ExperimentConfig)  # an LM config has no CMVN
    cmvn_src = (cmvn_path or cfg.cmvn) if has_cmvn else None
    if cmvn_src and not os.path.isfile(cmvn_src):
        raise FileNotFoundError(f"CMVN stats '{cmvn_src}' not found: create them with 'asrkit compute-cmvn'")
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, path="tokenizer.json"))
    if has_cmvn:
        cfg = replace(cfg, cmvn="cmvn.json" if cmvn_src else None)
    tok_dst, cmvn_dst = os.path.join(exp_dir, "tokenizer.json"), os.path.join(exp_dir, "cmvn.json")

    existing = _state_files(exp_dir) if os.path.isdir(exp_dir) else []
    if existing and resume == "overwrite":
        if write:
            _wipe(exp_dir)
        existing = []
    if existing:
        cfg_path = os.path.join(exp_dir, "config.yaml")
        try:
            old = load(cfg_path)
        except ConfigError as exc:
            raise ExperimentError(f"{exp_dir} holds {', '.join(existing[:3])} but its config cannot be read "
                                  f"({exc}); use another --out, or --overwrite to start again") from None
        diffs = config_differences(old, cfg)
        if _differs(tok_src, tok_dst):
            diffs.append(f"tokenizer: {tok_src} differs from {tok_dst}")
        if has_cmvn and _differs(cmvn_src, cmvn_dst) and (cmvn_src or old.cmvn):
            diffs.append(f"cmvn: {cmvn_src or 'none'} differs from {cmvn_dst if old.cmvn else 'none'}")
        if diffs:
            raise ExperimentError(
                f"{exp_dir} already holds a different experiment ({', '.join(existing[:3])}); it differs in: "
                f"{'; '.join(diffs[:8])}{' ...' if len(diffs) > 8 else ''}. Use another --out, or --overwrite to "
                f"delete its checkpoints and start again")
    resuming = bool(existing) and CheckpointIndex(exp_dir).latest is not None
    if resume == "require" and not resuming:
        raise ExperimentError(f"--resume: {exp_dir} has no checkpoint to resume from ({INDEX_FILE} names none)")
    if write:
        os.makedirs(exp_dir, exist_ok=True)
        if os.path.abspath(tok_src) != os.path.abspath(tok_dst):
            shutil.copyfile(tok_src, tok_dst)
        if cmvn_src and os.path.abspath(cmvn_src) != os.path.abspath(cmvn_dst):
            shutil.copyfile(cmvn_src, cmvn_dst)
        save_config(cfg, os.path.join(exp_dir, "config.yaml"))
    return cfg, resuming


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is logged, not the stream current at creation:
    a handler made inside one pytest capture (or tqdm redirect) must not write to a closed stream later."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property ignores that
        pass


def setup_logging(exp_dir: str, is_main: bool = True) -> None:
    """Rank 0 logs to ``exp_dir/train.log`` and the console; other ranks print warnings only."""
    root = logging.getLogger("asrkit")
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler):
            root.removeHandler(h)
            h.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if is_main:
        fh = logging.FileHandler(os.path.abspath(os.path.join(exp_dir, "train.log")))
        fh.setFormatter(fmt)
        root.addHandler(fh)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        sh = _StderrHandler()
        sh.setFormatter(fmt)
        root.addHandler(sh)
