"""The loop captured once per bucket (asrkit.search.prefix_graph), run on the CPU: everything but the capture.

The reference is the plain eager torch loop (``cuda_graph=False``), itself tested against a dict-based reference
search. Several batches go through one bucket's entry in turn (the tables refilled, the beam and the scorers'
states restarted), with every scorer kind; each must give the eager loop's n-best. With the graph captured and
replayed on a CUDA device: tests/search/test_search_on_cuda.py.
"""
from __future__ import annotations

from typing import List, Optional

import pytest
import torch

import asrkit.search.prefix_graph as prefix_graph
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import WordCount, ctc_prefix_beam_search
from asrkit.search.hypotheses import Hypothesis
from host_sync import no_host_sync
from test_ctc_prefix import EXACT, BigramScorer, peaky_log_probs, random_log_probs
from test_resumable_search import KINDS, PRUNING, assert_same_lists, fusion, inputs, word_lm  # noqa: F401

@pytest.fixture(autouse=True)
def empty_cache():
    prefix_graph.clear()
    yield
    prefix_graph.clear()


def search(lp: torch.Tensor, lengths: torch.Tensor, graph: bool, **kw) -> List[List[Hypothesis]]:
    return ctc_prefix_beam_search(lp, lengths, native=False, cuda_graph=graph, **kw).to_lists()


def test_bucket_steps() -> None:
    # Catches: a bucket smaller than the batch's steps, or buckets so coarse that most steps are padding.
    assert [prefix_loop.bucket_steps(w) for w in (0, 1, 16, 17, 100, 128, 129, 250, 256, 300, 1000)] == \
        [16, 16, 16, 32, 112, 128, 144, 256, 256, 320, 1024]
    for w in range(1, 3000):
        b = prefix_loop.bucket_steps(w)
        assert w <= b <= max(16, w * 1.125 + 16)


def test_candidates_per_frame_and_the_wide_search() -> None:
    # C (every non-blank token without token_topk, else token_topk within [1, V-1]) and "wide" (every token a
    # candidate and more than 32 of them), which the loops and the fused search's choice read.
    assert [prefix_loop.candidate_count(9, k) for k in (None, 1, 5, 8, 20)] == [8, 1, 5, 8, 8]
    assert [prefix_loop.is_wide(v, c) for v, c in ((33, 32), (34, 33), (34, 32), (9, 8))] == [False, True, False, False]


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("kind", ["none"] + KINDS)
@pytest.mark.parametrize("pruning", ["exact", "default", "tight"])
def test_batches_of_one_bucket_equal_the_eager_loop(word_lm, kind: str, pruning: str) -> None:
    # Catches: tables not refilled (the second batch searched with the first's), the beam or a scorer's state
    # not restarted, a padding step or a data-driven blank run that changes a result, a result tensor shared
    # with the next batch.
    tokens, _ = inputs("word_ngram" if kind == "none" else kind, 1, 1, seed=0)
    kw = dict(beam=5, nbest=3, **PRUNING[pruning], **({} if kind == "none" else fusion(kind, word_lm, tokens)))
    for seed, lengths in ((1, [40, 31, 40]), (2, [38, 40, 12]), (3, [40, 40, 40])):
        _, lp = inputs("word_ngram" if kind == "none" else kind, 3, 40, seed=seed + len(kind))
        want = search(lp, torch.tensor(lengths), False, **kw)
        assert sum(len(h[0].tokens) for h in want if h) > 5  # the search emits: a real comparison
        assert_same_lists(search(lp, torch.tensor(lengths), True, **kw), want)
    entries = list(prefix_graph._CACHE.values())
    assert sum(e.runs for e in entries) == 3 and len(entries) < 3  # batches shared an entry


def test_a_batch_of_no_frames_is_searched_without_a_capture() -> None:
    # (B, 0, V): nothing to capture (the tables' index_select raised); each row is the empty hypothesis
    lp = torch.zeros(2, 0, 6)
    got = search(lp, torch.tensor([0, 0]), True, beam=4, nbest=2, weights={"length_bonus": 0.3})
    assert_same_lists(got, search(lp, torch.tensor([0, 0]), False, beam=4, nbest=2, weights={"length_bonus": 0.3}))
    assert [[h.tokens for h in row] for row in got] == [[[]], [[]]]


def test_skipping_and_non_skipping_batches_share_a_bucket() -> None:
    # A bucket of a blank-skipping search serves batches with skipped frames and without any (flat inputs):
    # every step reads the data-driven run offsets. Catches: offsets of the first batch kept for the second.
    gen = torch.Generator().manual_seed(4)
    kw = dict(beam=4, nbest=2, blank_skip_threshold=0.6, weights={"length_bonus": 0.3})
    peaky = peaky_log_probs(4, 30, 9, gen)
    flat = random_log_probs(4, 30, 9, gen, scale=0.3)
    lengths = torch.tensor([30, 25, 30, 9])
    for lp in (peaky, flat, peaky.flip(1)):
        assert_same_lists(search(lp, lengths, True, **kw), search(lp, lengths, False, **kw))
    assert prefix_graph.cached_entries() <= 2


def test_the_loop_and_the_ranking_read_nothing_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU both are captured: a host sync there would fail the capture. Catches one added to either.
    ran: List[str] = []
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    monkeypatch.setattr(prefix_loop, "rank", no_host_sync(prefix_loop.rank, ran))
    lp = peaky_log_probs(3, 25, 7, torch.Generator().manual_seed(8))
    for _ in range(2):
        search(lp, torch.tensor([25, 20, 3]), True, beam=3, weights={"length_bonus": 0.5})
    assert ran == ["frame_loop", "rank"] * 2


def test_the_cache_keeps_the_most_recent_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_graph, "MAX_ENTRIES", 2)
    gen = torch.Generator().manual_seed(9)
    shapes = [(2, 20), (3, 20), (2, 20), (2, 60), (3, 20)]  # batch sizes and frames: buckets A B A C B
    for batch, frames in shapes:
        lp = random_log_probs(batch, frames, 6, gen)
        search(lp, torch.full((batch,), frames), True, beam=3, **EXACT)
    keys = list(prefix_graph._CACHE)
    assert [(k[3], k[7]) for k in keys] == [(2, 64), (3, 32)]  # (batch, steps): A evicted by C, then B refreshed


def test_another_scorer_object_gets_its_own_entry() -> None:
    # Two LMs under one name and weight, one after the other on batches of one shape: the second must not replay
    # the loop captured with the first (whose tables a graph has baked in). Catches a key without the object.
    gen = torch.Generator().manual_seed(12)
    lp = peaky_log_probs(2, 20, 8, gen)
    lengths = torch.tensor([20, 14])
    outs = []
    for lm in (BigramScorer(8, gen), BigramScorer(8, gen)):
        kw = dict(beam=4, scorers={"lm": lm}, weights={"lm": 2.0})
        got = search(lp, lengths, True, **kw)
        assert_same_lists(got, search(lp, lengths, False, **kw))
        outs.append([h.tokens for h in got[0]])
    assert outs[0] != outs[1]  # the LMs disagree: a shared entry would show
    assert prefix_graph.cached_entries() == 2


@pytest.mark.parametrize("fused, why_not, vocab, expect", [
    (True, None, 9, True), (False, None, 9, False), (True, "no triton", 9, False),
    (True, None, 40, False),  # exact search over 39 tokens: "wide", the torch step's own bookkeeping
])
def test_the_fused_step_runs_where_it_is_on_and_can_run(monkeypatch: pytest.MonkeyPatch, fused: bool,
                                                        why_not: Optional[str], vocab: int, expect: bool) -> None:
    # The kernel itself is tests/search/test_fused_step.py's; here only the choice, with the kernel replaced by the
    # torch steps (so the result must still equal the eager loop's).
    ran: List[bool] = []

    def torch_steps(s, fr, scorers, weights):
        ran.append(True)
        for i in range(fr.steps):
            prefix_loop.step(i, s, fr, scorers, weights)

    monkeypatch.setattr(prefix_graph, "FUSED_STEP", fused)
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", False)
    monkeypatch.setattr(prefix_graph.fused_step, "unavailable", lambda device: why_not)
    monkeypatch.setattr(prefix_loop, "_fused_loop", torch_steps)
    lp = random_log_probs(2, 10, vocab, torch.Generator().manual_seed(vocab))
    lengths = torch.tensor([10, 7])
    assert_same_lists(search(lp, lengths, True, beam=3, **EXACT), search(lp, lengths, False, beam=3, **EXACT))
    assert bool(ran) == expect


@pytest.mark.parametrize("step, whole, why_not, vocab, topk, lm, expect", [
    (True, True, None, 9, 1, False, True), (False, True, None, 9, 1, False, False),
    (True, False, None, 9, 1, False, False), (True, True, "no triton", 9, 1, False, False),
    (True, True, None, 40, None, False, False), (True, True, None, 40, 3, False, True),
    (True, True, None, 9, 1, "bigram", False), (True, True, None, 9, 1, "word_count", True),
])
def test_the_search_in_the_kernel_runs_where_it_is_on_and_can_run(monkeypatch: pytest.MonkeyPatch, step: bool,
                                                                  whole: bool, why_not: Optional[str], vocab: int,
                                                                  topk: Optional[int], lm: Optional[str],
                                                                  expect: bool) -> None:
    # The choice of asrkit.search.fused_search (its kernel is test_fused_step.py's): on with the fused step, where
    # triton runs, without scorers or with scorers of the kinds it runs (not a torch scorer), not for the exact
    # search over many tokens (40 tokens with token_topk=3 is not that). Its stand-in is the eager loop with the
    # arguments it was given, and the pruning is tight enough to change the n-best, so that a slip in what is
    # passed on changes the result.
    ran: List[bool] = []

    def eager(lp, lengths, beam, nbest, bonus, topk, min_logp, skip, scorers, weights):
        ran.append(True)
        s, fr = prefix_loop.prepare(lp, lengths, beam, scorers, bonus, topk, min_logp, skip)
        prefix_loop.frame_loop(s, fr, scorers, weights)
        return prefix_loop.finish(s, fr, scorers, weights, nbest)

    monkeypatch.setattr(prefix_graph, "FUSED_STEP", step)
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", whole)
    monkeypatch.setattr(prefix_graph.fused_step, "unavailable", lambda device: why_not)
    monkeypatch.setattr(prefix_loop, "_fused_loop", lambda s, fr, scorers, weights: [
        prefix_loop.step(i, s, fr, scorers, weights) for i in range(fr.steps)])
    monkeypatch.setattr(prefix_graph.fused_search, "search", eager)
    lp = random_log_probs(2, 30, vocab, torch.Generator().manual_seed(vocab), scale=1.5)
    lengths = torch.tensor([30, 21])
    kw = dict(beam=4, nbest=4, weights={"length_bonus": 0.4}, token_topk=topk, token_min_logp=-2.0,
              blank_skip_threshold=0.6)
    if lm == "bigram":
        kw.update(scorers={"lm": BigramScorer(vocab, torch.Generator().manual_seed(1))}, weights={"lm": 0.5, "length_bonus": 0.4})
    elif lm == "word_count":  # tokens 1-2 close a word, 3-6 open one
        marks = WordCount(torch.arange(vocab) < 3, torch.where(torch.arange(vocab) > 2, 1, 0))
        kw.update(scorers={"words": marks}, weights={"words": 1.5, "length_bonus": 0.4})
    assert_same_lists(search(lp, lengths, True, **kw), search(lp, lengths, False, **kw))
    assert bool(ran) == expect


def test_auto_runs_the_captured_loop_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = prefix_graph.search
    monkeypatch.setattr(prefix_graph, "search", lambda *a, **k: calls.append(a[0].device.type) or real(*a, **k))
    lp = peaky_log_probs(2, 12, 5, torch.Generator().manual_seed(3))
    ctc_prefix_beam_search(lp, torch.tensor([12, 7]), beam=3, native=False)
    assert calls == []
    ctc_prefix_beam_search(lp, torch.tensor([12, 7]), beam=3, native=False, cuda_graph=True)
    assert calls == ["cpu"]
    if torch.cuda.is_available():
        ctc_prefix_beam_search(lp.cuda(), torch.tensor([12, 7]).cuda(), beam=3)
        assert calls == ["cpu", "cuda"]


def test_the_bucketed_tables_copy_no_host_array_to_the_device() -> None:
    # On a GPU a tensor made from host numbers (torch.tensor([...])) is a copy that waits for the device; single
    # numbers (x[i] = 3) are kernel arguments. Catches such a copy in building a batch's tables.
    from torch.utils._python_dispatch import TorchDispatchMode

    made = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.startswith("lift_fresh") and out.numel() > 1:
                made.append(tuple(out.shape))
            return out

    lp = peaky_log_probs(3, 40, 9, torch.Generator().manual_seed(4))
    lengths = torch.tensor([40, 31, 12])
    with Watch():
        fr = prefix_loop.tables(lp, lengths, 4, {}, 0.5, 5, -8.0, 0.999, bucketed=True)
    assert fr.skip is not None and not made, made
