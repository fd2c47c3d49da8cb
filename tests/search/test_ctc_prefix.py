"""The batched CTC prefix beam search against a simple dict-based reference."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import LengthBonus, NBest, WordCount, ctc_prefix_beam_search, greedy_search
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
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
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
    expected = ctc_prefix_beam_search(lp, lengths, beam=4, native=False)  # the torch loop splits batches
    real = ctc_prefix._search_batch
    sizes = []

    def flaky(lp_: torch.Tensor, *args, **kwargs):
        sizes.append(lp_.shape[0])
        if lp_.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(lp_, *args, **kwargs)

    monkeypatch.setattr(ctc_prefix, "_search_batch", flaky)
    got = ctc_prefix_beam_search(lp, lengths, beam=4, native=False)
    assert sizes == [5, 2, 3, 1, 2]
    assert [[h.tokens for h in u] for u in got.to_lists()] == [[h.tokens for h in u] for u in expected.to_lists()]
    assert torch.allclose(got.scores, expected.scores)

    def always(lp_: torch.Tensor, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ctc_prefix, "_search_batch", always)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ctc_prefix_beam_search(lp[:1], lengths[:1], beam=4, native=False)


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
    (dict(weights={"length_bonus": float("-inf")}), "weight 'length_bonus' is -inf: weights must be finite"),
    (dict(blank_skip_threshold=1.5), "blank_skip_threshold"),
    # Catches: the open interval (0, 1) of blank_skip_threshold closed at either end; a token_topk
    # error that does not name the value.
    (dict(blank_skip_threshold=0.0), "blank_skip_threshold must be in \\(0, 1\\) or None, got 0.0"),
    (dict(blank_skip_threshold=1.0), "blank_skip_threshold must be in \\(0, 1\\) or None, got 1.0"),
    (dict(token_topk=0), "token_topk must be >= 1 or None, got 0"),
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


WORD_PIECES = ["<blank>", "\u2581", "\u2581A", "B", "C", "\u2581"]  # lone marks, a mark with a letter, letters


def words_closed(prefix) -> Tuple[int, int]:
    """(words in the prefix's text, those of them a boundary has closed): the reference of WordCount."""
    text = "".join(WORD_PIECES[t] for t in prefix).replace("\u2581", " ")
    words = len(text.split())
    return words, words if text.endswith(" ") or not words else words - 1


def test_word_bonus_counts_words_as_they_close() -> None:
    # The bonus per word counted word-boundary tokens: a char tokenizer's "A B" earned 1, a leading, trailing
    # or doubled boundary earned one with no word. Each word now scores once, when a boundary (or the end)
    # closes it, so a hypothesis earns beta * |W|.
    gen = torch.Generator().manual_seed(12)
    lp = random_log_probs(2, 20, 6, gen)
    lengths = torch.tensor([20, 14])
    closes = torch.tensor([False, True, True, False, False, True])
    opens = torch.tensor([-1, 0, 1, 1, 1, 0])
    got = ctc_prefix_beam_search(lp, lengths, beam=4, scorers={"length_bonus": WordCount(closes, opens)},
                                 weights={"length_bonus": 2.0}, **EXACT)
    assert_same(got, lp, lengths, 4, 1e-9,
                token_score=lambda p, c: 2.0 * (words_closed(p + (c,))[1] - words_closed(p)[1]),
                final_score=lambda p: 2.0 * (words_closed(p)[0] - words_closed(p)[1]))
    for hyp in got.to_lists()[0]:  # the whole bonus is 2 per word of the hypothesis
        assert hyp.score - hyp.ctc_score == pytest.approx(2.0 * words_closed(tuple(hyp.tokens))[0], abs=1e-9)


def topk_candidates(lp: torch.Tensor, k: int, min_logp: Optional[float] = None):
    """candidates(t) for the reference: the k best non-blank tokens of frame t (ids 1..), those at or
    above min_logp (computed here from the frame, not by the module)."""
    def cands(t: int) -> List[int]:
        vals, ids = lp[t, 1:].topk(min(k, lp.shape[1] - 1))
        return [int(i) + 1 for i, v in zip(ids, vals) if min_logp is None or float(v) >= min_logp]
    return cands


@pytest.mark.parametrize("topk", [1, 3])
def test_token_topk_limits_new_prefixes_to_the_best_tokens(topk: int) -> None:
    # Catches: token_topk ignored (every token a candidate), not passed on to the frame tables, or
    # floored at 2 instead of 1. Flat frames make the pruning bind (checked against the exact search).
    gen = torch.Generator().manual_seed(20)
    lp = random_log_probs(3, 15, 12, gen, scale=1.0)
    lengths = torch.tensor([15, 11, 6])
    got = ctc_prefix_beam_search(lp, lengths, beam=6, token_topk=topk, token_min_logp=None,
                                 blank_skip_threshold=None)
    exact = ctc_prefix_beam_search(lp, lengths, beam=6, **EXACT)
    assert not torch.equal(got.tokens, exact.tokens)  # the pruning matters on this input
    for b in range(3):
        ref = ref_nbest(lp[b], int(lengths[b]), 6, candidates=topk_candidates(lp[b], topk))
        mine = got.to_lists()[b]
        assert [tuple(h.tokens) for h in mine] == [r[0] for r in ref], f"utterance {b}"
        assert [h.score for h in mine] == pytest.approx([r[1] for r in ref], abs=1e-9)


def test_defaults_are_beam_10_and_the_documented_pruning() -> None:
    # Catches: a changed default beam (10) or token_topk (8) (token_min_logp -12, blank_skip 0.999).
    gen = torch.Generator().manual_seed(21)
    lp = random_log_probs(2, 20, 30, gen, scale=0.5)  # flat frames: the 9th best token would matter
    lp[1, 5:9] = torch.tensor([0.9995, *([0.0005 / 29] * 29)], dtype=torch.float64).log()  # skipped frames
    lengths = torch.tensor([20, 17])
    got = ctc_prefix_beam_search(lp, lengths)
    assert got.scores.shape == (2, 10)
    for b in range(2):
        ref = ref_nbest(lp[b], int(lengths[b]), 10, candidates=topk_candidates(lp[b], 8, -12.0),
                        skip_blank_above=0.999)
        mine = got.to_lists()[b]
        assert [tuple(h.tokens) for h in mine] == [r[0] for r in ref], f"utterance {b}"
        assert [h.score for h in mine] == pytest.approx([r[1] for r in ref], abs=1e-9)


def test_token_min_logp_keeps_a_token_at_the_threshold_and_blocks_pruned_repeats() -> None:
    # Catches: a token exactly at token_min_logp dropped (`<=` for `<`); a pruned token still
    # creating the new prefix "p + c" by a blank-separated repeat of p's own last token c.
    at = torch.tensor([[[0.55, 0.25, 0.2]]], dtype=torch.float64).log()
    min_logp = float(at[0, 0, 1])  # token 1 sits exactly at the threshold, token 2 below
    got = ctc_prefix_beam_search(at, torch.tensor([1]), beam=3, token_topk=None, token_min_logp=min_logp,
                                 blank_skip_threshold=None)
    assert [h.tokens for h in got.to_lists()[0]] == [[], [1]]

    probs = torch.tensor([[0.1, 0.8, 0.1], [0.9, 0.05, 0.05], [0.5, 0.01, 0.49], [0.6, 0.3, 0.1]],
                         dtype=torch.float64)
    lp = probs.log()[None]
    min_logp = math.log(0.02)  # frame 2: token 1 is pruned, so no prefix may end in a new "1" there
    got = ctc_prefix_beam_search(lp, torch.tensor([4]), beam=10, token_topk=None, token_min_logp=min_logp,
                                 blank_skip_threshold=None)
    assert_same(got, lp, torch.tensor([4]), 10, 1e-12, candidates=topk_candidates(lp[0], 2, min_logp))


def test_blank_skipping_needs_a_blank_probability_above_the_threshold() -> None:
    # Catches: `>=` for `>`: a frame whose blank probability equals the threshold is not skipped.
    lp = torch.tensor([[[math.log(0.5), math.log(0.3), math.log(0.2)]]], dtype=torch.float64)
    got = ctc_prefix_beam_search(lp, torch.tensor([1]), beam=3, token_topk=None, token_min_logp=None,
                                 blank_skip_threshold=0.5)
    assert [h.tokens for h in got.to_lists()[0]] == [[], [1], [2]]
    assert_same(got, lp, torch.tensor([1]), 3, 1e-12, skip_blank_above=0.5)


class CheckedBigram(BigramScorer):
    """BigramScorer that asserts the scorer protocol on every call: score sees real token ids; select_state
    rows stay in their utterance and its tokens are real ids or exactly -1 ("prefix unchanged")."""

    def __init__(self, vocab: int, gen: torch.Generator, beam: int) -> None:
        super().__init__(vocab, gen)
        self.vocab, self.beam, self.selects = vocab, beam, 0

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert bool(((tokens >= 1) & (tokens < self.vocab)).all()), tokens
        return super().score(state, tokens)

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.selects += 1
        assert bool(((tokens == -1) | ((tokens >= 1) & (tokens < self.vocab))).all()), tokens
        assert torch.equal(index // self.beam, torch.arange(index.shape[0]) // self.beam), index
        return super().select_state(state, index, tokens)


def test_two_scorers_are_each_weighted_and_keep_the_search_dtype() -> None:
    # Catches: every scorer after the first added with weight 1.0; a float64 scorer's final score
    # turning a float32 search's scores into float64; stays passed to select_state as another
    # negative id than -1, or rows moved between utterances.
    gen = torch.Generator().manual_seed(22)
    for trial in range(4):
        b, t, v = 2, 8 + 3 * trial, 5 + trial
        lp = random_log_probs(b, t, v, gen)
        lengths = torch.tensor([t, t - 3])
        lm, lm2 = CheckedBigram(v, gen, 5), CheckedBigram(v, gen, 5)
        weights = {"lm": 0.4, "lm2": 0.7, "length_bonus": 0.3}

        def token_score(prefix, c):
            return lm.ref_token(0.4, 0.3)(prefix, c) + lm2.ref_token(0.7, 0.0)(prefix, c)

        def final_score(prefix):
            return lm.ref_final(0.4)(prefix) + lm2.ref_final(0.7)(prefix)

        got = ctc_prefix_beam_search(lp, lengths, beam=5, scorers={"lm": lm, "lm2": lm2}, weights=weights, **EXACT)
        assert lm.selects == t and lm2.selects == t
        assert_same(got, lp, lengths, 5, 1e-9, token_score=token_score, final_score=final_score)
        got32 = ctc_prefix_beam_search(lp.float(), lengths, beam=5, scorers={"lm": lm, "lm2": lm2}, weights=weights,
                                       **EXACT)
        assert got32.scores.dtype == torch.float32 and got32.ctc_scores.dtype == torch.float32
        assert_same(got32, lp.float().double(), lengths, 5, 1e-4, full_list=False, token_score=token_score,
                    final_score=final_score)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_is_searched_in_float32(dtype: torch.dtype) -> None:
    # Catches: float16 / bfloat16 input searched in its own precision (an ulp of 0.03 at a score of
    # -60: the scores drift by ~0.1 over 60 frames) instead of being upcast to float32.
    gen = torch.Generator().manual_seed(23)
    lp = peaky_log_probs(3, 60, 9, gen, max_eps=0.4).to(dtype)
    lengths = torch.tensor([60, 45, 17])
    got = ctc_prefix_beam_search(lp, lengths, beam=5, **EXACT)
    assert got.scores.dtype == torch.float32
    assert_same(got, lp.double(), lengths, 5, 1e-4, full_list=False)
    # Catches: the skipped-blank tail (summed in float64) not cast back, turning the scores float64.
    skipping = ctc_prefix_beam_search(lp, lengths, beam=5)
    assert skipping.scores.dtype == torch.float32 and skipping.ctc_scores.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32])
def test_lengths_of_any_integer_dtype_are_accepted(dtype: torch.dtype) -> None:
    # Catches: lengths kept in their own integer dtype (int16 lengths then fail as gather indices in
    # the blank-skipping tables).
    gen = torch.Generator().manual_seed(28)
    lp = peaky_log_probs(3, 30, 6, gen)
    lengths = torch.tensor([30, 18, 7])
    got = ctc_prefix_beam_search(lp, lengths.to(dtype), beam=4, token_topk=None, token_min_logp=None,
                                 blank_skip_threshold=0.99)
    assert_same(got, lp, lengths, 4, 1e-9, skip_blank_above=0.99)


def test_zero_frames_empty_batch_and_all_skipped_frames() -> None:
    # Catches: zero-frame input or an empty batch failing; the all-blank case (every frame of every
    # utterance skipped, so no frame is left to search) losing the blank mass of the frames; empty
    # slots (fewer hypotheses than the beam) getting tokens instead of -1 padding.
    gen = torch.Generator().manual_seed(24)
    lm = BigramScorer(5, gen)
    for settings in (EXACT, {}):
        got = ctc_prefix_beam_search(torch.zeros(2, 0, 5), torch.tensor([0, 0]), beam=3, scorers={"lm": lm},
                                     weights={"lm": 0.5}, **settings)
        assert got.scores.shape == (2, 3)
        for hyps in got.to_lists():
            assert len(hyps) == 1 and hyps[0].tokens == [] and hyps[0].ctc_score == 0.0
            assert hyps[0].score == pytest.approx(0.5 * float(lm.eos[2]), abs=1e-6)  # the LM's end score only

    empty = ctc_prefix_beam_search(torch.zeros(0, 7, 5), torch.zeros(0, dtype=torch.long), beam=3)
    assert empty.scores.shape == (0, 3) and empty.to_lists() == []

    probs = torch.full((2, 40, 4), 0.0002 / 3, dtype=torch.float64)
    probs[..., 0] = 0.9998
    lengths = torch.tensor([40, 23])
    got = ctc_prefix_beam_search(probs.log(), lengths, beam=4)  # default blank_skip_threshold 0.999
    for b, hyps in enumerate(got.to_lists()):
        assert [h.tokens for h in hyps] == [[]]
        want = -torch.nn.functional.ctc_loss(probs.log()[b, :, None], torch.zeros(1, 0, dtype=torch.long),
                                             lengths[b:b + 1], torch.tensor([0]), reduction="sum")
        assert hyps[0].ctc_score == pytest.approx(float(want), abs=1e-12)  # = lengths[b] * log(0.9998)

    one = torch.tensor([[[0.3, 0.7]]], dtype=torch.float64).log()  # two prefixes for a beam of 4
    got = ctc_prefix_beam_search(one, torch.tensor([1]), beam=4, **EXACT)
    assert got.scores[0, 2:].tolist() == [float("-inf")] * 2
    assert got.lengths[0].tolist() == [1, 0, 0, 0] and got.tokens[0, 1:].eq(-1).all()


@pytest.mark.parametrize("lengths,skip", [([180, 180, 180], None), ([180, 150, 33], None), ([180, 150, 33], 0.999)])
def test_large_vocab_reads_own_tokens_from_the_right_input_frames(lengths: list, skip: Optional[float],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: the log-prob of a hypothesis's own last token (read per step from the full input, not
    # from the (B, T', C) candidate table) taken from the wrong utterance or frame, on each of the
    # two paths: (B, V) frame views when no frame is skipped, flat offsets of compacted frames.
    gen = torch.Generator().manual_seed(25)
    lp = peaky_log_probs(3, 180, 2000, gen, dtype=torch.float32)
    lengths_t = torch.tensor(lengths)
    made = []
    real = prefix_loop.FrameTables

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(prefix_loop, "FrameTables", spy)
    got = ctc_prefix_beam_search(lp, lengths_t, beam=4, token_topk=4, token_min_logp=None, blank_skip_threshold=skip,
                                 native=False)
    assert (made[0].lp_rows is not None) == (skip is None)  # frame views (+ padding bias) or flat offsets
    for b in (1, 2):  # the python reference is slow on 2000 tokens: two utterances
        ref = ref_nbest(lp[b].double(), int(lengths_t[b]), 4, candidates=topk_candidates(lp[b].double(), 4),
                        skip_blank_above=skip)
        mine = got.to_lists()[b]
        assert [tuple(h.tokens) for h in mine][:1] == [r[0] for r in ref][:1]
        assert mine[0].score == pytest.approx(ref[0][1], abs=1e-3)


def test_cpu_search_runs_on_one_thread_and_restores_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: the thread count not lowered to 1 for the search (or lowered to another count), not
    # restored after it, or not restored when the search raises.
    seen = []
    real = prefix_loop.frame_loop

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    gen = torch.Generator().manual_seed(26)
    lp = random_log_probs(2, 10, 5, gen)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(prefix_loop, "frame_loop", spy)
        ctc_prefix_beam_search(lp, torch.tensor([10, 7]), beam=3, native=False)
        assert seen == [1] and torch.get_num_threads() == 2

        def boom(*args, **kwargs):
            raise RuntimeError("boom")

        monkeypatch.setattr(prefix_loop, "frame_loop", boom)
        with pytest.raises(RuntimeError, match="boom"):
            ctc_prefix_beam_search(lp, torch.tensor([10, 7]), beam=3, native=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_out_of_memory_splits_down_to_single_utterances(monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: a batch of two re-raised instead of split; a single utterance split into an empty
    # half and itself (endless recursion instead of the out-of-memory error).
    gen = torch.Generator().manual_seed(27)
    lp = peaky_log_probs(3, 20, 6, gen)
    lengths = torch.tensor([20, 9, 14])
    expected = ctc_prefix_beam_search(lp, lengths, beam=3, native=False)  # the torch loop splits batches
    real = ctc_prefix._search_batch
    sizes = []

    def only_single(lp_: torch.Tensor, *args, **kwargs):
        sizes.append(lp_.shape[0])
        if lp_.shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(lp_, *args, **kwargs)

    monkeypatch.setattr(ctc_prefix, "_search_batch", only_single)
    got = ctc_prefix_beam_search(lp, lengths, beam=3, native=False)
    assert sizes == [3, 1, 2, 1, 1]
    assert torch.equal(got.tokens, expected.tokens) and torch.allclose(got.scores, expected.scores)

    def any_rows(lp_: torch.Tensor, *args, **kwargs):
        if lp_.shape[0] > 0:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(lp_, *args, **kwargs)

    monkeypatch.setattr(ctc_prefix, "_search_batch", any_rows)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ctc_prefix_beam_search(lp, lengths, beam=3, native=False)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("settings", [EXACT, {}])
def test_cuda_graph_flag_gives_the_same_results(device: str, settings: dict) -> None:
    # On CPU the flag runs the same eager loop (there is no graph to capture), so this checks that
    # the flag changes nothing there; on a CUDA machine it compares the captured and replayed loop,
    # LM scorer states included, with the eager one. (The development machine had no GPU.)
    gen = torch.Generator().manual_seed(30)
    lp = peaky_log_probs(4, 40, 12, gen, dtype=torch.float32).to(device)
    lengths = torch.tensor([40, 31, 40, 7], device=device)
    lm = BigramScorer(12, gen)
    lm.table, lm.eos = lm.table.to(device), lm.eos.to(device)
    for scorers, weights in (({}, {}), ({"lm": lm}, {"lm": 0.5, "length_bonus": 0.4})):
        kw = dict(beam=6, scorers=scorers, weights=weights, **settings)
        eager = ctc_prefix_beam_search(lp, lengths, cuda_graph=False, **kw)
        graph = ctc_prefix_beam_search(lp, lengths, cuda_graph=True, **kw)
        assert torch.equal(eager.tokens, graph.tokens) and torch.equal(eager.token_frames, graph.token_frames)
        assert torch.allclose(eager.scores, graph.scores, atol=1e-5)


@pytest.mark.parametrize("with_lm", [False, True])
def test_exact_search_over_many_tokens_equals_reference(with_lm: bool) -> None:
    # Catches: the per-pick hash bookkeeping used when every one of more than 32 tokens is a candidate
    # (exact search, "wide") diverging from the candidate-table path: wrong repeat column, wrong
    # parents or tokens after a pick, a stay taken for an extension.
    gen = torch.Generator().manual_seed(31)
    for trial in range(3):
        lp = (peaky_log_probs if trial % 2 else random_log_probs)(2, 14, 40, gen)
        lengths = torch.tensor([14, 9])
        kw, ref_kw = {}, {}
        if with_lm:
            lm = BigramScorer(40, gen)
            kw = dict(scorers={"lm": lm}, weights={"lm": 0.6, "length_bonus": 0.2})
            ref_kw = dict(token_score=lm.ref_token(0.6, 0.2), final_score=lm.ref_final(0.6))
        got = ctc_prefix_beam_search(lp, lengths, beam=5, **kw, **EXACT)
        assert_same(got, lp, lengths, 5, 1e-9, **ref_kw)
