"""Padding and causal masks. Convention: ``True`` marks a *valid* position."""
from __future__ import annotations

from typing import Optional

import torch


def lengths_to_mask(lengths: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    """(B,) lengths -> (B, T) bool, True where ``t < length``."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def causal_mask(size: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """(T, T) bool, True where query t may attend to key s (s <= t)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()
