"""The fused CTC step (asrkit.search.fused_step, a Triton kernel) against the torch step it replaces.

On the CPU the kernel runs under Triton's interpreter, in a fresh process started with TRITON_INTERPRET=1; on a
CUDA machine it is compiled and runs on the GPU. The reference is the plain eager torch
loop (itself tested against a dict-based reference search): every scorer kind (the kernel one launch per step
between the scorers' torch calls) and none (one launch for every step), pruned and exact, float32 and float64.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import asrkit.search.prefix_graph as prefix_graph
from asrkit.search import ctc_prefix_beam_search
from test_ctc_prefix import peaky_log_probs, random_log_probs
from test_resumable_search import PRUNING, assert_same_lists, fusion, inputs, word_lm  # noqa: F401

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton decides between compiling and interpreting when it decorates a function, its own tl.min / tl.max among
# them, so the interpreter works only in a process that had TRITON_INTERPRET=1 before triton was first imported
# (anything earlier in a suite may import it). On the CPU the tests below run in such a process, started by
# test_the_kernel_tests_under_the_interpreter; on a GPU they run here, compiled.
HERE = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
in_this_process = pytest.mark.skipif(not HERE, reason="on the CPU: run under the interpreter in a fresh process")


def test_the_kernel_tests_under_the_interpreter() -> None:
    if HERE:
        pytest.skip("the tests run in this process")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], env=env,
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.fixture(autouse=True)
def fused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(prefix_graph, "FUSED_STEP", True)
    prefix_graph.clear()
    yield
    prefix_graph.clear()


def both(lp: torch.Tensor, lengths: torch.Tensor, **kw):
    """(fused, eager) n-best lists of one batch, and whether the fused kernel ran."""
    got = ctc_prefix_beam_search(lp, lengths, native=False, cuda_graph=True, **kw).to_lists()
    ran = all(e.s.fused_step for e in prefix_graph._CACHE.values())
    want = ctc_prefix_beam_search(lp, lengths, native=False, cuda_graph=False, **kw).to_lists()
    return got, want, ran


# Triton's interpreter takes ~0.1 s per step and utterance: small batches (the GPU run takes the same tests).
NO_SCORER_CASES = {  # input, vocabulary, beam, pruning, dtype, weights
    "peaky-default": (peaky_log_probs, 9, 4, "default", torch.float32, {}),
    "flat-exact-bonus-float64": (random_log_probs, 6, 5, "exact", torch.float64, {"length_bonus": 0.6}),
    "peaky-tight-runs": (peaky_log_probs, 9, 4, "tight", torch.float32, {"length_bonus": -0.3}),
    "dead-hypotheses": (random_log_probs, 3, 6, "exact", torch.float64, {}),
}


@in_this_process
@pytest.mark.parametrize("case", sorted(NO_SCORER_CASES))
def test_without_scorers_one_launch_equals_the_torch_loop(case: str) -> None:
    # Catches any slip in the kernel's arithmetic: merges, stays, repeats after a blank, blank runs (tight
    # pruning skips frames), padding, dead hypotheses (3 tokens, beam 6), the bonus in the beam's dtype.
    make, vocab, beam, pruning, dtype, weights = NO_SCORER_CASES[case]
    lp = make(2, 16, vocab, torch.Generator().manual_seed(len(case)), dtype=dtype).to(DEVICE)
    lengths = torch.tensor([16, 11], device=DEVICE)
    got, want, ran = both(lp, lengths, beam=beam, nbest=beam, weights=weights, **PRUNING[pruning])
    assert ran
    assert sum(len(h[0].tokens) for h in want) > 5
    assert_same_lists(got, want, tol=1e-4 if dtype == torch.float32 else 1e-9)


@in_this_process
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("kind", ["word_ngram", "lstm", "hotwords"])
def test_with_scorers_equals_the_torch_loop(word_lm, kind: str) -> None:
    # One launch per step between the scorers' calls: their scores in, the picks' parents and tokens out.
    if DEVICE != "cpu":
        pytest.skip("the scorers of test_resumable_search.fusion are built on the CPU")
    tokens, lp = inputs(kind, 2, 16, seed=7 + len(kind))
    kw = dict(beam=4, nbest=3, **fusion(kind, word_lm, tokens))
    got, want, ran = both(lp, torch.tensor([16, 12]), **kw)
    assert ran and sum(len(h[0].tokens) for h in want) > 3
    assert_same_lists(got, want)


@in_this_process
def test_the_exact_search_over_many_tokens_keeps_the_torch_step() -> None:
    # "wide" (every one of more than 32 tokens a candidate) has its own bookkeeping: the kernel is not used.
    lp = random_log_probs(2, 6, 40, torch.Generator().manual_seed(3)).to(DEVICE)
    got, want, ran = both(lp, torch.tensor([6, 5], device=DEVICE), beam=3, **PRUNING["exact"])
    assert not ran
    assert_same_lists(got, want)
