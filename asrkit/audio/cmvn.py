"""Global cepstral mean and variance normalisation: streaming statistics and the module that applies them.

:class:`CMVNStats` accumulates per-dimension sums, sums of squares and a frame
count in float64 over valid (non-padding) frames, batch by batch, so a corpus
never has to be held in memory. Stats are saved as human-readable JSON::

    {"format": "asrkit-cmvn", "version": 1, "dim": 80, "frame_count": 123456,
     "sum": [...], "sum_squares": [...], "mean": [...], "std": [...], "meta": {...}}

``sum``, ``sum_squares`` and ``frame_count`` are the stored state (so files
from several jobs can be merged); ``mean`` and ``std`` (population std, with
the default variance floor) are written for people to read and ignored on load.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from asrkit.atomic import atomic_write

__all__ = ["CMVNStats", "CMVNError", "GlobalCMVN", "DEFAULT_VAR_FLOOR"]

FORMAT = "asrkit-cmvn"
VERSION = 1
# Floor on the per-dimension variance. A log-mel bin that is constant over the
# training data (e.g. above the band limit of the corpus) would otherwise get
# an enormous istd and blow up on any other data; std >= 0.01 is far below the
# spread of real log-mel features (typically 1 to 5).
DEFAULT_VAR_FLOOR = 1e-4


class CMVNError(ValueError):
    """Unusable CMVN statistics (empty, wrong shape, malformed file); the message names the file."""


class CMVNStats:
    """Streaming per-dimension statistics of feature frames (float64, on the CPU)."""

    def __init__(self, dim: Optional[int] = None, meta: Optional[Dict[str, Any]] = None) -> None:
        self.dim = dim
        self.sum: Optional[Tensor] = None if dim is None else torch.zeros(dim, dtype=torch.float64)
        self.sum_squares: Optional[Tensor] = None if dim is None else torch.zeros(dim, dtype=torch.float64)
        self.frame_count = 0
        self.meta: Dict[str, Any] = dict(meta or {})

    def _ensure(self, dim: int) -> None:
        if self.dim is None:  # the first update fixes the dimension
            self.dim = dim
            self.sum = torch.zeros(dim, dtype=torch.float64)
            self.sum_squares = torch.zeros(dim, dtype=torch.float64)
        elif dim != self.dim:
            raise CMVNError(f"CMVN stats have dimension {self.dim}, got features of dimension {dim}")

    def update(self, feats: Tensor, lens: Optional[Tensor] = None) -> None:
        """Add the valid frames of ``feats`` (B, F, D) with lengths ``lens`` (B,), or all frames of (F, D)."""
        if feats.dim() == 2:
            feats = feats[None]
            lens = torch.tensor([feats.size(1)]) if lens is None else lens.reshape(1)
        if feats.dim() != 3:
            raise CMVNError(f"CMVN update expects feats of shape (B, F, D) or (F, D), got {tuple(feats.shape)}")
        if lens is None:
            lens = torch.full((feats.size(0),), feats.size(1))
        self._ensure(feats.size(2))
        valid = torch.arange(feats.size(1), device=feats.device)[None, :] < lens.to(feats.device)[:, None]  # (B, F)
        x = feats.double().masked_fill(~valid[:, :, None], 0.0)
        self.sum += x.sum(dim=(0, 1)).cpu()
        self.sum_squares += x.square().sum(dim=(0, 1)).cpu()
        self.frame_count += int(valid.sum())

    def merge(self, other: "CMVNStats") -> None:
        """Add another accumulator's statistics (e.g. from a parallel job)."""
        if other.frame_count == 0:
            return
        self._ensure(int(other.dim))
        self.sum += other.sum
        self.sum_squares += other.sum_squares
        self.frame_count += other.frame_count

    def finalize(self, var_floor: float = DEFAULT_VAR_FLOOR) -> Tuple[Tensor, Tensor]:
        """``(mean, istd)`` float32 tensors of shape (D,); ``istd = 1 / sqrt(max(var, var_floor))``."""
        if self.frame_count == 0:
            raise CMVNError("CMVN stats are empty: no frames were accumulated")
        mean = self.sum / self.frame_count
        var = torch.clamp(self.sum_squares / self.frame_count - mean.square(), min=var_floor)
        return mean.float(), var.rsqrt().float()

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready dict (see module docstring)."""
        mean, istd = self.finalize()
        return {"format": FORMAT, "version": VERSION, "dim": self.dim, "frame_count": self.frame_count,
                "sum": self.sum.tolist(), "sum_squares": self.sum_squares.tolist(),
                "mean": mean.double().tolist(), "std": (1.0 / istd.double()).tolist(), "meta": self.meta}

    @classmethod
    def from_dict(cls, data: Any, where: str = "CMVN stats") -> "CMVNStats":
        """Inverse of :meth:`to_dict`; ``where`` (a file name) prefixes error messages."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CMVNError(f"{where}: not an asrkit CMVN stats object (missing \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise CMVNError(f"{where}: unsupported CMVN stats version {data.get('version')!r} (expected {VERSION})")
        for key in ("dim", "frame_count", "sum", "sum_squares"):
            if key not in data:
                raise CMVNError(f"{where}: missing key '{key}'")
        dim, count = data["dim"], data["frame_count"]
        if not isinstance(dim, int) or dim <= 0 or not isinstance(count, int) or count <= 0:
            raise CMVNError(f"{where}: 'dim' and 'frame_count' must be positive integers, got {dim!r}, {count!r}")
        stats = cls(dim, data.get("meta") or {})
        for key in ("sum", "sum_squares"):
            values = data[key]
            if (not isinstance(values, list) or len(values) != dim
                    or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)):
                raise CMVNError(f"{where}: '{key}' must be a list of {dim} finite numbers")
            setattr(stats, key, torch.tensor(values, dtype=torch.float64))
        if bool((stats.sum_squares < 0).any()):  # a sum of squares cannot be negative: a corrupt file
            raise CMVNError(f"{where}: 'sum_squares' has negative entries (at dimensions "
                            f"{torch.nonzero(stats.sum_squares < 0).flatten().tolist()})")
        stats.frame_count = count
        return stats

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (a crash never leaves a half-written stats file)."""
        with atomic_write(path) as fh:
            json.dump(self.to_dict(), fh, indent=1)
            fh.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CMVNStats":
        """Read stats written by :meth:`save`; errors name the file."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise CMVNError(f"{path}: cannot read CMVN stats: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise CMVNError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
        return cls.from_dict(data, where=path)


class GlobalCMVN(nn.Module):
    """``(feats - mean) * istd`` on valid frames; padding frames stay exactly 0.

    ``mean`` and ``istd`` are persistent buffers, so a checkpoint's state dict carries them.
    """

    def __init__(self, mean: Tensor, istd: Tensor) -> None:
        super().__init__()
        mean, istd = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(istd, dtype=torch.float32)
        if mean.dim() != 1 or mean.shape != istd.shape:
            raise CMVNError(f"CMVN mean and istd must be 1-D of equal size, got {tuple(mean.shape)} and "
                            f"{tuple(istd.shape)}")
        self.register_buffer("mean", mean.clone())
        self.register_buffer("istd", istd.clone())

    @classmethod
    def from_stats(cls, stats: CMVNStats, var_floor: float = DEFAULT_VAR_FLOOR) -> "GlobalCMVN":
        return cls(*stats.finalize(var_floor))

    def forward(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """feats (B, F, D), feat_lens (B,) -> normalised feats (B, F, D), feat_lens."""
        if feats.size(-1) != self.mean.numel():
            raise CMVNError(f"CMVN has dimension {self.mean.numel()}, got features of dimension {feats.size(-1)}")
        valid = torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]  # (B, F)
        out = (feats - self.mean) * self.istd
        return out.masked_fill(~valid[:, :, None], 0.0), feat_lens
