"""Tiny streaming-capable experiment dirs (random weights, dynamic chunk training config) and a 'tone detector'
model whose CTC head emits blanks on silence and one token on a tone, for endpointing tests."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple

import numpy as np
import torch

from asrkit.config import load_config
from tests.pipeline.tiny_exp import tone, write_exp

REPO = Path(__file__).resolve().parents[2]
SR = 16000


def make_streaming_exp(exp: Path, kind: str = "transformer", decoder: bool = False, seed: int = 0,
                       extra: Sequence[str] = ()) -> Path:
    """``exp`` with a 2-layer Transformer or Conformer (causal convolution) trained-for-streaming config
    (dynamic chunks), random weights (seeded), and a CTC head (+ a 1-layer attention decoder)."""
    torch.manual_seed(seed)
    base = "tiny_transformer.yaml" if decoder else "tiny_ctc.yaml"
    overrides = ["model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
                 "model.encoder.num_layers=2", "model.encoder.dropout=0.0", "frontend.n_mels=20",
                 "tokenizer.path=tokenizer.json", "cmvn=null", "specaug.enabled=false",
                 f"model.encoder.kind={kind}", "model.encoder.streaming.dynamic_chunk=true"]
    if kind == "conformer":
        overrides += ["model.encoder.conv_kernel=5", "model.encoder.streaming.causal_conv=true"]
    if decoder:
        overrides += ["model.decoder.num_layers=1", "model.decoder.ffn_dim=64", "model.decoder.dropout=0.0"]
    cfg = load_config(REPO / "conf" / base, overrides + list(extra))
    return write_exp(exp, cfg)


def quiet(seconds: float, seed: int = 0) -> np.ndarray:
    """Low noise (the 'silence')."""
    return (0.003 * np.random.default_rng(seed).standard_normal(int(SR * seconds))).astype(np.float32)


def make_tone_detector(model: torch.nn.Module, token: int) -> None:
    """Set ``model.ctc``'s projection so that frames like a tone emit ``token`` and frames like quiet emit blank:
    the encoder's mean outputs on each (full context) span a direction; a frame's side of the midpoint picks."""
    with torch.no_grad():
        feats = [model.encode(torch.from_numpy(x)[None], torch.tensor([len(x)]))[0][0]
                 for x in (quiet(2.0, 9), tone(2.0, 440, 9))]
        v_quiet, v_tone = (f[2:-2].mean(0) for f in feats)
        direction = v_tone - v_quiet
        direction = direction / direction.norm()
        mid = (v_tone + v_quiet) / 2
        proj = model.ctc.proj
        proj.weight.zero_()
        proj.bias.fill_(-50.0)
        gain = 40.0 / float((v_tone - v_quiet) @ direction)
        proj.weight[token] = gain * direction
        proj.bias[token] = -gain * float(mid @ direction)
        proj.weight[0] = -gain * direction
        proj.bias[0] = gain * float(mid @ direction)


def tone_stream(parts: Sequence[Tuple[str, float]]) -> Tuple[np.ndarray, list]:
    """Concatenated ('tone' | 'quiet', seconds) parts; returns the audio and the (start, end) of each tone."""
    audio, spans, t = [], [], 0.0
    for k, (what, seconds) in enumerate(parts):
        x = tone(seconds, 440, k) if what == "tone" else quiet(seconds, k)
        if what == "tone":
            spans.append((t, t + len(x) / SR))
        audio.append(x)
        t += len(x) / SR
    return np.concatenate(audio), spans
