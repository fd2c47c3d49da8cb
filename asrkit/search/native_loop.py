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
  ``arc_keys``/``arc_dst``, the per-state ``reach``/``pend`` bonuses and, where it is small enough, the step
  tables ``step_next``/``step_gain`` (a state is its row in them); for a union of lists (per-row hotwords) the
  ``block`` of each state (root_next holds each list's row) and ``row_start``, each utterance's start row.

Streaming (resumable search): a :class:`StreamState` owns one stream's search state in C++ (the beam's prefix
hashes and pb/pnb/fused scores, every scorer's per-hypothesis state, the emission history with frames counted
from the state's creation, the skipped-blank sum); it is created with the search's configuration (beam, the
active scorers with their weights, the length bonus, the dtype), freed by :meth:`StreamState.close` or when
collected. :func:`stream_advance` moves B states (each at its own position) over their next frames in one
call, :func:`stream_nbest` reads their N best (``final=True`` adds the scorers' end-of-sentence scores, as
the offline search does; ``False`` the partial ranking without them). The offline :func:`search` is the same C++ code: a
fresh state per utterance, advanced once, so one advance over all frames then ``final=True`` is the offline
result. A state's memory grows with its frames (at most ``beam`` emissions a searched frame): start a new one
at each endpoint.

Utterances are independent: with ``torch.get_num_threads() > 1`` they are spread over that many threads.
``ASRKIT_NATIVE=0`` in the environment turns the automatic choice off (e.g. to run a test suite through the
torch loop, the GPU path, on a CPU); ``native=True`` then fails saying so.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import weakref
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from asrkit.search import native_build
from asrkit.search.candidates import top_tokens
from asrkit.search.compaction import compact_frames
from asrkit.search.greedy import check_ctc_inputs
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
    "hotwords": (5, (("root_next", _I64), ("arc_keys", _I64), ("arc_dst", _I64), ("reach", _F32), ("pend", _F32),
                     ("step_next", _I64), ("step_gain", _F32), ("block", _I64), ("row_start", _I64)),
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


class _StreamDesc(ctypes.Structure):
    _fields_ = [("is_double", ctypes.c_int64), ("beam", ctypes.c_int64), ("n_scorers", ctypes.c_int64),
                ("bonus", ctypes.c_double), ("scorers", ctypes.POINTER(_ScorerDesc))]


class _AdvanceDesc(ctypes.Structure):
    _fields_ = [("states", ctypes.c_void_p)] + [
        (name, ctypes.c_int64) for name in ("is_double", "batch", "frames", "vocab", "steps", "n_cand", "threads",
                                            "select")] + [
        ("min_logp", ctypes.c_double), ("lp", ctypes.c_void_p), ("frame", ctypes.c_void_p), ("cval", ctypes.c_void_p),
        ("ctok", ctypes.c_void_p), ("offset", ctypes.c_void_p), ("lengths", ctypes.c_void_p)]


class _NBestDesc(ctypes.Structure):
    _fields_ = [("states", ctypes.c_void_p)] + [
        (name, ctypes.c_int64) for name in ("is_double", "batch", "nbest", "final", "width")] + [
        (name, ctypes.c_void_p) for name in ("total", "ctc", "tokens", "token_frames", "lengths")]


def unavailable(log_probs: torch.Tensor, lengths: torch.Tensor, scorers: Mapping[str, BatchScorer]) -> Optional[str]:
    """Why the native loop cannot run this search (None: it can). Builds the library on first use."""
    for what, t in (("log_probs", log_probs), ("lengths", lengths)):
        if t.device.type != "cpu":
            return f"{what} is on {t.device}, the native search runs on the CPU only"
    if log_probs.requires_grad and torch.is_grad_enabled():
        return "log_probs requires grad (the native search records no autograd graph)"
    return scorers_unavailable(scorers)


def scorers_unavailable(scorers: Mapping[str, BatchScorer]) -> Optional[str]:
    """Why the native loop cannot search with these scorers (None: it can), whatever the input; builds the
    library on first use (a streaming search decides with this before it has frames)."""
    if os.environ.get("ASRKIT_NATIVE", "").strip() == "0":
        return "turned off by ASRKIT_NATIVE=0"
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


def _library() -> ctypes.CDLL:
    lib = native_build.load()
    if lib is None:
        raise RuntimeError(f"the native library is unavailable: {native_build.build_error()}")
    return lib


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[int]:
    """Torch on one intra-op thread inside (the setup's ops are small, as in the torch loop; the C++ loop has its
    own threads); yields the caller's thread count, restored after."""
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield threads
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _scorer_array(scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], keep: List[torch.Tensor],
                  batch: int = 1) -> ctypes.Array:
    """The C descriptions of the scorers for ``batch`` utterances (a stream: 1), their tables moved to the CPU
    (as the torch loop's init_state does) and appended to ``keep``."""
    for sc in scorers.values():
        sc.init_state(batch, 1, torch.device("cpu"))
    descs = [_scorer_desc(name, sc, weights[name], keep) for name, sc in scorers.items()]  # type: ignore[arg-type]
    return (_ScorerDesc * max(1, len(descs)))(*descs)


def search(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, scorers: Mapping[str, BatchScorer],
           weights: Mapping[str, float], bonus: float, topk: Optional[int], min_logp: Optional[float],
           skip: Optional[float]) -> NBest:
    """The search of ctc_prefix._search_batch, natively (the caller checked :func:`unavailable`).

    lp: (B, T, V) float32 or float64 on the CPU; lengths: (B,) int64. Returns an NBest (B, nbest)."""
    lib = _library()
    with _one_torch_thread() as threads:
        lp = lp.contiguous()
        lengths = lengths.to(torch.long).contiguous()
        keep: List[torch.Tensor] = []
        arr = _scorer_array(scorers, weights, keep, lp.shape[0])
        frame, cval, ctok, offset, n_cand = _frames(lp, lengths, topk, skip)
        batch, frames, vocab = lp.shape
        steps = frame.shape[1]
        total = torch.empty((batch, nbest), dtype=lp.dtype)
        ctc = torch.empty((batch, nbest), dtype=lp.dtype)
        tokens = torch.empty((batch, nbest, steps), dtype=torch.long)
        token_frames = torch.empty((batch, nbest, steps), dtype=torch.long)
        out_len = torch.empty((batch, nbest), dtype=torch.long)
        desc = _SearchDesc(
            is_double=int(lp.dtype == torch.float64), batch=batch, frames=frames, vocab=vocab, steps=steps,
            n_cand=n_cand, beam=beam, nbest=nbest, n_scorers=len(scorers), threads=threads,
            select=int(_selects_natively(vocab, n_cand) and steps > 0), bonus=float(bonus),
            min_logp=-math.inf if min_logp is None else float(min_logp),
            lp=lp.data_ptr(), frame=frame.data_ptr(), cval=None if cval is None else cval.data_ptr(),
            ctok=None if ctok is None else ctok.data_ptr(), offset=offset.data_ptr(), scorers=arr,
            total=total.data_ptr(), ctc=ctc.data_ptr(), tokens=tokens.data_ptr(),
            token_frames=token_frames.data_ptr(), lengths=out_len.data_ptr())
        code = lib.asrkit_prefix_search(ctypes.byref(desc))
        if code != 0:
            raise RuntimeError(f"the native prefix search rejected its arguments (code {code})")
        return _trimmed(tokens, out_len, total, ctc, token_frames)


def _trimmed(tokens: torch.Tensor, lengths: torch.Tensor, total: torch.Tensor, ctc: torch.Tensor,
             token_frames: torch.Tensor) -> NBest:
    """An NBest whose rows are as wide as its longest hypothesis."""
    width = int(lengths.max()) if lengths.numel() else 0
    return NBest(tokens[..., :width].contiguous(), lengths, total, ctc, token_frames[..., :width].contiguous())



class StreamState:
    """One stream's native search state (a C++ handle; see the module docstring), at sentence start.

    beam: hypotheses kept; scorers/weights: the active scorers (every one with a native form) and their weights,
    bonus: the length bonus per token, as :func:`asrkit.search.interfaces.active_scorers` returns them; dtype:
    float32 or float64, the search's precision (log-probs given to :func:`stream_advance` are converted to it).
    The scorers' tables are kept alive by the state. Free it with :meth:`close` (or ``with``); collection frees
    it too. A closed state refuses every use.
    """

    def __init__(self, beam: int, scorers: Optional[Mapping[str, BatchScorer]] = None,
                 weights: Optional[Mapping[str, float]] = None, bonus: float = 0.0,
                 dtype: torch.dtype = torch.float32) -> None:
        scorers, weights = scorers or {}, weights or {}
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        missing = sorted(set(scorers) - set(weights))
        if missing:
            raise ValueError(f"scorer {missing[0]!r} has no weight")
        why = scorers_unavailable(scorers)
        if why is not None:
            raise ValueError(f"the native stream search cannot run: {why}")
        lib = _library()
        self._keep: List[torch.Tensor] = []  # the scorers' tables: the C++ state reads them
        arr = _scorer_array(scorers, weights, self._keep)
        desc = _StreamDesc(is_double=int(dtype == torch.float64), beam=beam, n_scorers=len(scorers),
                           bonus=float(bonus), scorers=arr)
        handle = lib.asrkit_stream_create(ctypes.byref(desc))
        if not handle:
            raise RuntimeError("the native library refused to create a stream state")
        self.beam, self.dtype, self.vocab = beam, dtype, 0  # vocab: V of the advances so far (0: none)
        self._handle: int = handle
        self._lib = lib  # the build that made the handle serves it (native_build.reset may load another)
        self._free = weakref.finalize(self, lib.asrkit_stream_free, handle)

    @property
    def closed(self) -> bool:
        return not self._free.alive

    def close(self) -> None:
        """Free the C++ state (idempotent)."""
        self._free()

    def __enter__(self) -> "StreamState":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def handle(self) -> int:
        """The C++ handle; ValueError once closed."""
        if self.closed:
            raise ValueError("this StreamState is closed: its native state was freed")
        return self._handle

    @property
    def frames(self) -> int:
        """Input frames advanced over since the state was created."""
        return int(self._lib.asrkit_stream_frames(self.handle))


def live_streams() -> int:
    """C++ stream states created and not yet freed, in this process (a leak check)."""
    return int(_library().asrkit_stream_live())


def _handles(states: Sequence[StreamState], what: str) -> Tuple[ctypes.Array, torch.dtype, ctypes.CDLL]:
    """The C array of the states' handles, their common dtype and library; ValueError naming the bad state."""
    if not states:
        raise ValueError(f"{what}: no stream states given")
    seen: Dict[int, int] = {}
    for b, st in enumerate(states):
        if not isinstance(st, StreamState):
            raise ValueError(f"{what}: state {b} is a {type(st).__name__}, not a native_loop.StreamState")
        if st.closed:
            raise ValueError(f"{what}: state {b} is closed: its native state was freed")
        if id(st) in seen:
            raise ValueError(f"{what}: state {b} is state {seen[id(st)]} again (each stream once per call)")
        seen[id(st)] = b
        if st.dtype != states[0].dtype:
            raise ValueError(f"{what}: state {b} searches in {st.dtype}, state 0 in {states[0].dtype}: "
                             f"one call takes one dtype")
    return (ctypes.c_void_p * len(states))(*(st.handle for st in states)), states[0].dtype, states[0]._lib


def _raise_on(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what}: the native library rejected its arguments (code {code})")


def stream_advance(states: Sequence[StreamState], lp: torch.Tensor, lengths: torch.Tensor, *,
                   topk: Optional[int] = 8, min_logp: Optional[float] = -12.0, skip: Optional[float] = 0.999) -> None:
    """Advance B streams over their next frames, in place: row b of lp (B, T, V) (log-probs on the CPU, blank
    0) holds state b's next ``lengths[b]`` frames (0 leaves it as it is). The streams may be at different
    positions. Pruning as in :func:`asrkit.search.ctc_prefix_beam_search` (token_topk, token_min_logp,
    blank_skip_threshold; all None: the exact search); each is per frame, so any split of a stream's frames
    into chunks gives the same search. Streams are spread over ``torch.get_num_threads()`` threads."""
    arr, dtype, lib = _handles(states, "stream_advance")
    if lp.device.type != "cpu" or lengths.device.type != "cpu":
        raise ValueError(f"stream_advance: log_probs and lengths must be on the CPU, got {lp.device} and "
                         f"{lengths.device}")
    check_ctc_inputs(lp, lengths)
    batch, frames, vocab = lp.shape
    if batch != len(states):
        raise ValueError(f"stream_advance: log_probs has {batch} rows for {len(states)} stream states")
    if topk is not None and topk < 1:
        raise ValueError(f"token_topk must be >= 1 or None, got {topk}")
    if skip is not None and not 0.0 < skip < 1.0:
        raise ValueError(f"blank_skip_threshold must be in (0, 1) or None, got {skip}")
    for b, st in enumerate(states):
        if st.vocab and st.vocab != vocab:
            raise ValueError(f"stream_advance: state {b} was advanced over {st.vocab} tokens, log_probs row {b} "
                             f"has {vocab}")
    with _one_torch_thread() as threads:
        lp = lp.detach().to(dtype).contiguous()
        lengths = lengths.to(torch.long).contiguous()
        frame, cval, ctok, offset, n_cand = _frames(lp, lengths, topk, skip)
        steps = frame.shape[1]
        desc = _AdvanceDesc(
            states=ctypes.cast(arr, ctypes.c_void_p), is_double=int(dtype == torch.float64), batch=batch,
            frames=frames, vocab=vocab, steps=steps, n_cand=n_cand, threads=threads,
            select=int(_selects_natively(vocab, n_cand) and steps > 0),
            min_logp=-math.inf if min_logp is None else float(min_logp), lp=lp.data_ptr(), frame=frame.data_ptr(),
            cval=None if cval is None else cval.data_ptr(), ctok=None if ctok is None else ctok.data_ptr(),
            offset=offset.data_ptr(), lengths=lengths.data_ptr())
        _raise_on(lib.asrkit_stream_advance(ctypes.byref(desc)), "stream_advance")
    for st in states:
        st.vocab = vocab


def stream_nbest(states: Sequence[StreamState], nbest: int, final: bool) -> NBest:
    """The N best hypotheses of each state so far, an NBest (B, nbest), best first; token_frames count from the
    state's creation. final=True: + the scorers' end-of-sentence scores (the offline search's result after all
    frames); False: the partial ranking, without them. The states are not changed."""
    arr, dtype, lib = _handles(states, "stream_nbest")
    beam = min(st.beam for st in states)
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
    width = int(lib.asrkit_stream_width(arr, len(states)))
    batch = len(states)
    total = torch.empty((batch, nbest), dtype=dtype)
    ctc = torch.empty((batch, nbest), dtype=dtype)
    tokens = torch.empty((batch, nbest, width), dtype=torch.long)
    token_frames = torch.empty((batch, nbest, width), dtype=torch.long)
    lengths = torch.empty((batch, nbest), dtype=torch.long)
    desc = _NBestDesc(states=ctypes.cast(arr, ctypes.c_void_p), is_double=int(dtype == torch.float64), batch=batch,
                      nbest=nbest, final=int(final), width=width, total=total.data_ptr(), ctc=ctc.data_ptr(),
                      tokens=tokens.data_ptr(), token_frames=token_frames.data_ptr(), lengths=lengths.data_ptr())
    _raise_on(lib.asrkit_stream_nbest(ctypes.byref(desc)), "stream_nbest")
    return _trimmed(tokens, lengths, total, ctc, token_frames)
