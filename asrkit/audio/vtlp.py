"""Vocal tract length perturbation (Jaitly & Hinton, 2013): the frequency axis of the filterbank warped by alpha.

The warp is the paper's piecewise-linear map of ``[0, S/2]`` (S/2: the Nyquist frequency) onto itself::

    f' = alpha * f                                                        for f <= F_hi * min(alpha, 1) / alpha
    f' = S/2 - (S/2 - F_hi * min(alpha, 1)) / (S/2 - F_hi * min(alpha, 1) / alpha) * (S/2 - f)   above

(F_hi: ``augment.vtlp.boundary_hz``, 4800 Hz in the paper). The frontend places its mel filters on warped
frequencies (asrkit.audio.frontend): ``logmel`` warps its filters' edges with this map; ``kaldi_fbank`` uses
Kaldi's own VTLN warp through torchaudio (:func:`kaldi_vtln_options`), the same map above Kaldi's low cut-off
(100 Hz * max(1, 1 / alpha)). The warp factor is drawn per utterance or per speaker in the loader (asrkit.audio.waveaug) and reaches
the frontend as the batch's ``vtlp_alpha``; alpha = 1 is the identity.
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor

from asrkit.config import ConfigError

__all__ = ["warp_frequencies", "check_boundary", "kaldi_vtln_options"]

KALDI_VTLN_LOW = 100.0  # Hz: Kaldi's --vtln-low, below which its warp bends to the lowest filter edge


def check_boundary(boundary_hz: float, sample_rate: int) -> None:
    """``boundary_hz`` (positive: the config checks) must lie below the Nyquist frequency, else nothing is left to
    bend back."""
    if boundary_hz >= sample_rate / 2:
        raise ConfigError(f"augment.vtlp.boundary_hz must lie below {sample_rate / 2:g} Hz, the Nyquist frequency of "
                          f"frontend.sample_rate {sample_rate}; got {boundary_hz:g}")


def warp_frequencies(freqs: Tensor, alpha: Tensor, boundary_hz: float, nyquist: float) -> Tensor:
    """``freqs`` (..., N) in Hz, within ``[0, nyquist]``, warped by ``alpha`` (..., 1) (broadcast): see the module
    docstring. Monotonic; 0 and ``nyquist`` are fixed points."""
    low = boundary_hz * torch.clamp(alpha, max=1.0)  # the bend, in output frequency
    knee = low / alpha  # the bend, in input frequency
    upper = nyquist - (nyquist - low) / (nyquist - knee) * (nyquist - freqs)
    return torch.where(freqs <= knee, freqs * alpha, upper)


def kaldi_vtln_options(alpha: float, boundary_hz: float) -> Dict[str, float]:
    """``torchaudio.compliance.kaldi.fbank``'s VTLN arguments for warp factor ``alpha``: Kaldi maps ``f -> f / w`` in
    its middle band, so w = 1 / alpha; its upper cut-off ``vtln_high * min(1, w)`` is then the paper's bend
    ``F_hi * min(alpha, 1) / alpha`` at ``vtln_high = F_hi``, and above it both run straight to the top edge."""
    return {"vtln_warp": 1.0 / alpha, "vtln_low": KALDI_VTLN_LOW, "vtln_high": boundary_hz}
