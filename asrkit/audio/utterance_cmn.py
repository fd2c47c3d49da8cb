"""Per-utterance cepstral mean normalisation: subtract each utterance's mean feature vector.

A fixed linear filter on the signal (a microphone, a room, a synthesizer's spectral tilt) and a gain are a
constant offset per log-mel bin, so subtracting the utterance's mean over its valid frames removes them:
the features of ``g * h(x)`` equal those of ``x`` for a gain ``g`` (and, up to frame-edge effects, a short
filter ``h``). Global CMVN (:mod:`asrkit.audio.cmvn`) is applied after it, with stats computed on the
normalised features (``asrkit compute-cmvn`` reads the same ``frontend`` section). The mean is over the
whole utterance, so this suits utterance-level decoding, not frame-by-frame streaming.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor, nn

__all__ = ["UtteranceCMN"]


class UtteranceCMN(nn.Module):
    """``feats - mean over the utterance's valid frames``; padding frames stay exactly 0. No parameters."""

    def forward(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """feats (B, F, D), feat_lens (B,) -> mean-normalised feats (B, F, D), feat_lens."""
        valid = (torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]).unsqueeze(-1)
        counts = feat_lens.clamp(min=1).to(feats.dtype)[:, None, None]  # an empty row stays 0, not NaN
        mean = feats.masked_fill(~valid, 0.0).sum(dim=1, keepdim=True) / counts  # (B, 1, D)
        return (feats - mean).masked_fill(~valid, 0.0), feat_lens
