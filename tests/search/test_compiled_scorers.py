"""Scorers compiled by torch.compile in the captured loop (asrkit.search.compiled_scorers, ASRKIT_COMPILE_SCORERS=1),
run on the CPU (inductor's C++ backend): the same n-best as the uncompiled loop, and no host sync in the loop.

One test on the CPU (compiling takes seconds); on a CUDA device (tools/bench/run_cuda_checks.sh) the same with the
loop captured after the compiling run. tools/bench/bench_gpu_search.py times it ("compiled scorers" rows).
"""
from __future__ import annotations

import copy
import importlib.util
import shutil
from typing import List

import pytest
import torch

import asrkit.search.prefix_graph as prefix_graph
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import ctc_prefix_beam_search
from asrkit.search.compiled_scorers import CompiledScorer
from host_sync import no_host_sync
from test_resumable_search import assert_same_lists, fusion, inputs, word_lm  # noqa: F401


def _inductor_missing() -> str:
    """Why inductor cannot compile on this CPU ('' if it can)."""
    if importlib.util.find_spec("torch._inductor") is None:
        return "this torch has no inductor (torch.compile's backend)"
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "torch.compile's CPU backend (inductor) needs a C++ compiler (g++ / c++): none on PATH"
    return ""


def _check(word_lm, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """Two batches of one bucket searched on ``device`` with the scorers compiled (on CUDA: the loop captured
    after the eager run that compiles them) give the n-best of the uncompiled loop on the CPU."""
    why = _inductor_missing()
    if why:
        pytest.skip(why)
    tokens, _ = inputs("word_ngram", 1, 1, seed=0)
    # the word 3-gram alone (one scorer: compiling takes seconds a function) and a constant length bonus
    lm = fusion("word_ngram", word_lm, tokens)["scorers"]["lm"]
    kw = dict(beam=5, nbest=3, native=False, weights={"lm": 0.8, "length_bonus": 0.5})
    batches = [(inputs("word_ngram", 3, 40, seed=seed)[1], torch.tensor(lengths))
               for seed, lengths in ((1, [40, 31, 40]), (2, [38, 40, 12]))]
    prefix_graph.clear()
    want = [ctc_prefix_beam_search(lp, lens, cuda_graph=True, scorers={"lm": lm}, **kw).to_lists()
            for lp, lens in batches]
    assert sum(len(h[0].tokens) for w in want for h in w if h) > 10  # the search emits: a real comparison
    assert [e.scorers["lm"] for e in prefix_graph._CACHE.values()] == [lm]  # off by default: the scorer itself
    prefix_graph.clear()
    ran: List[str] = []
    monkeypatch.setattr(prefix_graph, "COMPILE_SCORERS", True)
    # the eager run that compiles them and the loop after it: no host sync in either
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    try:
        # two batches of one bucket: the second after the first's warm-up and restart
        scorers = {"lm": copy.deepcopy(lm)} if device != "cpu" else {"lm": lm}
        got = [ctc_prefix_beam_search(lp.to(device), lens.to(device), cuda_graph=True, scorers=scorers,
                                      **kw).to_lists() for lp, lens in batches]
        (entry,) = prefix_graph._CACHE.values()
        assert all(isinstance(sc, CompiledScorer) for sc in entry.scorers.values())
        assert entry.runs == 2 and ran == ["frame_loop"] * (3 if device == "cpu" else 2)  # + the capture on CUDA
        assert (entry.graph is not None) == (device != "cpu")
    finally:
        prefix_graph.clear()
    for g, w in zip(got, want):
        assert_same_lists(g, w, tol=1e-4)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
def test_compiled_word_lm_scorer_gives_the_uncompiled_nbest_without_host_sync(word_lm,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _check(word_lm, monkeypatch, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
def test_compiled_word_lm_scorer_in_the_captured_loop_on_cuda(word_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches a compilation inside the capture, or compiled kernels that the graph does not replay right.
    _check(word_lm, monkeypatch, "cuda")
