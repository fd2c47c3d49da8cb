"""The fused CTC step (asrkit.search.fused_step, a Triton kernel) against the torch step it replaces.

On the CPU the kernel runs under Triton's interpreter, in a fresh process started with TRITON_INTERPRET=1; on a
CUDA machine it is compiled and runs on the GPU. The reference is the plain eager torch
loop (itself tested against a dict-based reference search): every scorer kind (the kernel one launch per step
between the scorers' torch calls) and none (one launch for every step), pruned and exact, float32 and float64.
Without scorers both forms run: the step on host-built tables and the whole search from the log-probs
(asrkit.search.fused_search: compaction and candidates in the program).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import asrkit.search.fused_search as fused_search
import asrkit.search.prefix_graph as prefix_graph
import asrkit.search.prefix_loop as prefix_loop
from asrkit.lm.ngram import NgramScorer, load_ngram
from asrkit.lm.word_ngram import WordNgramScorer
from asrkit.search import LengthBonus, WordCount, ctc_prefix_beam_search, native_loop
from asrkit.search.lexicon import LexiconScorer
from host_sync import SYNC_METHODS, no_host_sync
from test_ctc_prefix import peaky_log_probs, random_log_probs
from test_native_prefix import LEXICON
from test_resumable_search import (FIXTURES, PRUNING, TOKEN_CHARS, assert_same_lists, fusion, inputs,  # noqa: F401
                                   word_lm)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))  # the LM tests' random ARPA writer
from test_ngram import write_random_arpa  # noqa: E402

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
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", False)
    prefix_graph.clear()
    yield
    prefix_graph.clear()


def both(lp: torch.Tensor, lengths: torch.Tensor, **kw):
    """(fused, eager) n-best lists of one batch, and whether the fused kernel ran (the step on tables, or with
    FUSED_SEARCH the whole search)."""
    searches = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused_search, "run", lambda *a, _run=fused_search.run: searches.append(1) or _run(*a))
        got = ctc_prefix_beam_search(lp, lengths, native=False, cuda_graph=True, **kw).to_lists()
    if prefix_graph.FUSED_SEARCH:
        ran = searches == [1] and not prefix_graph._CACHE
    else:
        ran = not searches and all(e.s.fused_step for e in prefix_graph._CACHE.values())
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
@pytest.mark.parametrize("case, setup", [  # topk tables only where fewer than every token is a candidate
    (case, setup) for case in sorted(NO_SCORER_CASES) for setup in ("host tables", "in the kernel")
] + [("peaky-tight-runs", "in the kernel, topk tables")])
def test_without_scorers_one_launch_equals_the_torch_loop(case: str, setup: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches any slip in the kernel's arithmetic: merges, stays, repeats after a blank, blank runs (tight
    # pruning skips frames), padding, dead hypotheses (3 tokens, beam 6), the bonus in the beam's dtype; in the
    # kernel: skipped frames (their offset, pnb moved into pb), the best C tokens of a frame (or their tables),
    # min_logp, the paths.
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", setup != "host tables")
    monkeypatch.setattr(fused_search, "CANDIDATES", "topk" if setup.endswith("tables") else "kernel")
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


def _spelled(tokens, texts, frames: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, frames, V) log-probs spelling each text (one token a character) on even frames, blank on odd ones."""
    gen = torch.Generator().manual_seed(11)
    lp = torch.randn(len(texts), frames, len(tokens), generator=gen, dtype=torch.float64)
    for b, text in enumerate(texts):
        for i, ch in enumerate(text[:frames // 2]):
            lp[b, 2 * i, tokens.index(ch)] += 6.0
            lp[b, 2 * i + 1, 0] += 6.0
    return lp.log_softmax(-1).to(dtype)


def _sparse_tries(word_lm, tokens):
    """The word 3-gram (open vocabulary), the lexicon scorer and the word count, the tries as sorted edges."""
    lm = WordNgramScorer(word_lm, tokens, unk_offset=-5.0, dense_max_entries=0)
    lex = LexiconScorer(LEXICON, tokens, dense_max_entries=0)
    assert not lm.dense and not lex.dense
    return dict(scorers={"lm": lm, "lexicon": lex, "words": WordCount(*lm.word_marks())},
                weights={"lm": 0.6, "lexicon": 1.0, "words": 0.7, "length_bonus": 0.3})


# kind (test_resumable_search.fusion's, or sparse tries), pruning (exact: no blank skipping), beam, dtype
SCORER_CASES = {
    "token-ngram-exact-beam1": ("token_ngram", "exact", 1, torch.float32),  # + the constant bonus
    "word-ngram-word-count-skipping": ("word_ngram", "default", 4, torch.float32),
    "word-ngram-lexicon-tight-float64": ("word_ngram_lexicon", "tight", 3, torch.float64),
    "sparse-tries-exact": ("sparse", "exact", 4, torch.float32),
    "length-bonus-scorer": ("length_bonus", "default", 2, torch.float64),
    "token-ngram-lookup-2gram": ("lookup-2", "default", 4, torch.float64),
    "token-ngram-lookup-4gram-unclosed": ("lookup-4", "exact", 3, torch.float32),
}


def _lookup_lm(order: int, folder: Path) -> NgramScorer:
    """A token n-gram without dense tables over TOKEN_CHARS: the 2-gram fixture, or a random model of ``order``
    whose contexts and suffixes are not all listed (the loader inserts them)."""
    path = FIXTURES / "chars_2gram.arpa" if order == 2 else \
        write_random_arpa(folder / f"random_{order}gram.arpa", TOKEN_CHARS[3:], order, seed=order, closed=False)
    return NgramScorer(load_ngram(path), TOKEN_CHARS, dense=False)


@in_this_process
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("case", sorted(SCORER_CASES))
def test_with_table_scorers_one_launch_equals_the_torch_loop(word_lm, case: str, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    # The scorers inside the one-launch search (asrkit.search.fused_scorers): word count, dense token n-gram,
    # the word n-gram (look-ahead, back-off through the context chain, the closed state, </s>) with and without a
    # lexicon, the lexicon scorer (-inf scores, dead hypotheses), dense and sorted-edge tries, LengthBonus folded
    # into the bonus, the token n-gram's lookup layout (back-offs of orders 2 and 4); three utterances of different
    # lengths, blank skipping on and off. On a GPU both searches run there (init_state moves the scorers' tables).
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", True)
    kind, pruning, beam, dtype = SCORER_CASES[case]
    tokens, lp = inputs("token_ngram" if kind.startswith("lookup") else "word_ngram" if kind == "sparse" else kind, 3,
                        12, seed=len(case), dtype=dtype)
    lengths = torch.tensor([12, 7, 10])
    if kind == "sparse":  # prefixes of listed words closed by a boundary (the lexicon refuses them), OOV letters
        lp = _spelled(tokens, ["\u2581DO\u2581A", "\u2581SA\u2581ON", "\u2581THEM"], 12, dtype)
    lp[:, 5, 2] += 4.0  # <sos/eos> mid-way and at the end: </s> scored, a word count's "unchanged"
    lp[torch.arange(3), lengths - 1, 2] += 6.0
    if kind.startswith("lookup"):
        fused_with = dict(scorers={"lm": _lookup_lm(int(kind[-1]), tmp_path)}, weights={"lm": 0.8, "length_bonus": 0.3})
    else:
        fused_with = _sparse_tries(word_lm, tokens) if kind == "sparse" else fusion(kind, word_lm, tokens)
    kw = dict(beam=beam, nbest=beam, **fused_with, **PRUNING[pruning])
    got, want, ran = both(lp.to(DEVICE), lengths.to(DEVICE), **kw)
    assert ran and sum(len(h[0].tokens) for h in want if h) > 6
    assert_same_lists(got, want, tol=1e-4 if dtype == torch.float32 else 1e-9)
    if native_loop.unavailable(lp, lengths, kw["scorers"]) is None:  # the C++ loop on the same tables
        native = ctc_prefix_beam_search(lp, lengths, native=True, **kw).to_lists()
        assert_same_lists(got, native, tol=1e-4 if dtype == torch.float32 else 1e-9)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
def test_scorers_the_one_launch_search_cannot_run_are_named(word_lm, tmp_path: Path) -> None:
    tokens, lp = inputs("word_ngram", 1, 4, seed=1)
    why = fused_search.scorers_unavailable
    assert why(fusion("word_ngram_lexicon", word_lm, tokens)["scorers"]) is None
    assert why({"lb": LengthBonus()}) is None
    with pytest.MonkeyPatch.context() as mp:  # ASRKIT_FUSED_SCORERS=0: only a LengthBonus (a constant) stays
        mp.setattr(fused_search, "FUSED_SCORERS", False)
        assert why({"lb": LengthBonus()}) is None
        assert why(fusion("token_ngram", word_lm, TOKEN_CHARS)["scorers"]) == \
            "scorers in the kernel are turned off (ASRKIT_FUSED_SCORERS=0)"
    assert "'lm' (NeuralLMScorer) has no table form" in why(fusion("lstm", word_lm, tokens)["scorers"])
    assert "'hot' (HotwordScorer) is of kind 'hotwords'" in why(fusion("hotwords", word_lm, tokens)["scorers"])
    assert why({"lm": _lookup_lm(2, tmp_path)}) is None
    lookup = _lookup_lm(5, tmp_path)
    assert why({"lm": lookup}) == "scorer 'lm' (NgramScorer) is a 5-gram without dense tables: the kernel looks up " \
                                  "orders up to 4"
    two = fusion("word_ngram", word_lm, tokens)["scorers"]["lm"]
    assert why({"a": two, "b": two}) == "scorers 'a' and 'b' are both 'word_ngram': the kernel holds one of each kind"
    assert fused_search.unavailable(lp, {"lm": lookup}, 8) == why({"lm": lookup})
    # tables of other tokens than the log-probs' (never read at a candidate's id unchecked)
    for sc, size in [(sc, len(tokens)) for sc in fusion("word_ngram_lexicon", word_lm, tokens)["scorers"].values()] + [
            (fusion("token_ngram", word_lm, TOKEN_CHARS)["scorers"]["lm"], len(TOKEN_CHARS))]:
        assert fused_search.unavailable(lp[..., :5], {"x": sc}, 3) == \
            f"scorer 'x' ({type(sc).__name__}) has tables for {size} tokens, the log-probs 5"
    count = WordCount(torch.arange(5) < 2, torch.ones(5, dtype=torch.long))
    assert why({"words": count}, 5) is None
    assert f"has tables for 5 tokens, the log-probs {len(tokens)}" in fused_search.unavailable(lp, {"words": count}, 3)
    assert "has tables for 7 tokens" in fused_search.unavailable(lp, {"lm": _lookup_lm(2, tmp_path)}, 3)


@in_this_process
def test_the_exact_search_over_many_tokens_keeps_the_torch_step() -> None:
    # "wide" (every one of more than 32 tokens a candidate) has its own bookkeeping: the kernel is not used.
    lp = random_log_probs(2, 6, 40, torch.Generator().manual_seed(3)).to(DEVICE)
    got, want, ran = both(lp, torch.tensor([6, 5], device=DEVICE), beam=3, **PRUNING["exact"])
    assert not ran
    assert_same_lists(got, want)


@in_this_process
@pytest.mark.parametrize("candidates", ["kernel", "topk"])
def test_the_search_in_the_kernel_at_the_edges(monkeypatch: pytest.MonkeyPatch, candidates: str) -> None:
    # An utterance of no frames, one whose every frame is skipped, one that starts and ends with skipped frames,
    # a V that is no power of two with token_topk over half of it, n-best of the whole beam (min_logp drops some);
    # the kernel's own top-C in float64, the tables in float32.
    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", True)
    monkeypatch.setattr(fused_search, "CANDIDATES", candidates)
    dtype = torch.float64 if candidates == "kernel" else torch.float32
    lp = peaky_log_probs(4, 12, 11, torch.Generator().manual_seed(5), dtype=dtype)
    lp[1, :, 0] = -1e-5  # every frame blank above the threshold
    lp[2, :3, 0] = lp[2, 9:, 0] = -1e-5
    lengths = torch.tensor([12, 12, 12, 0])
    got, want, ran = both(lp.to(DEVICE), lengths.to(DEVICE), beam=4, nbest=4, token_topk=6, token_min_logp=-4.0,
                          blank_skip_threshold=0.99)
    assert ran and want[1][0].tokens == [] == want[3][0].tokens and want[2][0].tokens and len(want[0][0].tokens) > 2
    assert want[1][0].score == pytest.approx(12 * -1e-5, abs=1e-6)
    assert_same_lists(got, want)


class _NoKernel:
    """A kernel launcher that launches nothing (the host side alone is under test)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("candidates, most", [("kernel", 16), ("topk", 24)])
def test_the_search_in_the_kernel_makes_no_host_sync_and_no_op_per_frame(monkeypatch: pytest.MonkeyPatch,
                                                                          candidates: str, most: int) -> None:
    # The host side of the GPU path without scorers: no value read back before the result (to_nbest), and a
    # fixed number of torch ops whatever the frames. With FUSED_SEARCH off (the fused step on host-built
    # tables) this fails: the compaction reads its width back.
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list = []
    no_launch = {"select", "slice", "unsqueeze", "view", "expand", "empty", "lift_fresh", "alias", "detach"}

    class Count(TorchDispatchMode):  # the ops that launch a kernel (not views, not allocations)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in no_launch:
                ops.append(func)
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def unguarded_to_nbest(ranked, frame, _to_nbest=prefix_loop.to_nbest):
        ops.append("to_nbest")  # the result's conversion: its one sync by design, its ops not counted
        with pytest.MonkeyPatch.context() as mp:
            for name, method in originals.items():
                mp.setattr(torch.Tensor, name, method)
            return _to_nbest(ranked, frame)

    monkeypatch.setattr(prefix_graph, "FUSED_SEARCH", True)
    monkeypatch.setattr(fused_search, "CANDIDATES", candidates)
    monkeypatch.setattr(fused_search, "_kernels", lambda: (_NoKernel(), _NoKernel()))
    monkeypatch.setattr(fused_search.fused_step, "unavailable", lambda device: None)
    monkeypatch.setattr(prefix_loop, "to_nbest", unguarded_to_nbest)
    counts = []
    for frames in (20, 200):
        lp = peaky_log_probs(3, frames, 9, torch.Generator().manual_seed(frames), dtype=torch.float32)
        del ops[:]
        lengths = torch.tensor([frames, frames - 3, 5])
        with Count():
            no_host_sync(prefix_graph.search)(lp, lengths, 4, 2, {}, {}, 0.5, 8, -12.0, 0.999)
        counts.append(ops.index("to_nbest"))
    assert counts[0] == counts[1] <= most, counts


def _signature(kernel, pointers: dict, constants: dict) -> dict:
    """The kernel's argument types: the named pointers, constexpr for the constants, int32 for the rest."""
    names = kernel.arg_names
    return {n: pointers.get(n, "constexpr" if n in constants else "i32") for n in names}


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter's kernels are not compiled")
def test_the_kernels_compile_for_an_h100() -> None:
    # The interpreter runs the kernels as Python, so a kernel it runs may still not compile (an if's branches that
    # leave a value of two types, a loop-carried value that changes type): compile them for sm_90 here, no GPU
    # needed, so that a GPU session finds them compiling.
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from asrkit.search import fused_kernel
    from asrkit.search.interfaces import HASH_MUL, SENT_HASH, SENT_PARENT

    hashes = dict(SENT_HASH_C=SENT_HASH, SENT_PARENT_C=SENT_PARENT, SENT_MIN_C=-(2 ** 63), HASH_MUL_C=HASH_MUL)
    search = dict(HAS_FUSION=True, EVERY_TOKEN=False, BK=16, BC=16, BV=32, **hashes)
    floats = ("lp", "limits", "bonus_ptr", "st", "vtab", "wts", "final_out", "wc_open0", "tn_logp", "tn_eos",
              "lx_score_table", "wn_floats0", "wn_la_next", "wn_la", "wn_node_floats", "wn_row_floats", "wn_backoff",
              "tk_bo0", "tk_prob1", "tk_bo1", "tk_prob2", "tk_bo2", "tk_prob3", "tk_bo3", "tk_prob4")
    longs = ("lengths", "ints", "parent_out", "token_out", "frame_out", "count_out", "ctab", "wc_opens", "tn_state0",
             "lx_state0", "lx_next_base", "lx_edge_keys", "lx_edge_dst", "lx_col_start", "wn_ints0", "wn_edge_keys",
             "wn_edge_dst", "wn_col_start", "wn_token_slot", "wn_node_word", "wn_chain_keys", "wn_keys",
             "wn_next_state", "tk_hist0", "tk_tok", "tk_keys2", "tk_keys3", "tk_keys4")
    flags = ("wc_closes", "lx_col_stay", "lx_col_closes", "lx_is_word", "wn_col_stay", "wn_col_is_end",
             "wn_col_is_start")
    pointers = {**{n: "*fp32" for n in floats}, **{n: "*i64" for n in longs}, **{n: "*u8" for n in flags},
                "tn_next": "*i32", "wn_trans": "*i32", "offset_out": "*fp64"}
    back = {n: "*i64" for n in ("parents", "tokens", "order", "count", "paths")}
    # every scorer kind, the tries as sorted edges (their searches; the dense tries are single loads), the lookup
    # token n-gram of the highest order
    unscored = dict(search, TABLES=False, HAS_SCORERS=False, HAS_WC=False, HAS_TN=False, HAS_LX=False,
                    LX_DENSE=True, HAS_WN=False, WN_DENSE=True, HAS_TK=False, TK_ORDER=1)
    scored = dict(unscored, HAS_SCORERS=True, HAS_WC=True, HAS_TN=True, HAS_LX=True, LX_DENSE=False, HAS_WN=True,
                  WN_DENSE=False, HAS_TK=True, TK_ORDER=4)
    # (TABLES=True differs by two loads; few variants keep the test within seconds on a cold cache)
    for kernel, ptrs, consts in ((fused_kernel.ctc_search, pointers, unscored),
                                 (fused_kernel.ctc_search, pointers, scored),
                                 (fused_kernel.backtrack_paths, back, dict(BN=16))):
        out = compile(ASTSource(kernel, _signature(kernel, ptrs, consts), consts), target=GPUTarget("cuda", 90, 32),
                      options={"num_warps": 8})
        assert ".entry " + kernel.__name__ in out.asm["ptx"] and out.asm["cubin"]
