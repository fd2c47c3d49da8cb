"""Features of a live audio stream: samples in pieces of any size -> the model's normalised feature frames.

:class:`FeatureStream` wraps a model's :class:`~asrkit.audio.frontend.Frontend` (one stream each). The
extractors frame with Kaldi's snip-edges rule (frame ``i`` covers samples ``[i*hop, i*hop + win)``) and
compute each frame from its own samples only (Kaldi fbank's dither is for training; decoding never dithers),
so the stream computes every frame whose samples have all arrived and keeps the samples after the last
computed frame's hop (fewer than one window plus one hop) for the next call. Global CMVN is per frame; the
streaming per-utterance mean (``frontend.utterance_cmn: causal``) keeps its running sum between calls. The
frames of all calls, concatenated, equal ``frontend.eval()`` on the whole audio (within float rounding: 1e-5).

The whole utterance's mean (``utterance_cmn: true``) needs the future and is refused.
:meth:`FeatureStream.reset_utterance` starts a new utterance at an endpoint: the running mean restarts from
its prior, as every training utterance's did, while the framing goes on over the same audio (no sample is
dropped or read twice). So the features after a reset equal the offline frontend's on the audio from the
first frame after the reset, and a stream's CMN state never holds more than one utterance.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor

from asrkit.audio.frontend import Frontend
from asrkit.audio.utterance_cmn import RunningMean

__all__ = ["FeatureStream"]


class FeatureStream:
    """One audio stream's feature frames, computed as its samples arrive (see the module docstring)."""

    def __init__(self, frontend: Frontend) -> None:
        if frontend.utterance_cmn is not None:
            raise ValueError("frontend.utterance_cmn: true needs the whole utterance (its mean), so it cannot "
                             "stream: train with frontend.utterance_cmn: causal (a running mean) or false")
        self.frontend = frontend
        buffer = next(iter(frontend.buffers()), None)  # the device the frontend's tensors are on
        self.device = buffer.device if buffer is not None else torch.device("cpu")
        extractor = frontend.extractor
        self._win, self._hop = extractor.win_length, extractor.hop_length
        self._pending = torch.zeros(0, device=self.device)  # samples of frames not computed yet
        self._cmn: Optional[RunningMean] = None
        self.reset_utterance()
        self.frames = 0  # frames returned so far (across utterances)

    def reset_utterance(self) -> None:
        """Start a new utterance (at an endpoint): the running mean of causal CMN restarts from its prior."""
        if self.frontend.causal_cmn is not None:
            self._cmn = self.frontend.causal_cmn.initial_state(self.frontend.output_dim, self.device)

    @torch.inference_mode()
    def accept(self, samples: Union[Tensor, np.ndarray]) -> Tensor:
        """The next samples (S,) float in [-1, 1] at the frontend's rate -> the frames now complete (t, F), float32
        on the frontend's device (t may be 0)."""
        if self.frontend.training:
            raise ValueError("FeatureStream needs the frontend in eval mode (call model.eval()): training adds "
                             "random augmentation (dither, SpecAugment, speed perturbation)")
        x = torch.as_tensor(samples)
        if x.dim() != 1:
            raise ValueError(f"FeatureStream: samples must be 1-D (S,), got shape {tuple(x.shape)}")
        buf = torch.cat([self._pending, x.to(self.device, torch.float32)])
        n = max(0, (buf.numel() - self._win) // self._hop + 1)
        if n == 0:
            self._pending = buf
            return torch.zeros(0, self.frontend.output_dim, device=self.device)
        used = (n - 1) * self._hop + self._win
        feats, lens = self.frontend.extractor(buf[None, :used], torch.tensor([used], device=self.device))
        self._pending = buf[n * self._hop:]
        if self.frontend.cmvn is not None:  # Frontend.normalize's order: global CMVN, then causal CMN
            feats, lens = self.frontend.cmvn(feats, lens)
        out = feats[0]
        if self._cmn is not None:
            out, self._cmn = self.frontend.causal_cmn.step(out, self._cmn)
        self.frames += n
        return out
