"""Batched greedy CTC decoding: best token per frame, collapse repeats, drop blanks."""
from __future__ import annotations

from typing import Tuple

import torch

from asrkit.search.hypotheses import NBest, pack_emissions
from asrkit.search.interfaces import BLANK_ID


def check_ctc_inputs(log_probs: torch.Tensor, lengths: torch.Tensor) -> None:
    """Raise ValueError naming the utterance (batch row) and the problem."""
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (batch, frames, vocab), got shape {tuple(log_probs.shape)}")
    if not log_probs.is_floating_point():
        raise ValueError(f"log_probs must be floating point, got {log_probs.dtype}")
    batch, frames, vocab = log_probs.shape
    if vocab < 2:
        raise ValueError(f"log_probs has vocab size {vocab}; CTC needs the blank (id {BLANK_ID}) and a token")
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(f"lengths must be ({batch},) for {batch} utterances, got shape {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths must be integers, got {lengths.dtype}")
    bad = ((lengths < 0) | (lengths > frames)).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        raise ValueError(f"utterance {b} (batch row {b}): length {int(lengths[b])} outside [0, {frames}] frames")
    # One cheap pass: a NaN (or +inf) anywhere makes its utterance's sum NaN (or +inf).
    sums = log_probs.sum((1, 2))
    bad = (torch.isnan(sums) | (sums == float("inf"))).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        t = int((torch.isnan(log_probs[b]) | (log_probs[b] == float("inf"))).any(1).nonzero()[0])
        raise ValueError(f"utterance {b} (batch row {b}): log_probs contain NaN or +inf at frame {t}")


def greedy_search(log_probs: torch.Tensor, lengths: torch.Tensor) -> NBest:
    """Best-path CTC decoding of a padded batch.

    log_probs: (B, T, V) log-probabilities, blank id 0; lengths: (B,) valid frames per utterance.
    Returns an :class:`NBest` with N = 1 whose score and ctc_score are the log-probability of the
    best frame-level path (not summed over alignments) and whose token_frames are the first frame
    of each emitted token. Frames past an utterance's length are ignored.
    """
    check_ctc_inputs(log_probs, lengths)
    best, ids = log_probs.max(-1)  # (B, T) each
    tokens, counts, token_frames, valid = _collapse(ids, lengths.to(ids.device, torch.long), BLANK_ID)
    path_score = torch.where(valid, best, torch.zeros((), dtype=best.dtype, device=best.device)).sum(1)
    return NBest(
        tokens=tokens[:, None],
        lengths=counts[:, None],
        scores=path_score[:, None],
        ctc_scores=path_score[:, None].clone(),
        token_frames=token_frames[:, None],
    )


def ctc_greedy_search(log_probs: torch.Tensor, lengths: torch.Tensor,
                      blank: int = BLANK_ID) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_probs (B, T, V), lengths (B,) -> tokens (B, L) padded with -1, token counts (B,), first frames (B, L).

    The tuple form used by the pipeline; :func:`greedy_search` returns the same decoding as an
    :class:`NBest` with path scores.
    """
    tokens, counts, frames, _ = _collapse(log_probs.argmax(-1), lengths.to(log_probs.device, torch.long), blank)
    return tokens, counts, frames


def _collapse(ids: torch.Tensor, lengths: torch.Tensor, blank: int) -> Tuple[torch.Tensor, ...]:
    """ids (B, T) best token per frame -> tokens (B, L), counts (B,), first frames (B, L), valid (B, T).

    A token is emitted at frame t when ids[t] is not blank and differs from ids[t-1]; frames past
    an utterance's length never emit.
    """
    batch, frames = ids.shape
    valid = torch.arange(frames, device=ids.device) < lengths[:, None]  # (B, T)
    prev = torch.nn.functional.pad(ids[:, :-1], (1, 0), value=-1)
    emit = (ids != blank) & (ids != prev) & valid
    frame_ids = torch.arange(frames, device=ids.device).expand(batch, frames)
    tokens, token_frames, counts = pack_emissions(torch.where(emit, ids, -1), frame_ids)
    return tokens, counts, token_frames, valid
