"""Scorers compiled by torch.compile in the captured loop (asrkit.search.compiled_scorers), run on the CPU
(inductor's C++ backend) by letting prefix_graph compile there too (``COMPILE_DEVICES``; by default only CUDA).

The reference is the same loop with the scorers left eager: equal n-best over batch sizes 1, 3, 7 and 16, equal
scores and states call by call, and one compilation per scorer function for all those batch sizes (with
``dynamic=False`` each batch size compiled again). Compiling takes seconds a function: one module fixture compiles
the word 3-gram's and the token 2-gram's functions once and the tests read what it recorded. The bound, the eager
fallback and the switch need no compiling. On a CUDA device (tools/bench/run_cuda_checks.sh) the default path:
compiled, captured after the compiling run, equal to the CPU. tools/bench/bench_gpu_search.py times it.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import warnings
from typing import Dict, List, NamedTuple

import pytest
import torch

import asrkit.search.compiled_scorers as compiled_scorers
import asrkit.search.prefix_graph as prefix_graph
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import ctc_prefix_beam_search
from asrkit.search.compiled_scorers import CompiledFunction, CompiledScorer, compile_scorers, env_switch
from asrkit.search.hypotheses import Hypothesis
from host_sync import no_host_sync
from test_resumable_search import assert_same_lists, fusion, inputs, tiny_lstm, word_lm  # noqa: F401

BATCHES = (1, 3, 7, 16)
KINDS = ("word_ngram", "token_ngram")
FRAMES = 30
FILTERS = ("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")


@pytest.fixture(autouse=True)
def captured_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The captured loop, where compiled scorers run, even for scorers the one-launch search takes."""
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", False)


def _inductor_missing() -> str:
    """Why inductor cannot compile on this CPU ('' if it can)."""
    if importlib.util.find_spec("torch._inductor") is None:
        return "this torch has no inductor (torch.compile's backend)"
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "torch.compile's CPU backend (inductor) needs a C++ compiler (g++ / c++): none on PATH"
    return ""


def _setup(kind: str, word_lm) -> Dict:
    """The LM of ``kind`` alone (one scorer: compiling takes seconds a function), a constant length bonus."""
    tokens, _ = inputs(kind, 1, 1, seed=0)
    lm = fusion(kind, word_lm, tokens)["scorers"]["lm"]
    return dict(scorers={"lm": lm}, beam=5, nbest=3, native=False, weights={"lm": 0.8, "length_bonus": 0.5})


def _batch(kind: str, b: int, device: str = "cpu"):
    lp = inputs(kind, b, FRAMES, seed=b)[1]
    lengths = torch.tensor([FRAMES - (i * 7) % 20 for i in range(b)])  # uneven lengths
    return lp.to(device), lengths.to(device)


def _search(kind: str, b: int, kw: Dict, device: str = "cpu", **extra) -> List[List[Hypothesis]]:
    return ctc_prefix_beam_search(*_batch(kind, b, device), cuda_graph=True, **kw, **extra).to_lists()


def _compiles(scorer) -> Dict[str, int]:
    """Graphs compiled so far for the scorer's class functions."""
    return {m: compiled_scorers.compiled(getattr(type(scorer), m)).compiles for m in ("score", "select_state")}


class Runs(NamedTuple):
    got: Dict[str, List]  # kind -> per batch size: the n-best with the scorers compiled
    want: Dict[str, List]  # kind -> per batch size: the n-best with the scorers eager
    compiles: Dict[str, List[Dict[str, int]]]  # kind -> after each batch size, then after the direct calls
    wrapped: Dict[str, bool]  # kind -> the cache entry held CompiledScorers
    captured: Dict[str, bool]  # kind -> the cache entry holds a CUDA graph (never on the CPU)
    direct: Dict[str, List]  # kind -> (compiled, eager) outputs of score and select_state called directly
    ran: List[str]  # frame loops run under the no-host-sync guard


def _direct(scorer, vocab: int, n_cand: int) -> List:
    """score and select_state of the compiled and the eager scorer over a few random steps (batch 2, beam 4)."""
    wrapped, gen, out = CompiledScorer(scorer), torch.Generator().manual_seed(0), []
    state = scorer.init_state(2, 4, torch.device("cpu"))
    for _ in range(4):
        tokens = torch.randint(0, vocab, (8, n_cand), generator=gen)
        out.append((wrapped.score(state, tokens), scorer.score(state, tokens)))
        index, ext = torch.randint(0, 8, (8,), generator=gen), torch.randint(-1, vocab, (8,), generator=gen)
        new, want = wrapped.select_state(state, index, ext), scorer.select_state(state, index, ext)
        out.append((new, want))
        state = want
    return out


@pytest.fixture(scope="module")
def runs(word_lm) -> Runs:
    why = _inductor_missing()
    if why:
        pytest.skip(why)
    got, want, compiles, wrapped, captured, direct, ran = {}, {}, {}, {}, {}, {}, []
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        for f in FILTERS:
            warnings.filterwarnings("ignore", message=f.split(":", 1)[1])
        compiled_scorers.compiled.cache_clear()  # counts from 0
        torch._dynamo.reset()
        mp.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
        mp.setattr(prefix_graph, "FUSED_SEARCH", False)  # see captured_loop
        for kind in KINDS:
            kw = _setup(kind, word_lm)
            lm = kw["scorers"]["lm"]
            got[kind], want[kind], compiles[kind] = [], [], []
            for b in BATCHES:
                prefix_graph.clear()
                mp.setattr(prefix_graph, "COMPILE_DEVICES", ())
                want[kind].append(_search(kind, b, kw))
                mp.setattr(prefix_graph, "COMPILE_DEVICES", ("cpu",))
                got[kind].append(_search(kind, b, kw))
                compiles[kind].append(_compiles(lm))
            entry = list(prefix_graph._CACHE.values())[-1]  # the last used: the compiled search's
            wrapped[kind] = isinstance(entry.scorers["lm"], CompiledScorer)
            captured[kind] = entry.graph is not None
            direct[kind] = _direct(lm, len(inputs(kind, 1, 1, seed=0)[0]), entry.fr.n_cand)
            compiles[kind].append(_compiles(lm))
        prefix_graph.clear()
    return Runs(got, want, compiles, wrapped, captured, direct, ran)


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_scorers_give_the_eager_nbest_at_every_batch_size(runs: Runs, kind: str) -> None:
    assert runs.wrapped[kind] and not runs.captured[kind]  # the compiled scorers were searched with, uncaptured
    assert sum(len(h[0].tokens) for w in runs.want[kind] for h in w if h) > 20  # the search emits: a real comparison
    for got, want in zip(runs.got[kind], runs.want[kind]):
        assert_same_lists(got, want, tol=1e-4)
    # every search ran its eager compiling pass and its loop under the guard: no host sync in either
    assert runs.ran == ["frame_loop"] * (3 * len(BATCHES) * len(KINDS))


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_scores_and_states_equal_the_eager_ones(runs: Runs, kind: str) -> None:
    for got, want in runs.direct[kind]:
        for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)  # -inf where -inf


@pytest.mark.parametrize("kind", KINDS)
def test_one_compilation_serves_every_batch_size(runs: Runs, kind: str) -> None:
    # With dynamic=False each batch size (each row count N = batch * beam) compiled each function again.
    first, *later = runs.compiles[kind]
    assert first == {"score": 1, "select_state": 1}  # one graph each: no graph break
    assert later == [first] * len(later)


@pytest.mark.filterwarnings(*FILTERS)
def test_past_the_bound_new_shapes_run_eagerly_with_one_warning(runs: Runs, word_lm,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    kw = _setup("word_ngram", word_lm)
    lm = kw["scorers"]["lm"]
    before = _compiles(lm)
    prefix_graph.clear()
    want = [_search("word_ngram", 3, kw, token_topk=3)]
    monkeypatch.setattr(compiled_scorers, "MAX_COMPILES", before["score"])  # spent
    monkeypatch.setattr(prefix_graph, "COMPILE_DEVICES", ("cpu",))
    for method in ("score", "select_state"):  # not warned yet in this process
        monkeypatch.setattr(compiled_scorers.compiled(getattr(type(lm), method)), "_warned", False)
    caplog.set_level(logging.WARNING, logger=compiled_scorers.__name__)
    prefix_graph.clear()
    try:
        # three candidates a frame: a new shape, which would compile; past the bound it runs eagerly, twice
        got = [_search("word_ngram", 3, kw, token_topk=3) for _ in range(2)]
    finally:
        prefix_graph.clear()
    assert _compiles(lm) == before
    for g in got:
        assert_same_lists(g, want[0], tol=1e-4)
    warned = [r for r in caplog.records if r.name == compiled_scorers.__name__]
    assert len(warned) == 2  # once for score, once for select_state
    assert all("the most allowed" in r.getMessage() and "runs eagerly" in r.getMessage() for r in warned)


def _toy(scorer, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return state[:, None] * 2.0 + tokens


def test_a_failed_compilation_runs_eagerly_from_then_on(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler\nmore lines")

    monkeypatch.setattr(torch._dynamo, "lookup_backend", lambda name: broken)
    caplog.set_level(logging.WARNING, logger=compiled_scorers.__name__)
    fn = CompiledFunction(_toy)
    state, tokens = torch.arange(3.0), torch.ones(3, 2)
    for _ in range(2):
        torch.testing.assert_close(fn(None, state, tokens), _toy(None, state, tokens))
    assert "no C++ compiler" in fn.eager_reason and "more lines" not in fn.eager_reason
    warned = [r.getMessage() for r in caplog.records if r.name == compiled_scorers.__name__]
    assert len(warned) == 1 and "could not be compiled" in warned[0] and "_toy" in warned[0]


@pytest.mark.parametrize("value, on", [(None, True), ("", True), (" ", True), ("1", True), ("true", True),
                                       ("ON", True), ("yes", True), ("0", False), ("false", False),
                                       (" Off ", False), ("no", False)])
def test_the_switch_is_on_unless_turned_off(value, on: bool) -> None:
    assert env_switch(value) is on


def test_a_bad_switch_value_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"ASRKIT_COMPILE_SCORERS='2': expected 0 or 1"):
        env_switch("2")


def test_on_by_default_where_the_loop_is_captured() -> None:
    if os.environ.get("ASRKIT_COMPILE_SCORERS") is not None:
        pytest.skip("ASRKIT_COMPILE_SCORERS is set in this environment")
    assert prefix_graph.COMPILE_SCORERS is True and prefix_graph.COMPILE_DEVICES == ("cuda",)


@pytest.mark.filterwarnings(*FILTERS)
def test_off_the_captured_path_the_scorers_are_left_as_they_are(word_lm) -> None:
    # The CPU (here: the default COMPILE_DEVICES) keeps the scorer objects themselves and compiles nothing.
    kw = _setup("word_ngram", word_lm)
    before = _compiles(kw["scorers"]["lm"])
    prefix_graph.clear()
    try:
        _search("word_ngram", 3, kw)
        assert [e.scorers["lm"] for e in prefix_graph._CACHE.values()] == [kw["scorers"]["lm"]]
    finally:
        prefix_graph.clear()
    assert _compiles(kw["scorers"]["lm"]) == before


@pytest.mark.filterwarnings(*FILTERS)
def test_only_table_scorers_are_compiled(word_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    kw = _setup("word_ngram", word_lm)
    lstm = tiny_lstm(len(inputs("word_ngram", 1, 1, seed=0)[0]))
    both = compile_scorers({"lm": kw["scorers"]["lm"], "nn": lstm})
    assert list(both) == ["lm", "nn"] and isinstance(both["lm"], CompiledScorer) and both["nn"] is lstm
    # a neural LM alone: nothing to compile, the loop is the uncompiled one (no eager compiling pass)
    monkeypatch.setattr(prefix_graph, "COMPILE_DEVICES", ("cpu",))
    prefix_graph.clear()
    try:
        _search("word_ngram", 2, dict(kw, scorers={"lm": lstm}))
        (entry,) = prefix_graph._CACHE.values()
        assert entry.scorers["lm"] is lstm and entry.warm_up is None
    finally:
        prefix_graph.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings(*FILTERS)
def test_compiled_scorers_in_the_captured_loop_on_cuda_by_default(word_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches a compilation inside the capture, compiled kernels that the graph does not replay right, and a
    # recompilation per batch size; the reference is the eager loop on the CPU.
    if not prefix_graph.COMPILE_SCORERS:
        pytest.skip("ASRKIT_COMPILE_SCORERS=0 in this environment")
    ran: List[str] = []
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    for kind in KINDS:
        kw = _setup(kind, word_lm)
        lm = kw["scorers"]["lm"]
        want = [_search(kind, b, kw) for b in BATCHES]
        prefix_graph.clear()
        compiles, ran[:] = [], []
        try:
            got = []
            for b in BATCHES:
                got.append(_search(kind, b, kw, device="cuda"))
                compiles.append(_compiles(lm))
            entries = list(prefix_graph._CACHE.values())
            assert all(isinstance(e.scorers["lm"], CompiledScorer) and e.graph is not None for e in entries)
            assert ran == ["frame_loop"] * (2 * len(BATCHES))  # per bucket: the compiling run, the capture
        finally:
            prefix_graph.clear()
        assert compiles == [compiles[0]] * len(BATCHES)
        for g, w in zip(got, want):
            assert_same_lists(g, w, tol=1e-4)
