"""Helpers for the trainer tests: tone-and-noise audio in Kaldi dirs and tiny-model overrides of
conf/tiny_ctc.yaml (a uniquely named module, imported from this directory)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import soundfile as sf

from asrkit.config import load_config
from asrkit.data.table import write_table
from asrkit.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "conf" / "tiny_ctc.yaml")
SR = 16000
WORDS = ["AB", "BAD", "CAB", "DAD", "ACE", "BED", "FED", "DEAF"]
# Deterministic model (no dropout or SpecAugment) for comparing gradients across batchings.
EXACT = ["model.encoder.dropout=0.0", "specaug.enabled=false", "train.grad_clip=0", "train.epochs=1"]
TINY = ["model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
        "model.encoder.num_layers=1", "train.warmup_steps=2", "train.log_interval=1", "data.num_workers=0",
        "data.max_batch_size=2", "train.epochs=2"]


def make_data_dir(root: Path, n: int, seed: int, durations: Optional[Sequence[float]] = None,
                  texts: Optional[Sequence[str]] = None, utt2dur: bool = True) -> Path:
    """``n`` utterances of a text-dependent tone plus noise (so there is something to learn)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    wav_scp: Dict[str, str] = {}
    text: Dict[str, str] = {}
    durs: Dict[str, str] = {}
    for i in range(n):
        utt = f"{root.name}_{i:03d}"
        words = texts[i] if texts is not None else " ".join(rng.choice(WORDS, size=2))
        dur = durations[i] if durations is not None else float(rng.uniform(0.6, 1.0))
        t = np.arange(int(dur * SR)) / SR
        freq = 200.0 + 40.0 * (sum(map(ord, words)) % 20)
        x = 0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)
        path = root / f"{utt}.wav"
        sf.write(path, x.astype(np.float32), SR, subtype="PCM_16")
        wav_scp[utt], text[utt], durs[utt] = str(path), words, f"{t.size / SR:.6f}"
    write_table(root / "wav.scp", wav_scp)
    write_table(root / "text", text)
    if utt2dur:
        write_table(root / "utt2dur", durs)
    return root


def tiny_config(extra: Sequence[str] = ()):
    return load_config(CONFIG, list(TINY) + list(extra))


def cli_args(corpus: Dict[str, Path], out: Path, extra: Sequence[str] = (), valid: bool = True) -> List[str]:
    args = ["--config", CONFIG, "--train-data", str(corpus["train"]), "--out", str(out),
            "--tokenizer", str(corpus["tokenizer"]), "--device", "cpu"]
    if valid:
        args += ["--valid-data", str(corpus["dev"])]
    for o in list(TINY) + list(extra):
        args += ["--set", o]
    return args


def first_moment(exp) -> dict:
    """Adam's first moment after one update: 0.1 * the (unclipped) gradient of every parameter."""
    ckpt = load_checkpoint(exp / "epoch0.pt")
    assert ckpt["step"] == 1
    return {k: v["exp_avg"] for k, v in ckpt["optimizer"]["state"].items()}
