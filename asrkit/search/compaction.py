"""Blank-frame compaction for CTC prefix search: which input frames a search step visits.

Frames whose blank probability exceeds ``skip_threshold`` are treated as pure blank frames: they emit
nothing, so a search visits only the other ("kept") frames, and the skipped frames' log P(blank), the same
for every hypothesis of an utterance, is added once at the end (``offset``). Shared by the torch frame loop
(:mod:`asrkit.search.ctc_prefix`) and the native one (:mod:`asrkit.search.native_loop`). It reads the width back
to the host once per batch, before the loop (the one-launch GPU search, :mod:`asrkit.search.fused_search`, skips
frames in its kernel instead).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch


class Compaction(NamedTuple):
    frame: torch.Tensor  # (B, T') input frame of compacted step i, -1 after the utterance's last kept frame
    skip: Optional[torch.Tensor]  # (B, T) the skipped (pure blank) frames; None when there are none
    offset: torch.Tensor  # (B,) sum of the skipped frames' log P(blank), in the input's dtype
    identity: bool  # nothing skipped and T' == T: step i reads input frame i


def compact_frames(lp: torch.Tensor, lengths: torch.Tensor, blank_id: int,
                   skip_threshold: Optional[float]) -> Compaction:
    """lp (B, T, V) log-probs, lengths (B,) -> the :class:`Compaction` of the batch.

    Adaptive: where no frame passes the threshold (e.g. large vocabularies) there is no compaction."""
    batch, frames, _ = lp.shape
    t_ids = torch.arange(frames, device=lp.device)
    in_len = t_ids < lengths[:, None]  # (B, T)
    blank = lp[..., blank_id]  # (B, T)
    skip = None if skip_threshold is None else (blank > math.log(skip_threshold)) & in_len
    keep = in_len if skip is None else in_len & ~skip
    width, skipped = 0, 0
    if batch:  # one host read for both numbers (on a GPU each read waits for the device)
        parts = [keep.sum(1).max()] if skip is None else [keep.sum(1).max(), skip.any()]
        width, skipped = (torch.stack(parts).tolist() + [0])[:2]
    if not skipped:
        skip = None  # no frame passed the threshold: keep == in_len, the width stands
    if skip is None:
        frame = torch.where(in_len[:, :width], t_ids[:width], -1)  # (B, T')
        offset = torch.zeros(batch, dtype=lp.dtype, device=lp.device)
    else:
        slot = torch.where(keep, keep.cumsum(1) - 1, width)  # compacted position, or the spill column
        frame = torch.full((batch, width + 1), -1, dtype=torch.long, device=lp.device)
        frame = frame.scatter_(1, slot, t_ids.expand(batch, frames))[:, :width].contiguous()
        offset = torch.where(skip, blank.double(), 0.0).sum(1).to(lp.dtype)
    return Compaction(frame, skip, offset, width == frames and skip is None)
