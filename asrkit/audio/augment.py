"""On-the-fly training augmentation: SpecAugment on features, speed perturbation on waveforms.

Both modules are the identity in eval mode and draw their randomness from
torch's default generators (``torch.rand``/``torch.randint``), so a run is
reproducible under ``torch.manual_seed``. Random parameters are drawn by
small ``sample_*`` functions and applied by deterministic functions, which
tests can check against independent references.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torchaudio.functional as AF
from torch import Tensor, nn

from asrkit.config import ConfigError, SpecAugmentConfig, SpeedPerturbConfig

__all__ = ["SpecAugment", "SpeedPerturb", "sample_band_masks", "sample_time_warp", "time_warp", "speed_perturb"]


def _valid(lens: Tensor, n: int) -> Tensor:
    """(B, n) bool: True on each utterance's valid positions."""
    return torch.arange(n, device=lens.device)[None, :] < lens[:, None]


def sample_band_masks(size: Tensor, num_masks: int, max_width: Tensor, n: int) -> Tensor:
    """Random bands inside ``[0, size[b])`` as a (B, n) bool mask; ``n >= size.max()``.

    ``size`` (B,) is the extent to mask in (number of valid frames, or the
    feature dimension repeated); ``max_width`` (B,) caps each band. For each
    utterance, ``num_masks`` bands are drawn independently: width uniform in
    ``{0..max_width[b]}``, start uniform in ``{0..size[b] - width}``, so a band
    never leaves the valid region. Bands may overlap.
    """
    size = size.long()
    max_width = torch.minimum(max_width.long(), size).clamp(min=0)
    pos = torch.arange(n, device=size.device)  # (n,)
    mask = torch.zeros(size.numel(), n, dtype=torch.bool, device=size.device)
    for _ in range(num_masks):
        width = (torch.rand(size.shape, device=size.device) * (max_width + 1)).long()  # (B,) in {0..max_width}
        start = (torch.rand(size.shape, device=size.device) * (size - width + 1)).long()  # (B,) in {0..size-width}
        mask |= (pos[None, :] >= start[:, None]) & (pos[None, :] < (start + width)[:, None])
    return mask


def sample_time_warp(lens: Tensor, max_warp: int) -> Tuple[Tensor, Tensor]:
    """Warp parameters ``(centers, warped)`` (B,) long for :func:`time_warp`.

    The centre is uniform in ``[max_warp + 1, len - max_warp - 2]`` and moves
    to a uniform position within ``max_warp`` of it, so both stretched
    segments keep at least two frames. Utterances shorter than
    ``2 * max_warp + 3`` frames get ``centers == warped == 0`` (no warp).
    """
    lens = lens.long()
    ok = lens >= 2 * max_warp + 3
    span = (lens - 2 * max_warp - 2).clamp(min=1)
    centers = max_warp + 1 + (torch.rand(lens.shape, device=lens.device) * span).long()
    shift = (torch.rand(lens.shape, device=lens.device) * (2 * max_warp + 1)).long() - max_warp
    centers = torch.where(ok, centers, torch.zeros_like(centers))
    warped = torch.where(ok, centers + shift, torch.zeros_like(centers))
    return centers, warped


def time_warp(feats: Tensor, lens: Tensor, centers: Tensor, warped: Tensor) -> Tensor:
    """Piecewise-linear time warp: frame ``centers[b]`` moves to ``warped[b]``; shape and lengths are kept.

    Output frames ``[0, w]`` linearly resample input frames ``[0, c]`` and
    output frames ``[w, len - 1]`` resample ``[c, len - 1]`` (endpoints map to
    endpoints, like ``interpolate(align_corners=True)``); values between
    input frames are linearly interpolated. Frames at or past ``len`` are
    copied unchanged. feats (B, F, D), lens/centers/warped (B,).
    """
    B, F, D = feats.shape
    t = torch.arange(F, device=feats.device, dtype=torch.float64)[None, :]  # (1, F)
    c, w = centers.double()[:, None], warped.double()[:, None]  # (B, 1)
    last = (lens.double()[:, None] - 1).clamp(min=0)  # (B, 1) index of the last valid frame
    left = t * c / w.clamp(min=1)
    right = c + (t - w) * (last - c) / (last - w).clamp(min=1)
    src = torch.where(t < w, left, right)
    src = torch.where(t < lens[:, None], src, t).clamp(0, max(F - 1, 0))  # (B, F)
    i0 = src.floor().long()
    # The upper neighbour stays inside the utterance (padding is never mixed in).
    i1 = torch.where(t < lens[:, None], torch.minimum(i0 + 1, last.long()), i0)
    frac = (src - i0).to(feats.dtype)[:, :, None]
    x0 = feats.gather(1, i0[:, :, None].expand(B, F, D))
    x1 = feats.gather(1, i1[:, :, None].expand(B, F, D))
    return x0 + (x1 - x0) * frac


class SpecAugment(nn.Module):
    """SpecAugment (Park et al., 2019) on batched features, training mode only.

    Order: optional time warp, then ``num_freq_masks`` frequency bands of up
    to ``freq_mask_width`` bins, then ``num_time_masks`` time bands of up to
    ``min(time_mask_width, floor(time_mask_ratio * len))`` frames, drawn
    independently per utterance inside its valid frames. Masked cells take
    ``fill`` (D,) if given (the Frontend passes the CMVN mean, so they become
    0 after normalisation) else 0. Padding frames are never changed.
    """

    def __init__(self, cfg: SpecAugmentConfig) -> None:
        super().__init__()
        for name in ("num_freq_masks", "freq_mask_width", "num_time_masks", "time_mask_width", "time_warp"):
            if getattr(cfg, name) < 0:
                raise ConfigError(f"specaug.{name} must be >= 0, got {getattr(cfg, name)}")
        if not 0.0 <= cfg.time_mask_ratio <= 1.0:
            raise ConfigError(f"specaug.time_mask_ratio must be in [0, 1], got {cfg.time_mask_ratio}")
        self.cfg = cfg

    def forward(self, feats: Tensor, feat_lens: Tensor, fill: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """feats (B, F, D), feat_lens (B,) -> augmented feats (B, F, D), feat_lens (unchanged)."""
        if not self.training:
            return feats, feat_lens
        cfg = self.cfg
        B, F, D = feats.shape
        if cfg.time_warp > 0:
            feats = time_warp(feats, feat_lens, *sample_time_warp(feat_lens, cfg.time_warp))
        dims = torch.full((B,), D, device=feats.device)
        freq = sample_band_masks(dims, cfg.num_freq_masks, torch.full_like(dims, cfg.freq_mask_width), D)  # (B, D)
        caps = torch.clamp((feat_lens.double() * cfg.time_mask_ratio).floor().long(), max=cfg.time_mask_width)
        time = sample_band_masks(feat_lens.clamp(0, F).long(), cfg.num_time_masks, caps, F)  # (B, F)
        mask = (freq[:, None, :] | time[:, :, None]) & _valid(feat_lens, F)[:, :, None]  # (B, F, D)
        value = feats.new_zeros(()) if fill is None else fill.to(feats.dtype)
        return torch.where(mask, value, feats), feat_lens


def _resampled_length(lens: Tensor, orig: int, new: int) -> Tensor:
    """``ceil(lens * new / orig)`` in exact integer arithmetic (torchaudio's output length)."""
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    return torch.div(lens * n + o - 1, o, rounding_mode="floor")


def speed_perturb(wav: Tensor, wav_lens: Tensor, factors: Sequence[float], sample_rate: int) -> Tuple[Tensor, Tensor]:
    """Change the speed (tempo and pitch, like ``sox speed``) of each utterance by ``factors[b]``.

    Implemented as ``torchaudio.functional.resample(x, orig_freq=round(sample_rate * factor),
    new_freq=sample_rate)``: played back at ``sample_rate`` the result is
    ``factor`` times faster, and ``len`` samples become ``ceil(len / factor)``.
    Utterances sharing a factor are resampled as one batch; the zero padding
    makes each equal to resampling it alone. wav (B, T), wav_lens (B,) ->
    wav (B, T') zero-padded, new lengths (B,).
    """
    if len(factors) != wav.size(0):
        raise ValueError(f"speed_perturb: got {len(factors)} factors for a batch of {wav.size(0)}")
    wav = wav.masked_fill(~_valid(wav_lens, wav.size(1)), 0.0)
    pieces: List[Tuple[Tensor, Tensor, Tensor]] = []  # (rows, wav, lens) per factor
    for factor in sorted(set(factors)):
        rows = torch.tensor([b for b, f in enumerate(factors) if f == factor], device=wav.device)
        orig = int(round(sample_rate * factor))
        if orig <= 0:
            raise ValueError(f"speed_perturb: factor {factor} is too small for sample rate {sample_rate}")
        x, n = wav[rows], wav_lens[rows]
        if orig != sample_rate:
            x = AF.resample(x, orig_freq=orig, new_freq=sample_rate)
            n = _resampled_length(n.long(), orig, sample_rate)
            x = x.masked_fill(~_valid(n, x.size(1)), 0.0)  # drop the filter tail past the new length
        pieces.append((rows, x, n))
    width = max(x.size(1) for _, x, _ in pieces)
    out = wav.new_zeros(wav.size(0), width)
    out_lens = torch.zeros_like(wav_lens)
    for rows, x, n in pieces:
        out[rows, : x.size(1)] = x
        out_lens[rows] = n.to(out_lens.dtype)
    return out, out_lens


class SpeedPerturb(nn.Module):
    """Speed perturbation in training mode: each utterance gets a factor drawn uniformly from ``cfg.factors``.

    Factors are drawn per utterance (not per batch) for more variety; the
    cost stays one resampling call per distinct factor. See :func:`speed_perturb`.
    """

    def __init__(self, cfg: SpeedPerturbConfig, sample_rate: int) -> None:
        super().__init__()
        if not cfg.factors or any(f <= 0 for f in cfg.factors):
            raise ConfigError(f"speed_perturb.factors must be a non-empty list of positive numbers, got "
                              f"{list(cfg.factors)}")
        self.factors = tuple(float(f) for f in cfg.factors)
        self.sample_rate = sample_rate

    def sample_factors(self, batch_size: int) -> List[float]:
        """One factor per utterance (CPU generator: the choice is needed on the host to group rows)."""
        return [self.factors[i] for i in torch.randint(len(self.factors), (batch_size,)).tolist()]

    def forward(self, wav: Tensor, wav_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """wav (B, T), wav_lens (B,) -> perturbed wav (B, T'), new lengths (B,)."""
        if not self.training:
            return wav, wav_lens
        return speed_perturb(wav, wav_lens, self.sample_factors(wav.size(0)), self.sample_rate)
