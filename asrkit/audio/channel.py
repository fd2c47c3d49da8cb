"""The recording channel: a telephone band (resampled down and back up, high-passed) and a gain with clipping."""
from __future__ import annotations

import torchaudio.functional as AF
from torch import Tensor

from asrkit.audio.io import resample

__all__ = ["band_limit", "apply_gain"]


def band_limit(wav: Tensor, sample_rate: int, rate: int, low_hz: float) -> Tensor:
    """``wav`` (T,) at ``sample_rate`` through a band of ``[low_hz, rate / 2]``: resampled to ``rate`` and back
    (torchaudio's windowed-sinc filter removes what lies above ``rate / 2``; a ``rate`` at or above
    ``sample_rate`` keeps the top), then a biquad high-pass at ``low_hz`` (0: none). The length is kept."""
    out = wav
    if rate < sample_rate:
        # ceil(ceil(T * rate / sr) * sr / rate) >= T samples come back: cut to T
        out = resample(resample(wav, sample_rate, rate), rate, sample_rate)[: wav.numel()]
    if low_hz:  # the config refuses a negative one
        out = AF.highpass_biquad(out, sample_rate, low_hz)
    return out.contiguous()


def apply_gain(wav: Tensor, db: float) -> Tensor:
    """``wav`` scaled by ``db`` decibels and clipped to [-1, 1], as a recording at that level would be."""
    return (wav * 10.0 ** (db / 20.0)).clamp(-1.0, 1.0)
