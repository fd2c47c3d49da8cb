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


def chunk_mask(size: int, chunk_frames: int, left_chunks: int = -1,
               device: Optional[torch.device] = None) -> torch.Tensor:
    """(T, T) bool, True where query t may attend to key s under chunk-wise attention (WeNet U2): frames are
    grouped into chunks of ``chunk_frames`` from frame 0; a query sees every frame of its own chunk and of the
    ``left_chunks`` chunks before it (all earlier chunks when ``left_chunks`` < 0), none later.
    ``chunk_frames`` <= 0 is full context (all True)."""
    if chunk_frames <= 0:
        return torch.ones(size, size, dtype=torch.bool, device=device)
    chunk = torch.arange(size, device=device) // chunk_frames  # (T,) chunk index of each frame
    offset = chunk.unsqueeze(0) - chunk.unsqueeze(1)  # (T, T): key's chunk - query's chunk
    allowed = offset <= 0
    if left_chunks >= 0:
        allowed &= offset >= -left_chunks
    return allowed
