"""Per-utterance cepstral mean normalisation: subtract the utterance's mean feature vector, whole or running.

A fixed linear filter on the signal (a microphone, a room, a synthesizer's spectral tilt) and a gain are a
constant offset per log-mel bin, so subtracting the utterance's mean over its valid frames removes them:
the features of ``g * h(x)`` equal those of ``x`` for a gain ``g`` (and, up to frame-edge effects, a short
filter ``h``).

Two forms, chosen by ``frontend.utterance_cmn`` (:func:`build_utterance_cmn`):

* ``true`` -- :class:`UtteranceCMN`: the mean over the whole utterance, applied *before* global CMVN
  (:mod:`asrkit.audio.cmvn`), whose stats are then computed on the normalised features (``asrkit
  compute-cmvn`` reads the same ``frontend`` section). It needs the utterance's future, so it cannot stream.
* ``causal`` -- :class:`CausalCMN`: frame ``t`` minus the running mean of frames ``0..t``, started from a
  prior: ``y_t = x_t - (sum_{s<=t} x_s) / (utterance_cmn_prior_frames + t + 1)``. It is applied *after*
  global CMVN, where the training corpus's mean is 0, so the prior is that 0 with the weight of
  ``utterance_cmn_prior_frames`` frames: in the extractor's units, a running mean that starts at the global
  CMVN mean and moves to the utterance's own as frames come (with weight 0 the first frame is exactly 0).
  The CMVN stats are those of the extractor's features (as with ``false``). Training and decoding apply the
  same formula, frame by frame from the utterance's first frame, so a model trained with it streams exactly
  (:meth:`CausalCMN.step`, used by :class:`asrkit.audio.feature_stream.FeatureStream`). The sums are kept in
  float64: the running mean of an hour of frames stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from asrkit.config import FrontendConfig

__all__ = ["UtteranceCMN", "CausalCMN", "RunningMean", "build_utterance_cmn"]


class UtteranceCMN(nn.Module):
    """``feats - mean over the utterance's valid frames``; padding frames stay exactly 0. No parameters."""

    def forward(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """feats (B, F, D), feat_lens (B,) -> mean-normalised feats (B, F, D), feat_lens."""
        valid = (torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]).unsqueeze(-1)
        counts = feat_lens.clamp(min=1).to(feats.dtype)[:, None, None]  # an empty row stays 0, not NaN
        mean = feats.masked_fill(~valid, 0.0).sum(dim=1, keepdim=True) / counts  # (B, 1, D)
        return (feats - mean).masked_fill(~valid, 0.0), feat_lens


@dataclass(frozen=True)
class RunningMean:
    """One stream's :class:`CausalCMN` state: the float64 sum (D,) of its frames so far and their number."""

    total: Tensor
    frames: int


class CausalCMN(nn.Module):
    """``x_t - (sum_{s<=t} x_s) / (prior_frames + t + 1)`` per utterance (see the module docstring); padding
    frames stay exactly 0. No parameters."""

    def __init__(self, prior_frames: float) -> None:
        super().__init__()
        self.prior_frames = float(prior_frames)

    def forward(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """feats (B, F, D), feat_lens (B,) -> normalised feats (B, F, D), feat_lens."""
        valid = (torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]).unsqueeze(-1)
        out = self._normalise(feats, torch.cumsum(feats.double(), dim=1), 0)
        return out.masked_fill(~valid, 0.0), feat_lens

    def initial_state(self, dim: int, device: Optional[torch.device] = None) -> RunningMean:
        """The state at an utterance's first frame (nothing seen yet: the mean is the prior's)."""
        return RunningMean(torch.zeros(dim, dtype=torch.float64, device=device), 0)

    def step(self, feats: Tensor, state: RunningMean) -> Tuple[Tensor, RunningMean]:
        """The next frames (t, D) of one utterance -> their normalised values (t, D) and the new state; steps over
        the frames in any pieces equal :meth:`forward` on the whole utterance."""
        sums = state.total + torch.cumsum(feats.double(), dim=0)  # (t, D)
        out = self._normalise(feats[None], sums[None], state.frames)[0]
        total = sums[-1] if feats.size(0) else state.total
        return out, RunningMean(total, state.frames + feats.size(0))

    def _normalise(self, feats: Tensor, sums: Tensor, first: int) -> Tensor:
        """feats (B, F, D) whose running sums (float64) are ``sums``, frame 0 being the utterance's ``first``."""
        counts = torch.arange(first + 1, first + feats.size(1) + 1, device=feats.device, dtype=torch.float64)
        mean = sums / (counts + self.prior_frames)[None, :, None]  # (B, F, D)
        return (feats.double() - mean).to(feats.dtype)


def build_utterance_cmn(cfg: FrontendConfig) -> Optional[nn.Module]:
    """``frontend.utterance_cmn``'s module: None (false), :class:`UtteranceCMN` (true) or :class:`CausalCMN`
    (causal, with ``utterance_cmn_prior_frames``)."""
    if cfg.utterance_cmn == "causal":
        return CausalCMN(cfg.utterance_cmn_prior_frames)
    return UtteranceCMN() if cfg.utterance_cmn else None
