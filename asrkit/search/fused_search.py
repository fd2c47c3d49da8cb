"""CTC prefix beam search as one Triton launch over the log-probs, with the table scorers inside: no host work
before the result.

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
and reads nothing back until the result (``to_nbest``: one sync). Results equal the torch loop's (hypotheses,
frames, scores within rounding); ties between equal log-probs may pick other candidates, as between ``torch.topk``
calls.

Scorers whose per-step work is table lookups run in the same program (:mod:`asrkit.search.fused_scorers`): the
kinds of :data:`FUSED_KINDS` (:class:`~asrkit.search.scorers.WordCount`, the token n-gram with dense tables or, up
to :data:`MAX_LOOKUP_ORDER`, through its k-gram tables, the :class:`~asrkit.search.lexicon.LexiconScorer`, the
word n-gram with its look-ahead and lexicon, dense or sorted-edge tries), at most one of each, and any
:class:`~asrkit.search.scorers.LengthBonus` (a bonus per token).
Their tables are those of their ``native_form()``, which the native C++ loop reads too, their start states those of
``init_state``; each program keeps its hypotheses' scorer states in registers, scores every candidate of a kept
frame, follows the picks and adds the weighted end-of-sentence scores (a few host ops more per batch, none per
frame). Other scorers (neural LMs, hotwords, a token n-gram of a higher order without dense tables) keep the
captured loop: :func:`scorers_unavailable` says why; ``ASRKIT_FUSED_SCORERS=0`` sends every search with scorers
there (:data:`FUSED_SCORERS`; not yet timed on a GPU, the benchmark times both).

Used by :mod:`asrkit.search.prefix_graph` where the fused step is (``ASRKIT_FUSED_SEARCH=0`` keeps the fused step
on host-built tables, for comparison); not for the exact search over more than 32 tokens, nor over more than
:data:`MAX_VOCAB` tokens (a frame's row is held in registers).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from asrkit.search import fused_step, prefix_loop
from asrkit.search.candidates import top_tokens
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BLANK_ID, HASH_MUL, SENT_HASH, SENT_PARENT, BatchScorer, NativeScorer
from asrkit.search.scorers import LengthBonus

MAX_VOCAB = 8192  # one frame's row is one block of the next power of two of V floats in a program's registers
# Where the best C tokens of a frame are taken: "kernel" (in the program, each kept frame: 2C reductions on its
# path from one frame to the next) or "topk" (every frame of the batch before the launch, by
# candidates.top_tokens: a few launches, in parallel over frames). Untimed on a GPU yet: the benchmark times both.
CANDIDATES = os.environ.get("ASRKIT_FUSED_CANDIDATES", "kernel")
# The scorer kinds the kernel runs (their native_form() kinds), in the order of its weights and flags; a LengthBonus
# scorer is folded into the length bonus.
FUSED_KINDS = ("word_count", "token_ngram", "lexicon", "word_ngram", "token_ngram_lookup")
MAX_LOOKUP_ORDER = 4  # token_ngram_lookup: a history of up to 3 words and 4 back-off sums in registers
# The table scorers inside the kernel (not yet timed on a GPU): ASRKIT_FUSED_SCORERS=0 sends a search with them to
# the captured loop (compiled scorers) and keeps the one-launch search for the searches without.
FUSED_SCORERS = os.environ.get("ASRKIT_FUSED_SCORERS", "1") != "0"


def _form_vocab(kind: str, tables: Mapping[str, torch.Tensor]) -> int:
    """The tokens a form's per-token tables cover (the kernel reads them at any candidate's id unchecked)."""
    if kind == "word_count":
        return tables["closes"].numel()
    if kind == "token_ngram":
        return int(tables["vocab"])
    if kind == "token_ngram_lookup":
        return tables["tok_to_lm"].numel()
    return int(tables["width"]) - 1  # lexicon, word_ngram: a column per token and one for "no change"


def scorers_unavailable(scorers: Mapping[str, BatchScorer], vocab: Optional[int] = None) -> Optional[str]:
    """Why the one-launch search cannot run these scorers in its program (None: it can): every scorer is a
    :class:`~asrkit.search.scorers.LengthBonus` or has a ``native_form()`` of a kind in :data:`FUSED_KINDS`, at most
    one of each kind, over ``vocab`` tokens if given. The others (neural LMs, hotwords, token n-grams over
    :data:`MAX_LOOKUP_ORDER` without dense tables) keep the captured loop."""
    seen: Dict[str, str] = {}
    for name, sc in scorers.items():
        if isinstance(sc, LengthBonus):
            continue
        if not FUSED_SCORERS:
            return "scorers in the kernel are turned off (ASRKIT_FUSED_SCORERS=0)"
        form = sc.native_form() if isinstance(sc, NativeScorer) else None
        if form is None:
            return f"scorer {name!r} ({type(sc).__name__}) has no table form: its torch calls run between the steps"
        kind = form[0]
        if kind not in FUSED_KINDS:
            return f"scorer {name!r} ({type(sc).__name__}) is of kind {kind!r}, not one the kernel runs " \
                   f"({', '.join(FUSED_KINDS)})"
        if kind == "token_ngram_lookup" and int(form[1]["order"]) > MAX_LOOKUP_ORDER:
            return f"scorer {name!r} ({type(sc).__name__}) is a {int(form[1]['order'])}-gram without dense tables: " \
                   f"the kernel looks up orders up to {MAX_LOOKUP_ORDER}"
        if vocab is not None and _form_vocab(kind, form[1]) != vocab:
            return f"scorer {name!r} ({type(sc).__name__}) has tables for {_form_vocab(kind, form[1])} tokens, the " \
                   f"log-probs {vocab}"
        if kind in seen:
            return f"scorers {seen[kind]!r} and {name!r} are both {kind!r}: the kernel holds one of each kind"
        seen[kind] = name
    return None


def unavailable(lp: torch.Tensor, scorers: Mapping[str, Any], topk: Optional[int]) -> Optional[str]:
    """Why the one-launch search cannot search ``lp`` (B, T, V) with these scorers and ``token_topk`` (None: it
    can)."""
    batch, _, vocab = lp.shape
    why = scorers_unavailable(scorers, vocab)
    if why is not None:
        return why
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


def _flag(t: torch.Tensor) -> torch.Tensor:
    """A bool table as bytes (the kernel compares them with 0)."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def _scorer_args(scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], states: Mapping[str, Any],
                 lp: torch.Tensor, beam: int, none_i: torch.Tensor, none_f: torch.Tensor
                 ) -> Tuple[List[Any], Dict[str, bool], float]:
    """The kernel's scorer arguments (after ``vocab``, in its order): the weights by kind, the final scores' output
    (B, K) and each kind's start states and ``native_form()`` tables (absent kinds and tables: the stand-ins
    ``none_i`` / ``none_f``, tensors of the search that are never read there); its constexpr flags; and the weight
    of the LengthBonus scorers, a bonus per token."""
    forms: Dict[str, Tuple[Dict[str, torch.Tensor], Any, float]] = {}
    extra = 0.0
    for name, sc in scorers.items():
        if isinstance(sc, LengthBonus):
            extra += float(weights[name])
            continue
        kind, tables = sc.native_form()  # type: ignore[union-attr, misc]  (checked by scorers_unavailable)
        forms[kind] = ({k: _flag(v.contiguous()) for k, v in tables.items()}, states[name], float(weights[name]))

    def table(kind: str, name: str, stand_in: torch.Tensor = none_i) -> Any:
        return forms[kind][0].get(name, stand_in) if kind in forms else stand_in

    def param(kind: str, name: str) -> int:  # an integer parameter (1 where the kind or the name is absent)
        value = forms[kind][0].get(name) if kind in forms else None
        return 1 if value is None else int(value)

    def iters(kind: str, name: str) -> int:  # halvings of a sorted key table
        return table(kind, name).numel().bit_length()

    def state(kind: str, stand_in: torch.Tensor = none_i) -> Any:
        return forms[kind][1] if kind in forms else stand_in

    wn_ints, wn_floats = state("word_ngram", (none_i, none_f))  # a WordNgramState: (N, 3) ints, (N, 3) floats
    if forms:
        wts = torch.cat([_scalar(forms[k][2] if k in forms else 0.0, lp) for k in FUSED_KINDS])
        final = torch.empty((lp.shape[0], beam), dtype=lp.dtype, device=lp.device)
    else:  # nothing to allocate for the search without scorers
        wts = final = none_f
    args = [wts, final,
            state("word_count", none_f), table("word_count", "closes"), table("word_count", "opens"),
            state("token_ngram"), table("token_ngram", "logp", none_f), table("token_ngram", "next_state"),
            table("token_ngram", "eos", none_f), param("token_ngram", "vocab"),
            state("lexicon"), table("lexicon", "next_base"), table("lexicon", "score_table", none_f),
            table("lexicon", "edge_keys"), table("lexicon", "edge_dst"), table("lexicon", "col_stay"),
            table("lexicon", "col_closes"), table("lexicon", "col_start"), table("lexicon", "is_word"),
            param("lexicon", "width"), table("lexicon", "edge_keys").numel(), iters("lexicon", "edge_keys"),
            wn_ints.contiguous(), wn_floats.contiguous()] + [
        table("word_ngram", name, none_f if name in ("la_next", "la", "node_floats", "row_floats", "backoff")
              else none_i)
        for name in ("trans", "la_next", "edge_keys", "edge_dst", "col_stay", "col_start", "col_is_end", "la",
                     "col_is_start", "token_slot", "node_word", "node_floats", "chain_keys", "keys", "next_state",
                     "row_floats", "backoff")] + [
        param("word_ngram", "width"), param("word_ngram", "order"), table("word_ngram", "edge_keys").numel(),
        iters("word_ngram", "edge_keys"), table("word_ngram", "keys").numel(), iters("word_ngram", "keys")]
    tk_hist, tk_bo = state("token_ngram_lookup", (none_i, none_f))  # an NgramState: (N, order-1), (N, order)
    no_history = tk_hist.numel() == 0  # an order-1 LM
    args += [none_i if no_history else tk_hist.contiguous(), tk_bo.contiguous(), 1 if no_history else tk_hist.shape[-1],
             table("token_ngram_lookup", "tok_to_lm")]
    args += [table("token_ngram_lookup", name, none_f if name[0] in "pb" else none_i)
             for name in ("prob_1", "bo_1", "keys_2", "prob_2", "bo_2", "keys_3", "prob_3", "bo_3", "keys_4", "prob_4")]
    args += [param("token_ngram_lookup", f"size_{k}") for k in (1, 2, 3)]
    args += [table("token_ngram_lookup", f"keys_{k}").numel() for k in (2, 3, 4)]
    args += [iters("token_ngram_lookup", f"keys_{k}") for k in (2, 3, 4)]
    args += [param("token_ngram_lookup", name) for name in ("blank_id", "sos_eos_id", "eos_word")]
    flags = dict(HAS_SCORERS=bool(forms), HAS_WC="word_count" in forms, HAS_TN="token_ngram" in forms,
                 HAS_LX="lexicon" in forms, LX_DENSE=param("lexicon", "dense") != 0, HAS_WN="word_ngram" in forms,
                 WN_DENSE=param("word_ngram", "dense") != 0, HAS_TK="token_ngram_lookup" in forms,
                 TK_ORDER=param("token_ngram_lookup", "order"))
    return args, flags, extra


def run(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, bonus: float, topk: Optional[int],
        min_logp: Optional[float], skip: Optional[float], scorers: Optional[Mapping[str, BatchScorer]] = None,
        weights: Optional[Mapping[str, float]] = None) -> Tuple[prefix_loop.Ranked, torch.Tensor]:
    """The search of ``lp`` (B, T, V), lengths (B,) long on its device, with ``scorers`` weighted by ``weights``
    (their kinds checked by :func:`scorers_unavailable`), as ranked tensors and the (B, T) input frame of each kept
    step (past an utterance's kept frames: unspecified, its paths read -1 there). No host sync."""
    import triton

    scorers, weights = scorers or {}, weights or {}
    batch, frames, vocab = lp.shape
    lp = lp.contiguous()
    n_cand = prefix_loop.candidate_count(vocab, topk)
    # init_state moves the scorers' tables to lp's device
    st, ints, states = prefix_loop.fresh_rows(batch, beam, lp.dtype, lp.device, scorers)
    scored, flags, extra = _scorer_args(scorers, weights, states, lp, beam, ints, st)
    bonus += extra
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
        lp.stride(0), lp.stride(1), frames, batch, beam, n_cand, vocab, *scored,
        HAS_FUSION=bonus != 0.0 or flags["HAS_SCORERS"], EVERY_TOKEN=every, TABLES=tables,
        BK=triton.next_power_of_2(beam), BC=triton.next_power_of_2(n_cand + 1), BV=triton.next_power_of_2(vocab),
        SENT_HASH_C=SENT_HASH, SENT_PARENT_C=SENT_PARENT, SENT_MIN_C=-(2 ** 63), HASH_MUL_C=HASH_MUL,
        num_warps=fused_step.NUM_WARPS, **flags)
    ctc = st[:, 2, :beam] + offset.to(lp.dtype)[:, None]  # + the skipped blank frames
    total = ctc + st[:, 3, :beam]
    if flags["HAS_SCORERS"]:
        total = total + scored[1]  # the scorers' weighted end-of-sentence scores
    total, order = total.topk(nbest, 1)  # best first
    paths = torch.empty((batch, nbest, frames), **long)
    backtrack[(batch,)](parents, tokens, order, count, paths, batch, beam, nbest, frames,
                        BN=triton.next_power_of_2(nbest))
    return prefix_loop.Ranked(total, ctc.gather(1, order), paths), frame


def search(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, bonus: float, topk: Optional[int],
           min_logp: Optional[float], skip: Optional[float], scorers: Optional[Mapping[str, BatchScorer]] = None,
           weights: Optional[Mapping[str, float]] = None) -> NBest:
    """:func:`run` converted to an :class:`NBest` (arguments as ``ctc_prefix._search_batch``'s)."""
    return prefix_loop.to_nbest(*run(lp, lengths, beam, nbest, bonus, topk, min_logp, skip, scorers, weights))
