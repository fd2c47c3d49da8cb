"""CTC prefix beam search without scorers as one Triton launch over the log-probs: no host work before the result.

The fused step (:mod:`asrkit.search.fused_step`) runs every frame of a batch in one launch, but it reads tables the
host builds first (:class:`~asrkit.search.prefix_loop.FrameTables`): blank-frame compaction, whose width is read
back to the host (a sync), the best C tokens of every kept frame (a ``topk`` per chunk of rows), the kept frames'
rows step-major, padding and blank-run tables, and their copies into a captured graph's buffers: on an H100 about
5 ms of a 7 ms batch (V = 29, batch 32). Here :func:`asrkit.search.fused_kernel.ctc_search` does all of it in its
program, one per utterance: it walks the utterance's own frames (its length read from memory), skips the frames
whose blank probability passes the threshold (their log P(blank) summed into the offset, pnb's mass moved into pb
before the next kept frame, as the compaction does), takes each kept frame's best C tokens itself, and writes
backpointers for its kept frames only; :func:`~asrkit.search.fused_kernel.backtrack_paths` follows them. The host
issues 15 small ops and two launches per batch (``ASRKIT_FUSED_CANDIDATES=topk``: the candidates of every frame
taken before the launch by :func:`~asrkit.search.candidates.top_tokens`, a few ops more), none of them per frame,
and reads nothing back until the result (``to_nbest``: one sync). Results equal the torch loop's (hypotheses, frames, scores within rounding);
ties between equal log-probs may pick other candidates, as between ``torch.topk`` calls.

Used by :mod:`asrkit.search.prefix_graph` where the fused step is (``ASRKIT_FUSED_SEARCH=0`` keeps the fused step
on host-built tables, for comparison); not with scorers (their torch calls sit between steps), nor for the exact
search over more than 32 tokens, nor over more than :data:`MAX_VOCAB` tokens (a frame's row is held in registers).
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional, Tuple

import torch

from asrkit.search import fused_step, prefix_loop
from asrkit.search.candidates import top_tokens
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BLANK_ID, HASH_MUL, SENT_HASH, SENT_PARENT

MAX_VOCAB = 8192  # one frame's row is one block of the next power of two of V floats in a program's registers
# Where the best C tokens of a frame are taken: "kernel" (in the program, each kept frame: 2C reductions on its
# path from one frame to the next) or "topk" (every frame of the batch before the launch, by
# candidates.top_tokens: a few launches, in parallel over frames). Untimed on a GPU yet: the benchmark times both.
CANDIDATES = os.environ.get("ASRKIT_FUSED_CANDIDATES", "kernel")


def unavailable(lp: torch.Tensor, scorers: Mapping[str, Any], topk: Optional[int]) -> Optional[str]:
    """Why the one-launch search cannot search ``lp`` (B, T, V) with these scorers and ``token_topk`` (None: it
    can)."""
    batch, _, vocab = lp.shape
    if scorers:
        return "scorers are called between the steps"
    if batch == 0:
        return "an empty batch"
    if vocab > MAX_VOCAB:
        return f"more than {MAX_VOCAB} tokens"
    if prefix_loop.is_wide(vocab, prefix_loop.candidate_count(vocab, topk)):
        return "the exact search over many tokens keeps the torch step"
    return fused_step.unavailable(lp.device)


def _kernels() -> Tuple[Any, Any]:
    from asrkit.search.fused_kernel import backtrack_paths, ctc_search

    return ctc_search, backtrack_paths


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A (1,) tensor of ``like``'s dtype and device, filled on the device (no host-to-device copy)."""
    return torch.full((1,), value, dtype=like.dtype, device=like.device)


def run(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, bonus: float, topk: Optional[int],
        min_logp: Optional[float], skip: Optional[float]) -> Tuple[prefix_loop.Ranked, torch.Tensor]:
    """The search of ``lp`` (B, T, V), lengths (B,) long on its device, as ranked tensors and the (B, T) input frame
    of each kept step (past an utterance's kept frames: unspecified, its paths read -1 there). No host sync."""
    import triton

    batch, frames, vocab = lp.shape
    lp = lp.contiguous()
    n_cand = prefix_loop.candidate_count(vocab, topk)
    st, ints, _ = prefix_loop.fresh_rows(batch, beam, lp.dtype, lp.device, {})
    long = dict(dtype=torch.long, device=lp.device)
    parents = torch.empty((frames, batch, beam), **long)
    tokens = torch.empty((frames, batch, beam), **long)
    frame = torch.empty((batch, frames), **long)
    count = torch.empty((batch,), **long)
    offset = torch.empty((batch,), dtype=torch.float64, device=lp.device)
    # Compared in the input's dtype, as the torch loop compares its tensors with the Python floats.
    limits = torch.cat([_scalar(math.inf if skip is None else math.log(skip), lp),
                        _scalar(-math.inf if min_logp is None else min_logp, lp)])
    every = n_cand == vocab - 1
    tables = CANDIDATES == "topk" and not every
    # (B*T, C) values and token ids of every frame (tables), else unread
    vtab, ctab = top_tokens(lp.view(batch * frames, vocab), None, n_cand, BLANK_ID) if tables else (lp, ints)
    search, backtrack = _kernels()
    search[(batch,)](
        lp, lengths, limits, _scalar(bonus, lp), st, ints, parents, tokens, frame, count, offset, ctab, vtab,
        lp.stride(0), lp.stride(1), frames, batch, beam, n_cand, vocab,
        HAS_FUSION=bonus != 0.0, EVERY_TOKEN=every, TABLES=tables, BK=triton.next_power_of_2(beam),
        BC=triton.next_power_of_2(n_cand + 1), BV=triton.next_power_of_2(vocab), SENT_HASH_C=SENT_HASH,
        SENT_PARENT_C=SENT_PARENT, SENT_MIN_C=-(2 ** 63), HASH_MUL_C=HASH_MUL, num_warps=fused_step.NUM_WARPS)
    ctc = st[:, 2, :beam] + offset.to(lp.dtype)[:, None]  # + the skipped blank frames
    total, order = (ctc + st[:, 3, :beam]).topk(nbest, 1)  # best first
    paths = torch.empty((batch, nbest, frames), **long)
    backtrack[(batch,)](parents, tokens, order, count, paths, batch, beam, nbest, frames,
                        BN=triton.next_power_of_2(nbest))
    return prefix_loop.Ranked(total, ctc.gather(1, order), paths), frame


def search(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, bonus: float, topk: Optional[int],
           min_logp: Optional[float], skip: Optional[float]) -> NBest:
    """:func:`run` converted to an :class:`NBest` (arguments as ``ctc_prefix._search_batch``'s)."""
    return prefix_loop.to_nbest(*run(lp, lengths, beam, nbest, bonus, topk, min_logp, skip))
