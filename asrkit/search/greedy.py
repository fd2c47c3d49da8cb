"""Batched greedy CTC decoding: best token per frame, collapse repeats, drop blanks; and the two rules live
streams carry across chunks (:func:`collapse` from the frame before a chunk, :func:`trailing_blanks`)."""
from __future__ import annotations

from typing import Optional, Tuple

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
    tokens, counts, token_frames, valid = collapse(ids, lengths)
    path_score = torch.where(valid, best, 0.0).sum(1)
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
    tokens, counts, frames, _ = collapse(log_probs.argmax(-1), lengths, blank)
    return tokens, counts, frames


def collapse(ids: torch.Tensor, lengths: torch.Tensor, blank: int = BLANK_ID,
             previous: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """ids (B, T) best token per frame -> tokens (B, L) padded with -1, counts (B,), first frames (B, L),
    valid (B, T) (the frames within each row's length).

    A token is emitted at frame t when ids[t] is not blank and differs from ids[t-1]; frames past
    an utterance's length never emit. ``previous`` (B,): the id of the frame before each row's first
    (a stream's chunk continues the one before it, so a repeat across the cut is one token); default: a blank.
    """
    frame_ids = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # (B, T)
    valid = frame_ids < lengths.to(ids.device)[:, None]
    prev = torch.nn.functional.pad(ids[:, :-1], (1, 0), value=blank)  # (B, T); (B, 1) when T = 0, as broadcast
    if previous is not None:
        prev[:, 0] = previous
    emit = (ids != blank) & (ids != prev) & valid
    tokens, token_frames, counts = pack_emissions(torch.where(emit, ids, -1), frame_ids)
    return tokens, counts, token_frames, valid


def trailing_blanks(ids: torch.Tensor, lengths: torch.Tensor, before: Optional[torch.Tensor] = None,
                    blank: int = BLANK_ID) -> torch.Tensor:
    """(B,) int64: the blank frames that end each row's first lengths[b] frames of the best path ids (B, T)
    (the trailing silence a live stream's endpointing reads). ``before`` (B,): the run that ended each
    stream's frames before these, which a row with no spoken frame extends; default 0. lengths and before
    are on ids' device."""
    t = torch.arange(ids.shape[1], device=ids.device)
    spoken = (ids != blank) & (t < lengths[:, None])  # (B, T)
    # one past the last spoken frame (0: none); a zero column so that a chunk of no frames has a maximum
    end = torch.nn.functional.pad(torch.where(spoken, t + 1, 0), (1, 0)).amax(1)  # (B,)
    run = lengths - end
    if before is None:
        return run
    return torch.where(end == 0, before + run, run)
