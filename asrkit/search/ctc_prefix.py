"""Frame-synchronous CTC prefix beam search with shallow fusion: the entry point and its batch handling.

The algorithm, its cost model and its tensors are :mod:`asrkit.search.prefix_loop`'s (the torch frame loop). A
batch is searched by one of three runners with equal results: on the CPU, by default, one C++ call per batch
(:mod:`asrkit.search.native_loop`, ~5x faster with a word LM; ``native=`` chooses); on a GPU the torch loop
captured once per bucket of batch shapes and replayed (:mod:`asrkit.search.prefix_graph`; ``cuda_graph=``
chooses), its step a Triton kernel, and without scorers the whole search one Triton launch
(:mod:`asrkit.search.fused_search`); else the torch loop run eagerly. On CUDA, a batch that runs out of memory is split in half and
retried. On CPU the search runs with one intra-op thread (its tensors are tiny) and restores the setting after.

Streaming: :func:`resume_search` runs the same loop from a state the caller holds (:class:`BeamRows`) over
the next frames of B streams, for :class:`asrkit.search.streaming.StreamingCtcSearch`.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

import torch

from asrkit.search import native_loop, prefix_graph, prefix_loop
from asrkit.search.greedy import check_ctc_inputs
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BatchScorer, active_scorers
from asrkit.search.prefix_loop import BeamRows, fresh_rows, search_threads

__all__ = ["BeamRows", "Chunk", "check_options", "ctc_prefix_beam_search", "fresh_rows", "resume_search",
           "search_threads"]


def _search_batch(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int,
                  scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], bonus: float,
                  topk: Optional[int], min_logp: Optional[float], skip: Optional[float],
                  cuda_graph: bool = False) -> NBest:
    with prefix_loop.search_threads(lp.device):
        if cuda_graph and lp.shape[1]:  # a batch of no frames has no loop to capture
            return prefix_graph.search(lp, lengths, beam, nbest, scorers, weights, bonus, topk, min_logp, skip)
        s, fr = prefix_loop.prepare(lp, lengths, beam, scorers, bonus, topk, min_logp, skip)
        prefix_loop.frame_loop(s, fr, scorers, weights)
        return prefix_loop.finish(s, fr, scorers, weights, nbest)


class Chunk(NamedTuple):
    """What :func:`resume_search` gives back: the new state and the chunk's backpointers (for the caller's
    history of each hypothesis)."""

    rows: BeamRows  # the state after the chunk
    parents: torch.Tensor  # (T', B, K) each hypothesis's row in the previous step's beam (step 0: the start's)
    emitted: torch.Tensor  # (T', B, K) the token it appended at that step, -1 where none
    frame: torch.Tensor  # (B, T') the input frame of each step, -1 for padding steps
    offset: torch.Tensor  # (B,) the skipped blank frames' log P(blank), summed


def resume_search(lp: torch.Tensor, lengths: torch.Tensor, start: BeamRows, scorers: Mapping[str, BatchScorer],
                  weights: Mapping[str, float], bonus: float, topk: Optional[int], min_logp: Optional[float],
                  skip: Optional[float]) -> Chunk:
    """Advance B searches from the state ``start`` by their next frames lp (B, T, V) (lengths (B,)), which the
    caller has checked (the options as in :func:`ctc_prefix_beam_search`, scorers active and weighted).

    A search fed its frames in pieces reaches the state of one call over all of them: padding steps (rows
    whose piece is shorter, or has fewer kept frames) change nothing, and a run of skipped blank frames at
    either end of a piece moves pnb's mass into pb as it would between two kept frames of one call.
    """
    with prefix_loop.search_threads(lp.device):
        s, fr = prefix_loop.prepare(lp, lengths, start.ints.shape[2], scorers, bonus, topk, min_logp, skip, start)
        s.hold = list((fr.frame < 0).t()[..., None].unbind(0))  # (B, 1) per step
        if fr.skip is not None:
            prefix_loop.blank_run(s, fr.skip[:, 0])  # skipped frames before the first kept frame
        prefix_loop.frame_loop(s, fr, scorers, weights)
        if fr.skip is not None:  # after the last kept frame (the next piece may start with a kept one)
            prefix_loop.blank_run(s, fr.skip.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0])
        return Chunk(BeamRows(s.st, s.ints, s.states), *prefix_loop.backpointers(s, fr), fr.frame, fr.offset)


def _search_split(lp: torch.Tensor, lengths: torch.Tensor, **kw: Any) -> NBest:
    """Run one batch; on CUDA out-of-memory, split it in half and recurse."""
    try:
        return _search_batch(lp, lengths, **kw)
    except torch.cuda.OutOfMemoryError:
        if lp.shape[0] <= 1:
            raise
        if lp.is_cuda:
            torch.cuda.empty_cache()
        half = lp.shape[0] // 2
        return NBest.cat([_search_split(lp[:half], lengths[:half], **kw),
                          _search_split(lp[half:], lengths[half:], **kw)])


def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam: int = 10,
    nbest: Optional[int] = None,
    scorers: Optional[Mapping[str, BatchScorer]] = None,
    weights: Optional[Mapping[str, float]] = None,
    token_topk: Optional[int] = 8,
    token_min_logp: Optional[float] = -12.0,
    blank_skip_threshold: Optional[float] = 0.999,
    cuda_graph: Optional[bool] = None,
    native: Optional[bool] = None,
) -> NBest:
    """CTC prefix beam search over a padded batch, with optional shallow fusion.

    log_probs: (B, T, V) log-probabilities, blank id 0 (float64 input is searched in float64,
    anything else in float32); lengths: (B,) valid frames per utterance (later frames are ignored).
    scorers/weights: e.g. ``scorers={"lm": ngram}, weights={"lm": 0.5, "length_bonus": 1.0}`` gives
    ``score = log P_ctc + 0.5 log P_lm + 1.0 * #tokens`` (each scorer needs a weight; a weight of 0
    disables its scorer). Pruning: see :mod:`asrkit.search.prefix_loop`; ``token_topk=None,
    token_min_logp=None, blank_skip_threshold=None`` searches exactly. ``cuda_graph`` (torch loop): True runs
    the loop of :mod:`asrkit.search.prefix_graph` (captured once per bucket of batch shapes and replayed on CUDA;
    the same bucketed loop run eagerly elsewhere), False the plain eager loop, None (auto) the first on CUDA
    devices and the second elsewhere. Results are the same.
    Returns an :class:`NBest` (B, nbest) on the input's device, best first; ``to_lists()`` converts.
    Its token_frames are the input frame at which each token was emitted on the hypothesis's own
    surviving path. On CPU the call runs with ``torch.set_num_threads(1)`` and restores the setting.
    For checked inputs (token list, special ids, numpy) use :func:`asrkit.search.decode_ctc`.
    ``native``: run the C++ frame loop (:mod:`asrkit.search.native_loop`; same results to rounding). None
    (auto): when the inputs are on the CPU, every active scorer has a native form and the library builds;
    True: that loop or a ValueError saying why not; False: the torch loop.
    """
    check_ctc_inputs(log_probs, lengths)
    return _checked_search(log_probs, lengths, beam, nbest, scorers, weights, token_topk, token_min_logp,
                           blank_skip_threshold, cuda_graph, native)


def check_options(beam: int, nbest: Optional[int], token_topk: Optional[int],
                  blank_skip_threshold: Optional[float]) -> int:
    """A ValueError naming the first bad search option; returns nbest (None: the beam)."""
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    nbest = beam if nbest is None else nbest
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
    if token_topk is not None and token_topk < 1:
        raise ValueError(f"token_topk must be >= 1 or None, got {token_topk}")
    if blank_skip_threshold is not None and not 0.0 < blank_skip_threshold < 1.0:
        raise ValueError(f"blank_skip_threshold must be in (0, 1) or None, got {blank_skip_threshold}")
    return nbest


def _checked_search(log_probs: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: Optional[int],
                    scorers: Optional[Mapping[str, BatchScorer]], weights: Optional[Mapping[str, float]],
                    token_topk: Optional[int], token_min_logp: Optional[float],
                    blank_skip_threshold: Optional[float], cuda_graph: Optional[bool],
                    native: Optional[bool] = None) -> NBest:
    """ctc_prefix_beam_search after its input checks (decode_ctc makes its own, in one pass)."""
    nbest = check_options(beam, nbest, token_topk, blank_skip_threshold)
    active, active_weights, bonus = active_scorers(scorers or {}, weights or {})
    dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    lp = log_probs.to(dtype)
    lengths = lengths.to(lp.device, torch.long)
    if native is not False:
        why = native_loop.unavailable(lp, lengths, active)
        if why is None:
            return native_loop.search(lp, lengths, beam, nbest, active, active_weights, bonus, token_topk,
                                      token_min_logp, blank_skip_threshold)
        if native:
            raise ValueError(f"native=True, but the native search cannot run: {why}")
    return _search_split(lp, lengths, beam=beam, nbest=nbest, scorers=active,
                         weights=active_weights, bonus=bonus, topk=token_topk,
                         min_logp=token_min_logp, skip=blank_skip_threshold,
                         cuda_graph=lp.is_cuda if cuda_graph is None else cuda_graph)