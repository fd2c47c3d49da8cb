"""The torch frame loop captured once per bucket of batch shapes and replayed for each batch of it (the GPU path).

On a GPU the eager loop is host bound: each frame step launches a few dozen tiny kernels, and the host's time to
launch them, not the GPU's to run them, sets the pace. Here a batch's tables are built eagerly (compaction and
candidate pre-selection: host syncs allowed there), bucketed (:class:`~asrkit.search.prefix_loop.FrameTables`:
steps padded, every per-frame branch data-driven) and copied into the tensors that a captured CUDA graph of the
whole loop (every frame step, then the end-of-sentence scores, the sort and the backtracking) reads; the graph is
replayed: one launch per batch. The first batch of a bucket pays the capture (about one eager run of the host);
later ones pay only the copies and the replay.

A bucket is (device, dtype, batch size, vocabulary, beam, candidates per frame, padded steps, blank skipping,
N-best size, length bonus, and each scorer object with its weight): a scorer is kept alive by the cache entry
that captured it, so an entry is never reused for another object at the same address. The
:data:`MAX_ENTRIES` most recently used buckets are kept (each holds its batch's tables on the device);
:func:`clear` drops them.

Elsewhere than on CUDA (the CPU, in tests) the same bucketed tables, the same refills and the same loop run
eagerly, so everything but the capture itself is tested without a GPU; the capture was checked on GPUs by
``tools/bench/run_cuda_checks.sh``.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Mapping, Optional, Tuple

import torch

from asrkit.search import compiled_scorers, fused_search, fused_step, prefix_loop
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BatchScorer

MAX_ENTRIES = 8
# The CTC arithmetic of a step as one Triton kernel (asrkit.search.fused_step) where it can run (CUDA): 1.1-2.8x the
# captured torch step on an H100 (docs/benchmarks.md); ASRKIT_FUSED_STEP=0 turns it off.
FUSED_STEP = os.environ.get("ASRKIT_FUSED_STEP", "1") != "0"
# Without scorers or with table scorers only, the whole search as one launch over the log-probs
# (asrkit.search.fused_search: no host-built tables, no capture); ASRKIT_FUSED_SEARCH=0 keeps the fused step on the
# tables (the benchmark times both).
FUSED_SEARCH = os.environ.get("ASRKIT_FUSED_SEARCH", "1") != "0"
# The scorers' per-step calls through torch.compile (asrkit.search.compiled_scorers) where the loop is captured
# (COMPILE_DEVICES): on by default, ASRKIT_COMPILE_SCORERS=0 turns it off. Elsewhere (the CPU, in tests) the loop
# runs eagerly once a batch, and compiling would only cost time.
COMPILE_SCORERS = compiled_scorers.env_switch(os.environ.get("ASRKIT_COMPILE_SCORERS"))
COMPILE_DEVICES = ("cuda",)


class _Entry:
    """One bucket's captured loop: its beam and tables (the graph's inputs), the ranked result (its outputs)."""

    def __init__(self, s: prefix_loop.BeamState, fr: prefix_loop.FrameTables, scorers: Mapping[str, BatchScorer],
                 weights: Mapping[str, float], nbest: int, warm_up: Optional[prefix_loop.BeamRows] = None) -> None:
        self.s, self.fr = s, fr
        # compiled scorers: a start state to restart from after the eager run that compiles them before the capture
        self.warm_up = warm_up
        self.scorers, self.weights, self.nbest = dict(scorers), dict(weights), nbest
        self.graph: Optional[Any] = None
        self.ranked: Optional[prefix_loop.Ranked] = None
        self.runs = 0

    def _compile(self) -> None:
        """The first run of compiled scorers: the loop once eagerly, which compiles them (a CUDA capture must not),
        then the beam and the scorers' states back at the start."""
        s = self.s
        prefix_loop.frame_loop(s, self.fr, self.scorers, self.weights)
        s.restart(self.warm_up)
        s.states = dict(s.start_states)
        self.warm_up = None

    def run(self) -> prefix_loop.Ranked:
        """Search the tables now loaded: replay the graph (captured on the first run), or run the loop eagerly."""
        s, fr = self.s, self.fr
        self.runs += 1
        if self.warm_up is not None:
            self._compile()
        if not s.st.is_cuda:
            s.states = dict(s.start_states)
            prefix_loop.frame_loop(s, fr, self.scorers, self.weights)
            self.ranked = prefix_loop.rank(s, fr, self.scorers, self.weights, self.nbest)
        elif self.graph is None:
            torch.cuda.synchronize(s.st.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                prefix_loop.frame_loop(s, fr, self.scorers, self.weights)
                self.ranked = prefix_loop.rank(s, fr, self.scorers, self.weights, self.nbest)
            self.graph = graph
            graph.replay()
        else:
            self.graph.replay()
        assert self.ranked is not None
        return self.ranked


_CACHE: "OrderedDict[Tuple[Any, ...], _Entry]" = OrderedDict()


def clear() -> None:
    """Drop every captured loop (and the device memory its tables hold)."""
    _CACHE.clear()


def cached_entries() -> int:
    return len(_CACHE)


def search(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int, scorers: Mapping[str, BatchScorer],
           weights: Mapping[str, float], bonus: float, topk: Optional[int], min_logp: Optional[float],
           skip: Optional[float]) -> NBest:
    """One batch through its bucket's captured loop (arguments as ``ctc_prefix._search_batch``'s), or through the
    one-launch search where it runs (:data:`FUSED_SEARCH`)."""
    if FUSED_STEP and FUSED_SEARCH and fused_search.unavailable(lp, scorers, topk) is None:
        return fused_search.search(lp, lengths, beam, nbest, bonus, topk, min_logp, skip, scorers, weights)
    fr = prefix_loop.tables(lp, lengths, beam, scorers, bonus, topk, min_logp, skip, bucketed=True)
    start = prefix_loop.fresh_rows(lp.shape[0], beam, lp.dtype, lp.device, scorers)
    compile_now = (COMPILE_SCORERS and lp.device.type in COMPILE_DEVICES
                   and any(compiled_scorers.compilable(sc) for sc in scorers.values()))
    key = (FUSED_STEP, lp.device, lp.dtype, lp.shape[0], lp.shape[2], beam, fr.n_cand, fr.steps, skip is not None, nbest, bonus,
           tuple((name, id(sc), float(weights[name])) for name, sc in scorers.items()), compile_now)
    entry = _CACHE.get(key)
    if entry is None:
        s = prefix_loop.beam_state(fr, lp, beam, scorers, bonus, start)
        s.fused_step = FUSED_STEP and not s.wide and fused_step.unavailable(lp.device) is None
        if compile_now:
            warm_up = prefix_loop.fresh_rows(lp.shape[0], beam, lp.dtype, lp.device, scorers)
            entry = _Entry(s, fr, compiled_scorers.compile_scorers(scorers), weights, nbest, warm_up)
        else:
            entry = _Entry(s, fr, scorers, weights, nbest)
        _CACHE[key] = entry
        while len(_CACHE) > MAX_ENTRIES:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
        entry.fr.load(fr)
        entry.s.restart(start)
    ranked = entry.run()
    # The entry's outputs are overwritten by its next batch: the result gets its own tensors.
    return prefix_loop.to_nbest(prefix_loop.Ranked(*(t.clone() for t in ranked)), fr.frame)
