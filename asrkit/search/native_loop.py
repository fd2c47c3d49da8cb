"""The native (C++) CPU frame loop of :func:`asrkit.search.ctc_prefix_beam_search`.

On the CPU the torch frame loop is dispatch-bound: a frame costs about 25 small ops without an LM and
~180 with a word LM, each a few microseconds whatever its size. This module runs the same search (the same
candidates, merges, pruning, fusion and final scores; see :mod:`asrkit.search.ctc_prefix`) in one C++ call
per batch (``native/prefix_search.cpp``, built and loaded by :mod:`asrkit.search.native_build`). Python
keeps the per-batch setup that is already vectorised: the blank-frame compaction and, for vocabularies of
320 tokens and more, the (B, T', C) candidate table of :func:`asrkit.search.candidates.top_tokens` (below
that, top_tokens is a torch.topk per row, and the C++ loop picks the same candidates faster).

Scorers meet :class:`asrkit.search.interfaces.NativeScorer`: ``native_form()`` gives a kind and named
tables (plain CPU tensors, read through their ``data_ptr()``; dtypes are checked, never converted):

- ``word_ngram`` (:class:`asrkit.lm.word_ngram.WordNgramScorer`, look-ahead, ``lexicon=`` and ``unk_offset``
  included): the letter trie (dense ``trans``/``la_next``, or sorted ``edge_keys``/``edge_dst`` with the
  per-column defaults) and the LM's context-state tables (``chain_keys``, ``keys``, ``next_state``,
  ``row_floats``, ``backoff``);
- ``lexicon`` (:class:`asrkit.search.lexicon.LexiconScorer`): the word-list trie, dense or sorted edges;
- ``token_ngram`` (:class:`asrkit.lm.ngram.NgramScorer`, dense tables only);
- ``word_count`` (:class:`asrkit.search.scorers.WordCount`, the word bonus beside a word LM): per token, whether
  it closes the partial word and whether a word is open after it;
- ``hotwords`` (:class:`asrkit.search.hotwords.HotwordScorer`): the automaton's ``root_next``, its sorted
  ``arc_keys``/``arc_dst`` and the per-state ``reach``/``pend`` bonuses.

Utterances are independent: with ``torch.get_num_threads() > 1`` they are spread over that many threads.
``ASRKIT_NATIVE=0`` in the environment turns the automatic choice off (e.g. to run a test suite through the
torch loop, the GPU path, on a CPU); ``native=True`` then fails saying so.
"""
from __future__ import annotations

import ctypes
import math
import os
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from asrkit.search import native_build
from asrkit.search.candidates import top_tokens
from asrkit.search.compaction import compact_frames
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BLANK_ID, BatchScorer, NativeScorer

_MAX_TABLES = 20  # kMaxTables in native/api.h
_NATIVE_SELECT_MAX_VOCAB = 320  # candidates._MIN_VOCAB: below it top_tokens is a plain torch.topk per row
_I32, _I64, _F32, _BOOL = torch.int32, torch.int64, torch.float32, torch.bool
# kind -> (C++ id, tables in the C++ order with their dtypes, integer parameters in order)
_KINDS: Dict[str, Tuple[int, Tuple[Tuple[str, torch.dtype], ...], Tuple[str, ...]]] = {
    "word_ngram": (1, (("trans", _I32), ("la_next", _F32), ("edge_keys", _I64), ("edge_dst", _I64),
                       ("col_stay", _BOOL), ("col_start", _I64), ("col_is_end", _BOOL), ("la", _F32),
                       ("col_is_start", _BOOL), ("token_slot", _I64), ("node_word", _I64), ("node_floats", _F32),
                       ("chain_keys", _I64), ("keys", _I64), ("next_state", _I64), ("row_floats", _F32),
                       ("backoff", _F32)),
                   ("dense", "width", "order", "start_state")),
    "lexicon": (2, (("next_base", _I64), ("score_table", _F32), ("edge_keys", _I64), ("edge_dst", _I64),
                    ("col_stay", _BOOL), ("col_closes", _BOOL), ("col_start", _I64), ("is_word", _BOOL)),
                ("dense", "width")),
    "token_ngram": (3, (("logp", _F32), ("next_state", _I32), ("eos", _F32)), ("vocab", "start_state")),
    "word_count": (4, (("closes", _BOOL), ("opens", _I64)), ()),
    "hotwords": (5, (("root_next", _I64), ("arc_keys", _I64), ("arc_dst", _I64), ("reach", _F32), ("pend", _F32)),
                 ("vocab", "start_state")),
}


class _ScorerDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("weight", ctypes.c_double),
                ("tables", ctypes.c_void_p * _MAX_TABLES), ("sizes", ctypes.c_int64 * _MAX_TABLES),
                ("iparams", ctypes.c_int64 * 8)]


class _SearchDesc(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("is_double", "batch", "frames", "vocab", "steps", "n_cand",
                                                    "beam", "nbest", "n_scorers", "threads", "select")] + [
        ("bonus", ctypes.c_double), ("min_logp", ctypes.c_double),
        ("lp", ctypes.c_void_p), ("frame", ctypes.c_void_p), ("cval", ctypes.c_void_p), ("ctok", ctypes.c_void_p),
        ("offset", ctypes.c_void_p), ("scorers", ctypes.POINTER(_ScorerDesc)),
        ("total", ctypes.c_void_p), ("ctc", ctypes.c_void_p), ("tokens", ctypes.c_void_p),
        ("token_frames", ctypes.c_void_p), ("lengths", ctypes.c_void_p)]


def unavailable(log_probs: torch.Tensor, lengths: torch.Tensor, scorers: Mapping[str, BatchScorer]) -> Optional[str]:
    """Why the native loop cannot run this search (None: it can). Builds the library on first use."""
    if os.environ.get("ASRKIT_NATIVE", "").strip() == "0":
        return "turned off by ASRKIT_NATIVE=0"
    for what, t in (("log_probs", log_probs), ("lengths", lengths)):
        if t.device.type != "cpu":
            return f"{what} is on {t.device}, the native search runs on the CPU only"
    if log_probs.requires_grad and torch.is_grad_enabled():
        return "log_probs requires grad (the native search records no autograd graph)"
    for name, sc in scorers.items():
        if not isinstance(sc, NativeScorer):
            return f"scorer {name!r} ({type(sc).__name__}) has no native form (NativeScorer protocol)"
        form = sc.native_form()
        if form is None:
            return f"scorer {name!r} ({type(sc).__name__}) has no native form in this configuration"
        if form[0] not in _KINDS:
            return f"scorer {name!r}: unknown native kind {form[0]!r}"
    if native_build.load() is None:
        return f"the native library is unavailable: {native_build.build_error()}"
    return None


def _scorer_desc(name: str, sc: NativeScorer, weight: float, keep: List[torch.Tensor]) -> _ScorerDesc:
    """The C description of one scorer; its tensors are appended to ``keep`` (alive during the call)."""
    form = sc.native_form()
    if form is None:
        raise ValueError(f"scorer {name!r} has no native form")
    kind, tables = form
    kind_id, layout, params = _KINDS[kind]
    desc = _ScorerDesc(kind=kind_id, weight=float(weight))
    for j, (table, dtype) in enumerate(layout):
        t = tables.get(table)
        if t is None:  # a table of the other trie layout (dense or sparse): never read
            continue
        if t.dtype != dtype or t.device.type != "cpu":
            raise TypeError(f"scorer {name!r} ({kind}): table {table!r} is {t.dtype} on {t.device}, "
                            f"the native search needs {dtype} on the CPU")
        t = t.contiguous()
        keep.append(t)
        desc.tables[j] = t.data_ptr()
        desc.sizes[j] = t.numel()
    for j, param in enumerate(params):
        desc.iparams[j] = int(tables[param])
    return desc


def _selects_natively(vocab: int, n_cand: int) -> bool:
    """Whether the C++ loop picks each frame's candidates itself: small vocabularies, where
    candidates.top_tokens is a torch.topk per row (~0.4 us a row of 31 tokens, a fifth of a char word-LM
    batch); C++ picks the same tokens by insertion into a sorted buffer (select_fast), or replays torch.topk's
    two selections when a tie makes the order matter (select_tokens)."""
    return n_cand < vocab - 1 and (vocab < _NATIVE_SELECT_MAX_VOCAB or (n_cand + 1) ** 2 * 4 > vocab)


def _frames(lp: torch.Tensor, lengths: torch.Tensor, topk: Optional[int], skip_threshold: Optional[float]
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], torch.Tensor, int]:
    """Compacted frames (B, T') (-1 after the last), the candidate table (B, T', C) values and ids (None:
    every non-blank token, read from the input), the skipped frames' log P(blank) sums (B,) and C.

    The compaction is ctc_prefix._Frames' (:func:`asrkit.search.compaction.compact_frames`)."""
    batch, frames, vocab = lp.shape
    frame, _, offset, identity = compact_frames(lp, lengths, BLANK_ID, skip_threshold)
    width = frame.shape[1]
    n_cand = vocab - 1 if topk is None else max(1, min(topk, vocab - 1))
    if n_cand == vocab - 1 or width == 0 or _selects_natively(vocab, n_cand):
        return frame, None, None, offset, n_cand  # every token a candidate, or picked in C++: it reads the rows
    rows = None if identity else (torch.arange(batch)[:, None] * frames + frame.clamp(min=0)).flatten()
    cval, ctok = top_tokens(lp.reshape(batch * frames, vocab), rows, n_cand, BLANK_ID)  # (B*T', C)
    return frame, cval.contiguous(), ctok.contiguous(), offset, n_cand


def search(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, scorers: Mapping[str, BatchScorer],
           weights: Mapping[str, float], bonus: float, topk: Optional[int], min_logp: Optional[float],
           skip: Optional[float]) -> NBest:
    """The search of ctc_prefix._search_batch, natively (the caller checked :func:`unavailable`).

    lp: (B, T, V) float32 or float64 on the CPU; lengths: (B,) int64. Returns an NBest (B, nbest)."""
    lib = native_build.load()
    if lib is None:
        raise RuntimeError(f"the native library is unavailable: {native_build.build_error()}")
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)  # the setup's ops are small (as in the torch loop); the C++ loop has its threads
    try:
        lp = lp.contiguous()
        lengths = lengths.to(torch.long).contiguous()
        for sc in scorers.values():
            sc.init_state(1, 1, torch.device("cpu"))  # moves the scorer's tables to the CPU, as the torch loop does
        frame, cval, ctok, offset, n_cand = _frames(lp, lengths, topk, skip)
        batch, frames, vocab = lp.shape
        steps = frame.shape[1]
        keep: List[torch.Tensor] = []
        descs = [_scorer_desc(name, sc, weights[name], keep) for name, sc in scorers.items()]  # type: ignore[arg-type]
        arr = (_ScorerDesc * max(1, len(descs)))(*descs)
        total = torch.empty((batch, nbest), dtype=lp.dtype)
        ctc = torch.empty((batch, nbest), dtype=lp.dtype)
        tokens = torch.empty((batch, nbest, steps), dtype=torch.long)
        token_frames = torch.empty((batch, nbest, steps), dtype=torch.long)
        out_len = torch.empty((batch, nbest), dtype=torch.long)
        desc = _SearchDesc(
            is_double=int(lp.dtype == torch.float64), batch=batch, frames=frames, vocab=vocab, steps=steps,
            n_cand=n_cand, beam=beam, nbest=nbest, n_scorers=len(descs), threads=threads,
            select=int(_selects_natively(vocab, n_cand) and steps > 0), bonus=float(bonus),
            min_logp=-math.inf if min_logp is None else float(min_logp),
            lp=lp.data_ptr(), frame=frame.data_ptr(), cval=None if cval is None else cval.data_ptr(),
            ctok=None if ctok is None else ctok.data_ptr(), offset=offset.data_ptr(), scorers=arr,
            total=total.data_ptr(), ctc=ctc.data_ptr(), tokens=tokens.data_ptr(),
            token_frames=token_frames.data_ptr(), lengths=out_len.data_ptr())
        code = lib.asrkit_prefix_search(ctypes.byref(desc))
        if code != 0:
            raise RuntimeError(f"the native prefix search rejected its arguments (code {code})")
        width = int(out_len.max()) if out_len.numel() else 0
        return NBest(tokens[..., :width].contiguous(), out_len, total, ctc, token_frames[..., :width].contiguous())
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

