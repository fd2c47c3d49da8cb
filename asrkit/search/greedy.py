"""Batched greedy CTC decoding: per-frame argmax, collapse repeats, drop blanks."""
from __future__ import annotations

from typing import Tuple

import torch


def ctc_greedy_search(log_probs: torch.Tensor, lengths: torch.Tensor,
                      blank: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_probs (B, T, V), lengths (B,) -> tokens (B, L) padded with -1, token counts (B,), first frames (B, L).

    A token is emitted at frame t when argmax(t) is not blank and differs from
    argmax(t-1); frames past an utterance's length never emit. ``first frames``
    gives the frame index at which each emitted token started (padded with -1).
    """
    b, t, _ = log_probs.shape
    best = log_probs.argmax(dim=-1)  # (B, T)
    prev = torch.nn.functional.pad(best, (1, 0), value=blank)[:, :-1]
    valid = torch.arange(t, device=best.device).unsqueeze(0) < lengths.unsqueeze(1)
    emit = (best != blank) & (best != prev) & valid  # (B, T)
    counts = emit.sum(dim=1)
    width = max(int(counts.max()) if b else 0, 0)
    # Stable sort puts emitting frames first, in time order.
    order = torch.sort((~emit).to(torch.int8), dim=1, stable=True).indices[:, :width]  # (B, L)
    keep = torch.arange(width, device=best.device).unsqueeze(0) < counts.unsqueeze(1)
    tokens = torch.where(keep, best.gather(1, order), torch.full_like(order, -1))
    frames = torch.where(keep, order, torch.full_like(order, -1))
    return tokens, counts, frames
