"""A tiny untrained CTC experiment dir and tone audio, for decoding tests (the untrained model's greedy output
is deterministic and not empty on tones, so comparisons between two ways of decoding can fail)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from asrkit.checkpoint import save_model_weights
from asrkit.config import ExperimentConfig, load_config, save_config
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import CharTokenizer

REPO = Path(__file__).resolve().parents[2]


def make_tiny_exp(exp: Path) -> Path:
    """``exp`` with config.yaml, tokenizer.json and model.pt of a 1-layer Transformer CTC model (seeded)."""
    torch.manual_seed(0)
    cfg = load_config(REPO / "conf" / "tiny_ctc.yaml", [
        "model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
        "model.encoder.num_layers=1", "model.encoder.dropout=0.0", "frontend.n_mels=20",
        "tokenizer.path=tokenizer.json", "cmvn=null", "specaug.enabled=false"])
    return write_exp(exp, cfg)


def write_exp(exp: Path, cfg: ExperimentConfig) -> Path:
    """``exp`` with ``cfg``, a letters tokenizer and the model's (seeded by the caller) random weights."""
    tok = CharTokenizer.train(["ABCDEFGHIJ KLMNOP"])
    exp.mkdir(parents=True)
    save_config(cfg, exp / "config.yaml")
    tok.save(exp / "tokenizer.json")
    save_model_weights(build_model(cfg, tok.vocab_size), exp / "model.pt")
    return exp


def tone(seconds: float, freq: float, seed: int = 0) -> np.ndarray:
    """A 16 kHz sine with a little noise, float32."""
    t = np.arange(int(16000 * seconds)) / 16000
    noise = 0.05 * np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * freq * t) + noise).astype(np.float32)


def write_data_dir(path: Path, audio: dict) -> Path:
    """A Kaldi data dir at ``path`` (wav.scp, utt2spk) of ``{utt: samples (written as a 16 kHz float wav) or
    bytes (written as they are)}``."""
    path.mkdir(parents=True)
    for utt, x in audio.items():
        if isinstance(x, bytes):
            (path / f"{utt}.wav").write_bytes(x)
        else:
            sf.write(path / f"{utt}.wav", x, 16000, subtype="FLOAT")
    (path / "wav.scp").write_text("".join(f"{u} {path / u}.wav\n" for u in sorted(audio)))
    (path / "utt2spk").write_text("".join(f"{u} {u}\n" for u in sorted(audio)))
    return path
