"""The batched CTC prefix search with each LM on a CUDA device gives what it gives on the CPU.

The search's GPU path is its torch frame loop (the C++ loop is CPU only), eager or captured as one CUDA graph, or
with table LMs (n-grams) the one-launch fused search, their scorers inside it; the LM scorers keep their states on
the device. Inputs spell words of the test LMs (so the LMs change the
result), one token over 1-3 frames with blanks between, a rival for some tokens, noise on every frame.
Skipped without a CUDA device (the development machines have none; the device checks run them).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch

from asrkit.lm import LSTMLM, NeuralLMScorer, TransformerLM, ngram_scorer
from asrkit.search import ctc_prefix_beam_search, fused_search, prefix_graph
from asrkit.search.hotwords import hotword_scorer, spell_with_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FIXTURES = Path(__file__).resolve().parents[1] / "lm" / "fixtures"
MARK = "\u2581"
WORDS = ["THE", "CAT", "SAT", "ON", "MAT", "A", "DOG"]  # the words of words_3gram.arpa
TOKENS = ["<blank>", "<unk>", "<sos/eos>", MARK] + sorted(set("".join(WORDS)))
CHAR2_TOKENS = ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"]  # the words of chars_2gram.arpa


def spelled_log_probs(tokens: List[str], words: List[str], batch: int, seed: int) -> tuple:
    """(B, T, V) float32 log-probs of random word sequences spelled in ``tokens``, and (B,) lengths."""
    rng = random.Random(seed)
    ids = {t: i for i, t in enumerate(tokens)}
    rows: List[List[int]] = []
    for _ in range(batch):
        seq: List[int] = []
        for w in rng.choices(words, k=rng.randint(2, 5)):
            seq += [ids[MARK]] + [ids[c] for c in w]
        rows.append(seq)
    frames = [[0] * rng.randint(0, 2) + sum(([t] * rng.randint(1, 3) + [0] * rng.randint(0, 2) for t in r), [])
              for r in rows]
    lengths = torch.tensor([len(f) for f in frames])
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, int(lengths.max()), len(tokens), generator=gen)
    for b, f in enumerate(frames):
        for t, k in enumerate(f):
            logits[b, t, k] += 6.0
            if rng.random() < 0.2:  # a rival with a fair share of the mass
                logits[b, t, rng.randrange(len(tokens))] += 5.5
    return logits.log_softmax(-1), lengths


def _token_lm(device: str):
    return ngram_scorer(FIXTURES / "chars_2gram.arpa", CHAR2_TOKENS, units="token", device=device, dense=True)


def _token_lm_lookup(device: str):
    return ngram_scorer(FIXTURES / "chars_2gram.arpa", CHAR2_TOKENS, units="token", device=device, dense=False)


def _word_lm(device: str):
    return ngram_scorer(FIXTURES / "words_3gram.arpa", TOKENS, units="word", device=device, unk_offset=-4.0)


def _neural(kind: str) -> Callable[[str], NeuralLMScorer]:
    def build(device: str) -> NeuralLMScorer:
        torch.manual_seed(5)
        lm = (LSTMLM(len(TOKENS), embed_dim=16, hidden_size=24, num_layers=2) if kind == "lstm" else
              TransformerLM(len(TOKENS), d_model=16, num_heads=4, ffn_dim=32, num_layers=2))
        return NeuralLMScorer(lm.to(device))
    return build


LMS: Dict[str, tuple] = {
    "token-dense": (_token_lm, CHAR2_TOKENS, ["AB", "C", "BA", "ABC"]),
    "token-lookup": (_token_lm_lookup, CHAR2_TOKENS, ["AB", "C", "BA", "ABC"]),
    "word": (_word_lm, TOKENS, WORDS + ["CAD", "TO"]),  # two words outside the LM
    "lstm": (_neural("lstm"), TOKENS, WORDS),
    "transformer": (_neural("transformer"), TOKENS, WORDS),
}


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("pruned", [False, True])
@pytest.mark.parametrize("lm", sorted(LMS))
def test_prefix_search_with_lm_on_cuda_equals_cpu(lm: str, pruned: bool, cuda_graph: bool) -> None:
    build, tokens, words = LMS[lm]
    lp, lengths = spelled_log_probs(tokens, words, batch=6, seed=len(lm))
    prune = {} if pruned else dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None)
    kw = dict(beam=6, nbest=3, weights={"lm": 0.8, "length_bonus": 0.5}, **prune)
    cpu = ctc_prefix_beam_search(lp, lengths, scorers={"lm": build("cpu")}, native=False, **kw)
    plain = ctc_prefix_beam_search(lp, lengths, **{**kw, "weights": {}})
    assert not torch.equal(cpu.tokens, plain.tokens), "the LM changed nothing: the test would not see it on CUDA"
    gpu = ctc_prefix_beam_search(lp.cuda(), lengths.cuda(), scorers={"lm": build("cuda")}, cuda_graph=cuda_graph,
                                 **kw)
    assert gpu.tokens.is_cuda and gpu.scores.is_cuda
    assert torch.equal(gpu.tokens.cpu(), cpu.tokens) and torch.equal(gpu.token_frames.cpu(), cpu.token_frames)
    torch.testing.assert_close(gpu.scores.cpu(), cpu.scores, atol=2e-4, rtol=0)
    torch.testing.assert_close(gpu.ctc_scores.cpu(), cpu.ctc_scores, atol=2e-4, rtol=0)


@pytest.mark.parametrize("lm", sorted(LMS))
def test_batches_of_one_bucket_replay_one_captured_loop(lm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three batches of one shape bucket through one scorer replay the graph captured for the first (a fourth, of
    # another batch size, captures its own): a replay never sees a previous batch's tables or LM states. (The
    # n-grams through the captured loop too, not the one-launch search that takes them by default.)
    monkeypatch.setattr(fused_search, "FUSED_SCORERS", False)
    build, tokens, words = LMS[lm]
    scorer, ref = build("cuda"), build("cpu")
    prefix_graph.clear()
    first = spelled_log_probs(tokens, words, batch=4, seed=1)
    for seed, order in ((1, [0, 1, 2, 3]), (2, [2, 0, 3, 1]), (3, [3, 2, 1, 0]), (4, None)):
        # the first batch's rows reordered (the same steps: one bucket), then a batch of another size
        lp, lengths = (first[0][order], first[1][order]) if order else spelled_log_probs(tokens, words, 7, seed)
        kw = dict(beam=5, weights={"lm": 0.8, "length_bonus": 0.5})
        want = ctc_prefix_beam_search(lp, lengths, scorers={"lm": ref}, native=False, **kw)
        got = ctc_prefix_beam_search(lp.cuda(), lengths.cuda(), scorers={"lm": scorer}, **kw)  # auto: captured
        assert torch.equal(got.tokens.cpu(), want.tokens), f"batch {seed}"
        torch.testing.assert_close(got.scores.cpu(), want.scores, atol=2e-4, rtol=0)
    assert sorted(e.runs for e in prefix_graph._CACHE.values()) == [1, 3]
    prefix_graph.clear()


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("with_lm", [False, True])
def test_prefix_search_with_hotwords_on_cuda_equals_cpu(with_lm: bool, cuda_graph: bool) -> None:
    # The hotword automaton's tables move to the search's device; beside the word LM too.
    lp, lengths = spelled_log_probs(TOKENS, WORDS, batch=6, seed=11)

    def scorers(device: str, hotwords: bool = True) -> dict:
        out = {"lm": _word_lm(device)} if with_lm else {}
        if hotwords:
            out["hotwords"] = hotword_scorer(["CAT ON", "DOG", "MAT"], spell_with_tokens(TOKENS), TOKENS)
        return out
    weights = {"hotwords": 2.0, "length_bonus": 0.5, **({"lm": 0.8} if with_lm else {})}
    kw = dict(beam=6, nbest=3, weights=weights)
    cpu = ctc_prefix_beam_search(lp, lengths, scorers=scorers("cpu"), native=False, **kw)
    plain = ctc_prefix_beam_search(lp, lengths, scorers=scorers("cpu", hotwords=False), native=False,
                                   **{**kw, "weights": {k: w for k, w in weights.items() if k != "hotwords"}})
    assert not torch.equal(cpu.tokens, plain.tokens), "the hotwords changed nothing: the test would not see it on CUDA"
    gpu = ctc_prefix_beam_search(lp.cuda(), lengths.cuda(), scorers=scorers("cuda"), cuda_graph=cuda_graph, **kw)
    assert torch.equal(gpu.tokens.cpu(), cpu.tokens) and torch.equal(gpu.token_frames.cpu(), cpu.token_frames)
    torch.testing.assert_close(gpu.scores.cpu(), cpu.scores, atol=2e-4, rtol=0)
