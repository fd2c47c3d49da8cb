"""The chunk of dynamic chunk training (WeNet U2, Zhang et al. 2020, "Unified Streaming and Non-streaming
Two-pass End-to-end Model for Speech Recognition", sec. 2.2), drawn once per training batch.

U2 draws ``c ~ U(1, T')`` and takes full context when ``c > T' / 2``, else ``c mod 25 + 1``: about half the
batches full context, the rest nearly uniform over 1..25 frames. Here the same two cases are drawn directly,
so the shares do not depend on the batch's length: full context with probability ``full_context_prob``, else
a chunk uniform in 1..``max_chunk_frames``. The left context is fixed (``left_chunks``; -1 = all) or, with
``dynamic_left_chunks``, uniform in 0..(T' - 1) // c (U2's use_dynamic_left_chunk; its upper end, every
earlier chunk, is full left context). Draws use torch's default generator (seeded by the trainer per rank,
and saved in checkpoints), unless one is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class DynamicChunk:
    full_context_prob: float = 0.5
    max_chunk_frames: int = 25
    left_chunks: int = -1
    dynamic_left_chunks: bool = False

    def draw(self, num_frames: int, generator: Optional[torch.Generator] = None) -> Tuple[int, int]:
        """(chunk_frames, left_chunks) for a batch of ``num_frames`` encoder frames; chunk_frames 0 = full context."""
        if float(torch.rand((), generator=generator)) < self.full_context_prob:
            return 0, -1
        chunk = int(torch.randint(1, self.max_chunk_frames + 1, (), generator=generator))
        if not self.dynamic_left_chunks:
            return chunk, self.left_chunks
        max_left = max(num_frames - 1, 0) // chunk
        return chunk, int(torch.randint(0, max_left + 1, (), generator=generator))
