"""N-best containers: padded tensors out of a search, python lists only on request.

A search fills :class:`NBest` with tensors on its own device and never syncs inside its loop;
:meth:`NBest.to_lists` is the one place that moves results to the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch


@dataclass(frozen=True)
class Hypothesis:
    """One decoded hypothesis as plain python values."""

    tokens: List[int]
    score: float  # total: CTC + sum of weighted scorer scores (incl. end of sentence)
    ctc_score: float  # log P_ctc(tokens | x), summed over alignments (prefix search) or the best path (greedy)
    token_frames: List[int]  # frame index (input frame rate) at which each token was emitted


@dataclass
class NBest:
    """Batched N-best lists, best first.

    tokens: (B, N, L) long, padded with -1; lengths: (B, N) long; scores, ctc_scores: (B, N) float,
    ``-inf`` marks an empty slot (fewer than N hypotheses survived); token_frames: (B, N, L) long,
    padded with -1.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    scores: torch.Tensor
    ctc_scores: torch.Tensor
    token_frames: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def nbest(self) -> int:
        return self.tokens.shape[1]

    def to_lists(self) -> List[List[Hypothesis]]:
        """Per utterance, the list of surviving hypotheses (empty slots dropped)."""
        tokens = self.tokens.cpu().tolist()
        frames = self.token_frames.cpu().tolist()
        lengths = self.lengths.cpu().tolist()
        scores = self.scores.double().cpu().tolist()
        ctc = self.ctc_scores.double().cpu().tolist()
        out: List[List[Hypothesis]] = []
        for b in range(self.batch_size):
            hyps = []
            for n in range(self.nbest):
                if scores[b][n] == float("-inf"):
                    continue
                length = lengths[b][n]
                hyps.append(Hypothesis(tokens[b][n][:length], scores[b][n], ctc[b][n], frames[b][n][:length]))
            out.append(hyps)
        return out

    def best(self) -> List[Hypothesis]:
        """The top hypothesis of every utterance (an empty one with -inf score if none survived)."""
        empty = Hypothesis([], float("-inf"), float("-inf"), [])
        return [hyps[0] if hyps else empty for hyps in self.to_lists()]

    def top(self, n: int) -> "NBest":
        """The first ``n`` hypotheses of every utterance (the list is sorted best first)."""
        return NBest(self.tokens[:, :n], self.lengths[:, :n], self.scores[:, :n], self.ctc_scores[:, :n],
                     self.token_frames[:, :n])

    @staticmethod
    def cat(parts: Sequence["NBest"]) -> "NBest":
        """Concatenate along the batch (e.g. halves of a batch split after running out of memory)."""
        if not parts:
            raise ValueError("NBest.cat: nothing to concatenate")
        n = max(p.nbest for p in parts)
        width = max(p.tokens.shape[2] for p in parts)

        def pad(x: torch.Tensor, value: float, dims: int) -> torch.Tensor:
            # Pad dim 1 to n and (for 3-D tensors) dim 2 to width.
            pads = [0, width - x.shape[2]] if dims == 3 else []
            pads += [0, n - x.shape[1]]
            return torch.nn.functional.pad(x, pads, value=value)

        return NBest(
            tokens=torch.cat([pad(p.tokens, -1, 3) for p in parts]),
            lengths=torch.cat([pad(p.lengths, 0, 2) for p in parts]),
            scores=torch.cat([pad(p.scores, float("-inf"), 2) for p in parts]),
            ctc_scores=torch.cat([pad(p.ctc_scores, float("-inf"), 2) for p in parts]),
            token_frames=torch.cat([pad(p.token_frames, -1, 3) for p in parts]),
        )


def pack_emissions(emitted: torch.Tensor, frames: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pack emitted tokens along the last axis.

    emitted: (..., T) token ids, -1 where nothing was emitted; frames: (..., T) frame of each slot.
    Returns (tokens, token_frames, lengths): (..., L) padded with -1, and (...,) counts, where L is
    the longest count (one host sync, outside any per-frame loop).
    """
    keep = emitted >= 0
    lengths = keep.sum(-1)
    width = int(lengths.max()) if lengths.numel() else 0
    pos = torch.where(keep, keep.cumsum(-1) - 1, width)  # the extra column collects padding
    shape = emitted.shape[:-1] + (width + 1,)
    tokens = emitted.new_full(shape, -1).scatter_(-1, pos, torch.where(keep, emitted, -1))
    out_frames = frames.new_full(shape, -1).scatter_(-1, pos, torch.where(keep, frames, -1))
    return tokens[..., :width], out_frames[..., :width], lengths


def trace_rows(parents: torch.Tensor, final: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Follow backpointers from the last step to the first.

    parents: (T, B, K) row in the previous step's beam of each hypothesis; final: (B, N) rows to trace at the
    end. Returns the (T, B, N) row of each traced hypothesis at every step and the (B, N) rows before step 0
    they descend from (a resumed search's earlier beam).
    """
    rows = final
    trace = []
    for t in range(parents.shape[0] - 1, -1, -1):
        trace.append(rows)
        rows = parents[t].gather(1, rows)
    if not trace:
        return final.new_empty((0,) + final.shape), rows
    return torch.stack(trace[::-1]), rows


def backtrack(parents: torch.Tensor, emitted: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Follow backpointers from the last step to the first.

    parents: (T, B, K) row in the previous step's beam of each hypothesis; emitted: (T, B, K) token
    it appended at that step or -1; final: (B, N) rows of the hypotheses to trace at the end.
    Returns (B, N, T) emitted tokens along each traced path (-1 where none).
    """
    rows_per_step = trace_rows(parents, final)[0]  # (T, B, N)
    return emitted.gather(2, rows_per_step).permute(1, 2, 0)
