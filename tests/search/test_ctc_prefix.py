"""The batched CTC prefix beam search against a simple dict-based reference."""
from __future__ import annotations

import math
from typing import List, Tuple

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
from asrkit.search import LengthBonus, NBest, ctc_prefix_beam_search, greedy_search
from host_sync import no_host_sync
from reference_ctc_prefix import reference_prefix_search

EXACT = dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None)


def random_log_probs(b: int, t: int, v: int, gen: torch.Generator, scale: float = 2.0,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (torch.randn(b, t, v, generator=gen, dtype=dtype) * scale).log_softmax(-1)


def peaky_log_probs(b: int, t: int, v: int, gen: torch.Generator, max_eps: float = 0.5,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """CTC-like frames: one dominant class (blank 60% of the time) with probability 1 - eps,
    eps log-uniform in [1e-4, max_eps]; the rest spread over the other classes."""
    dominant = torch.where(torch.rand(b, t, generator=gen) < 0.6, 0, torch.randint(1, v, (b, t), generator=gen))
    eps = 10 ** (torch.rand(b, t, generator=gen, dtype=torch.float64) * (math.log10(max_eps) + 4) - 4)
    rest = torch.randn(b, t, v, generator=gen, dtype=torch.float64).mul(2)
    rest.scatter_(2, dominant[..., None], float("-inf"))
    lp = rest.log_softmax(-1) + eps.log()[..., None]
    lp.scatter_(2, dominant[..., None], torch.log1p(-eps)[..., None])
    return lp.to(dtype)


def ref_nbest(lp: torch.Tensor, length: int, beam: int, **kw) -> List[Tuple[tuple, float, float]]:
    return reference_prefix_search(lp[:length].tolist(), beam, **kw)


def assert_same(got: NBest, lp: torch.Tensor, lengths: torch.Tensor, beam: int, tol: float,
                full_list: bool = True, **ref_kw) -> None:
    hyps = got.to_lists()
    for b in range(lp.shape[0]):
        ref = ref_nbest(lp[b], int(lengths[b]), beam, **ref_kw)
        mine = [(tuple(h.tokens), h.score, h.ctc_score) for h in hyps[b]]
        if not full_list:
            mine, ref = mine[:1], ref[:1]
        assert [m[0] for m in mine] == [r[0] for r in ref], f"utterance {b}"
        for m, r in zip(mine, ref):
            assert m[1] == pytest.approx(r[1], abs=tol) and m[2] == pytest.approx(r[2], abs=tol)


class BigramScorer:
    """Tiny bigram LM for tests: state = previous token per hypothesis (sos = 2 at start)."""

    def __init__(self, vocab: int, gen: torch.Generator) -> None:
        table = torch.randn(vocab, vocab + 1, generator=gen, dtype=torch.float64).log_softmax(-1)
        self.table = table[:, :vocab].clone()
        self.table[:, 0] = 0.0  # the blank is never scored
        self.eos = table[:, vocab].clone()
        self.calls = 0

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch * beam,), 2, dtype=torch.long, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.table[state[:, None], tokens]

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens >= 0, tokens, state[index])

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        return self.eos[state]

    def ref_token(self, alpha: float, beta: float):
        return lambda prefix, c: alpha * float(self.table[prefix[-1] if prefix else 2, c]) + beta

    def ref_final(self, alpha: float):
        return lambda prefix: alpha * float(self.eos[prefix[-1] if prefix else 2])


@pytest.mark.parametrize("beam", [1, 4, 10, 24])  # 24: the sort-based parent search
def test_exact_search_equals_reference_on_random_and_peaky_inputs(beam: int) -> None:
    gen = torch.Generator().manual_seed(beam)
    for trial in range(60):
        b, t, v = 1 + trial % 4, 1 + (trial * 7) % 25, 2 + trial % 9
        make = peaky_log_probs if trial % 2 else random_log_probs
        lp = make(b, t, v, gen)
        lengths = torch.randint(0, t + 1, (b,), generator=gen)
        assert_same(ctc_prefix_beam_search(lp, lengths, beam=beam, **EXACT), lp, lengths, beam, 1e-9)


def test_float32_search_equals_reference_on_long_inputs() -> None:
    gen = torch.Generator().manual_seed(1)
    lp = peaky_log_probs(3, 120, 12, gen, dtype=torch.float32)
    lengths = torch.tensor([120, 77, 5])
    got = ctc_prefix_beam_search(lp, lengths, beam=6, **EXACT)
    assert got.scores.dtype == torch.float32
    assert_same(got, lp.double(), lengths, 6, 1e-4, full_list=False)


def test_large_vocab_with_pruning_equals_reference_with_the_same_candidates() -> None:
    gen = torch.Generator().manual_seed(2)
    lp = peaky_log_probs(2, 30, 500, gen)
    lengths = torch.tensor([30, 21])
    topk, min_logp = 8, -6.0
    got = ctc_prefix_beam_search(lp, lengths, beam=5, token_topk=topk, token_min_logp=min_logp,
                                 blank_skip_threshold=None)
    for b in range(2):
        def cands(t: int, b: int = b) -> List[int]:
            vals, ids = lp[b, t, 1:].topk(topk)
            return [int(i) + 1 for i, v in zip(ids, vals) if v >= min_logp]
        ref = ref_nbest(lp[b], int(lengths[b]), 5, candidates=cands)
        mine = got.to_lists()[b]
        assert [tuple(h.tokens) for h in mine] == [r[0] for r in ref]
        assert [h.score for h in mine] == pytest.approx([r[1] for r in ref], abs=1e-9)


def test_blank_skipping_equals_reference_with_pure_blank_frames() -> None:
    gen = torch.Generator().manual_seed(3)
    for trial in range(20):
        lp = peaky_log_probs(3, 40, 7, gen)
        lengths = torch.randint(0, 41, (3,), generator=gen)
        got = ctc_prefix_beam_search(lp, lengths, beam=5, token_topk=None, token_min_logp=None,
                                     blank_skip_threshold=0.99)
        assert_same(got, lp, lengths, 5, 1e-9, skip_blank_above=0.99)


@pytest.mark.parametrize("settings", [EXACT, {}, dict(blank_skip_threshold=None)])
def test_batch_equals_one_utterance_at_a_time(settings: dict) -> None:
    gen = torch.Generator().manual_seed(4)
    lp = peaky_log_probs(6, 50, 20, gen, dtype=torch.float32)
    lengths = torch.tensor([50, 3, 0, 49, 25, 50])
    lm = BigramScorer(20, gen)
    kw = dict(beam=7, scorers={"lm": lm}, weights={"lm": 0.4, "length_bonus": 0.5}, **settings)
    batched = ctc_prefix_beam_search(lp, lengths, **kw).to_lists()
    for b in range(6):
        single = ctc_prefix_beam_search(lp[b:b + 1, :max(int(lengths[b]), 1)], lengths[b:b + 1], **kw).to_lists()[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[b]]
        assert [h.token_frames for h in single] == [h.token_frames for h in batched[b]]
        assert [h.score for h in single] == pytest.approx([h.score for h in batched[b]], abs=1e-4)


def test_beam_one_equals_greedy_when_every_frame_is_peaky() -> None:
    # With one hypothesis, the greedy path wins every frame when each frame's best class has
    # probability >= 1/sqrt(2) (~0.71): the split between pb and pnb then never lets a merge
    # or a blank-separated repeat beat the argmax. Below that it can differ (next test).
    gen = torch.Generator().manual_seed(5)
    lp = peaky_log_probs(40, 60, 9, gen, max_eps=0.28)
    lengths = torch.randint(0, 61, (40,), generator=gen)
    beam1 = ctc_prefix_beam_search(lp, lengths, beam=1, **EXACT).to_lists()
    greedy = greedy_search(lp, lengths).to_lists()
    for b in range(40):
        assert beam1[b][0].tokens == greedy[b][0].tokens
        assert beam1[b][0].token_frames == greedy[b][0].token_frames


def test_beam_one_is_not_greedy_in_general() -> None:
    # Frame 1: a .45 b .35 blank .2 -> beam keeps "a". Frame 2: b .4 a .3 blank .3: staying at
    # "a" (.45 * (.3 + .3) = .27) beats "ab" (.45 * .4 = .18), while the greedy path reads "ab".
    probs = torch.tensor([[[0.2, 0.45, 0.35], [0.3, 0.3, 0.4]]], dtype=torch.float64)
    lengths = torch.tensor([2])
    assert ctc_prefix_beam_search(probs.log(), lengths, beam=1, **EXACT).best()[0].tokens == [1]
    assert greedy_search(probs.log(), lengths).best()[0].tokens == [1, 2]


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.0), (0.8, 1.5), (0.3, -0.7)])
def test_lm_fusion_equals_reference_with_the_same_fusion(alpha: float, beta: float) -> None:
    gen = torch.Generator().manual_seed(6)
    for trial in range(12):
        b, t, v = 1 + trial % 3, 5 + trial * 2, 3 + trial % 6
        lp = (peaky_log_probs if trial % 2 else random_log_probs)(b, t, v, gen)
        lengths = torch.randint(0, t + 1, (b,), generator=gen)
        lm = BigramScorer(v, gen)
        got = ctc_prefix_beam_search(lp, lengths, beam=5, scorers={"lm": lm},
                                     weights={"lm": alpha, "length_bonus": beta}, **EXACT)
        assert_same(got, lp, lengths, 5, 1e-9, token_score=lm.ref_token(alpha, beta),
                    final_score=lm.ref_final(alpha))


def test_zero_lm_weight_equals_no_lm_and_never_calls_the_scorer() -> None:
    gen = torch.Generator().manual_seed(7)
    lp = random_log_probs(4, 30, 8, gen)
    lengths = torch.tensor([30, 10, 29, 1])
    lm = BigramScorer(8, gen)
    with_lm = ctc_prefix_beam_search(lp, lengths, beam=6, scorers={"lm": lm}, weights={"lm": 0.0})
    without = ctc_prefix_beam_search(lp, lengths, beam=6)
    assert lm.calls == 0
    assert torch.equal(with_lm.tokens, without.tokens) and torch.equal(with_lm.scores, without.scores)


def test_length_bonus_scorer_equals_the_builtin_bonus() -> None:
    gen = torch.Generator().manual_seed(8)
    lp = random_log_probs(3, 25, 6, gen)
    lengths = torch.tensor([25, 12, 20])
    builtin = ctc_prefix_beam_search(lp, lengths, beam=4, weights={"length_bonus": 0.9}, **EXACT)
    scorer = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"length_bonus": LengthBonus()},
                                    weights={"length_bonus": 0.9}, **EXACT)
    assert torch.equal(builtin.tokens, scorer.tokens)
    assert torch.allclose(builtin.scores, scorer.scores, atol=1e-9)
    assert_same(builtin, lp, lengths, 4, 1e-9, token_score=lambda p, c: 0.9)


def test_default_pruning_agrees_with_exact_search_on_peaky_inputs() -> None:
    gen = torch.Generator().manual_seed(9)
    agree = total = 0
    for vocab in (29, 300):
        lp = peaky_log_probs(100, 60, vocab, gen, dtype=torch.float32)
        lengths = torch.randint(20, 61, (100,), generator=gen)
        exact = ctc_prefix_beam_search(lp, lengths, beam=10, **EXACT).best()
        for settings in ({}, dict(blank_skip_threshold=None)):  # defaults skip blank frames
            pruned = ctc_prefix_beam_search(lp, lengths, beam=10, **settings).best()
            agree += sum(p.tokens == e.tokens for p, e in zip(pruned, exact))
            total += len(exact)
    assert agree >= 0.99 * total, f"{agree}/{total}"


def test_frame_loop_never_syncs_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list = []
    monkeypatch.setattr(ctc_prefix, "_frame_loop", no_host_sync(ctc_prefix._frame_loop, ran))
    gen = torch.Generator().manual_seed(10)
    lp = peaky_log_probs(3, 40, 30, gen, dtype=torch.float32)
    lengths = torch.tensor([40, 17, 33])
    lm = BigramScorer(30, gen)
    for settings in ({}, EXACT, dict(blank_skip_threshold=None)):
        ctc_prefix_beam_search(lp, lengths, beam=5, scorers={"lm": lm, "length_bonus": LengthBonus()},
                               weights={"lm": 0.5, "length_bonus": 0.2}, **settings).to_lists()
    assert len(ran) == 3


def test_out_of_memory_splits_the_batch_and_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(11)
    lp = peaky_log_probs(5, 30, 10, gen, dtype=torch.float32)
    lengths = torch.tensor([30, 12, 28, 30, 7])
    expected = ctc_prefix_beam_search(lp, lengths, beam=4)
    real = ctc_prefix._search_batch
    sizes = []

    def flaky(lp_: torch.Tensor, *args, **kwargs):
        sizes.append(lp_.shape[0])
        if lp_.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(lp_, *args, **kwargs)

    monkeypatch.setattr(ctc_prefix, "_search_batch", flaky)
    got = ctc_prefix_beam_search(lp, lengths, beam=4)
    assert sizes == [5, 2, 3, 1, 2]
    assert [[h.tokens for h in u] for u in got.to_lists()] == [[h.tokens for h in u] for u in expected.to_lists()]
    assert torch.allclose(got.scores, expected.scores)

    def always(lp_: torch.Tensor, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ctc_prefix, "_search_batch", always)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ctc_prefix_beam_search(lp[:1], lengths[:1], beam=4)


def test_token_frames_and_nbest_shape() -> None:
    ids = torch.tensor([[0, 3, 3, 0, 0, 3, 0, 4, 4, 0]])
    lp = torch.nn.functional.one_hot(ids, 5).double().mul(8).log_softmax(-1)
    got = ctc_prefix_beam_search(lp, torch.tensor([10]), beam=3, nbest=2)
    assert got.scores.shape == (1, 2) and got.scores[0, 0] >= got.scores[0, 1]
    best = got.best()[0]
    assert best.tokens == [3, 3, 4] and best.token_frames == [1, 5, 7]


@pytest.mark.parametrize("kwargs,match", [
    (dict(lengths=torch.tensor([11])), "utterance 0.*length 11"),
    (dict(beam=0), "beam"),
    (dict(nbest=5, beam=4), "nbest"),
    (dict(weights={"lm": 1.0}), "weight 'lm' has no scorer"),
    (dict(scorers={"lm": LengthBonus()}), "scorer 'lm' has no weight"),
    (dict(blank_skip_threshold=1.5), "blank_skip_threshold"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    args = dict(log_probs=torch.zeros(1, 10, 4).log_softmax(-1), lengths=torch.tensor([10]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ctc_prefix_beam_search(**args)


def test_nan_input_names_utterance_and_frame() -> None:
    lp = torch.zeros(2, 6, 4).log_softmax(-1)
    lp[1, 4, 2] = float("nan")
    with pytest.raises(ValueError, match="utterance 1.*NaN or \\+inf at frame 4"):
        ctc_prefix_beam_search(lp, torch.tensor([6, 6]))


def test_per_word_length_bonus_counts_word_initial_tokens() -> None:
    gen = torch.Generator().manual_seed(12)
    lp = random_log_probs(2, 20, 6, gen)
    lengths = torch.tensor([20, 14])
    word_start = torch.tensor([False, True, False, True, False, False])
    got = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"length_bonus": LengthBonus(word_start)},
                                 weights={"length_bonus": 2.0}, **EXACT)
    assert_same(got, lp, lengths, 4, 1e-9, token_score=lambda p, c: 2.0 * float(word_start[c]))
