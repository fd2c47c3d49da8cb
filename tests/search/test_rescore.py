"""Attention rescoring of an N-best list."""
from __future__ import annotations

import pytest
import torch

from asrkit.search import NBest, attention_rescore, ctc_prefix_beam_search
from test_ctc_prefix import BigramScorer, peaky_log_probs

NEG_INF = float("-inf")


def first_pass(seed: int = 0, lm: bool = True) -> NBest:
    gen = torch.Generator().manual_seed(seed)
    lp = peaky_log_probs(3, 30, 8, gen, max_eps=0.6)
    scorers, weights = ({"lm": BigramScorer(8, gen)}, {"lm": 0.5, "length_bonus": 0.7}) if lm else ({}, {})
    return ctc_prefix_beam_search(lp, torch.tensor([30, 22, 12]), beam=6, scorers=scorers, weights=weights)


def fake_decoder(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A deterministic "decoder score" of each padded row: depends on the tokens only."""
    weights = torch.arange(1, tokens.shape[1] + 1, dtype=torch.float32).sin()
    return -(torch.where(tokens >= 0, tokens, 0).float() * weights).abs().sum(1) - 0.3 * lengths


def test_ctc_weight_one_keeps_the_first_pass_order_and_scores() -> None:
    nbest = first_pass()
    out = attention_rescore(nbest, fake_decoder, ctc_weight=1.0)
    for name in ("tokens", "lengths", "scores", "ctc_scores", "token_frames"):
        assert torch.equal(getattr(out, name), getattr(nbest, name)), name


def test_ctc_weight_zero_ranks_by_decoder_score_plus_the_lm_part() -> None:
    nbest = first_pass()
    n = nbest.nbest
    att = fake_decoder(nbest.tokens.reshape(3 * n, -1), nbest.lengths.reshape(3 * n)).view(3, n)
    want = att + nbest.scores - nbest.ctc_scores  # LM + bonus part stays
    out = attention_rescore(nbest, fake_decoder, ctc_weight=0.0)
    got = out.to_lists()
    for b, hyps in enumerate(nbest.to_lists()):
        order = sorted(range(len(hyps)), key=lambda k: -float(want[b, k]))
        assert [h.tokens for h in got[b]] == [hyps[k].tokens for k in order]
        assert [h.score for h in got[b]] == pytest.approx([float(want[b, k]) for k in order], abs=1e-4)
        assert [h.ctc_score for h in got[b]] == pytest.approx([hyps[k].ctc_score for k in order])
        assert [h.token_frames for h in got[b]] == [hyps[k].token_frames for k in order]


def test_picks_the_hypothesis_the_decoder_prefers_on_a_constructed_case() -> None:
    # CTC prefers [5, 6] a little; the decoder strongly prefers [5, 7]; empty slot last.
    tokens = torch.tensor([[[5, 6], [5, 7], [-1, -1]]])
    nbest = NBest(tokens=tokens, lengths=torch.tensor([[2, 2, 0]]), scores=torch.tensor([[-1.0, -1.5, NEG_INF]]),
                  ctc_scores=torch.tensor([[-1.0, -1.5, NEG_INF]]), token_frames=torch.full_like(tokens, -1))
    seen = {}

    def score_fn(tok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        seen["tokens"], seen["lengths"] = tok.clone(), lengths.clone()
        return torch.tensor([-6.0, -2.0, -0.1])  # the empty slot gets the best score: must be ignored

    out = attention_rescore(nbest, score_fn, ctc_weight=0.5)
    assert seen["tokens"].tolist() == [[5, 6], [5, 7], [-1, -1]] and seen["lengths"].tolist() == [2, 2, 0]
    assert out.tokens[0].tolist() == [[5, 7], [5, 6], [-1, -1]]
    assert out.scores[0].tolist() == [pytest.approx(0.5 * -1.5 + 0.5 * -2.0), pytest.approx(0.5 * -1.0 + 0.5 * -6.0),
                                      NEG_INF]
    assert out.ctc_scores[0].tolist() == [-1.5, -1.0, NEG_INF]
    assert out.best()[0].tokens == [5, 7]


def test_rescoring_with_a_real_tiny_model_follows_the_formula() -> None:
    # Catches: any other combination of the CTC, decoder and LM/bonus terms (weights swapped, the
    # LM/bonus part dropped or double-counted, the decoder score of the wrong row or without <eos>),
    # and hypotheses separated from their own scores by the re-sort. Every term is computed here
    # independently: CTC with torch's ctc_loss, the decoder one step at a time from scratch (not the
    # batched teacher-forced pass that rescoring uses), the LM/bonus part from the bigram table.
    # Utterances of 3 and 2 encoder frames and a beam of 1464 (every prefix of <= 3 of the 11
    # tokens) make the first pass exhaustive, so its CTC scores are exact.
    import torch.nn.functional as F
    from pathlib import Path

    from asrkit.config import load_config
    from asrkit.models.registry import build_model

    torch.manual_seed(0)
    model = build_model(load_config(Path(__file__).resolve().parents[2] / "conf" / "tiny_transformer.yaml"), 12)
    model.eval()
    gen = torch.Generator().manual_seed(1)
    wav = 0.1 * torch.randn(2, 3200, generator=gen)
    lm, alpha, beta, ctc_weight = BigramScorer(12, gen), 0.5, 0.7, 0.3
    with torch.no_grad():
        enc, enc_lens = model.encode(wav, torch.tensor([3200, 2400]))
        lp = model.ctc_log_probs(enc).double()
        nbest = ctc_prefix_beam_search(lp, enc_lens, beam=1464, nbest=6, scorers={"lm": lm},
                                       weights={"lm": alpha, "length_bonus": beta}, token_topk=None,
                                       token_min_logp=None, blank_skip_threshold=None)
    assert enc_lens.tolist() == [3, 2]
    rows = torch.arange(2).repeat_interleave(nbest.nbest)
    out = attention_rescore(nbest, lambda t, n: model.score_tokens(enc[rows], enc_lens[rows], t, n), ctc_weight)

    def decoder_score(b: int, tokens: list) -> float:
        total = 0.0
        with torch.no_grad():
            for i, nxt in enumerate(tokens + [2]):  # ..., <eos> (2)
                ys = torch.tensor([[2] + tokens[:i]])  # <sos> (2) y_1 .. y_i
                total += float(model.decode_step(ys, enc[b:b + 1], enc_lens[b:b + 1], None)[0][0, nxt])
        return total

    first, got = nbest.to_lists(), out.to_lists()
    for b in range(2):
        want = {}
        for h in first[b]:
            ctc = -float(F.ctc_loss(lp[b, :int(enc_lens[b]), None], torch.tensor([h.tokens]), enc_lens[b:b + 1],
                                    torch.tensor([len(h.tokens)]), reduction="sum", zero_infinity=False))
            prev = [2] + h.tokens
            lm_bonus = alpha * sum(float(lm.table[p, c]) for p, c in zip(prev, h.tokens)) \
                + alpha * float(lm.eos[prev[-1]]) + beta * len(h.tokens)
            assert h.ctc_score == pytest.approx(ctc, abs=1e-9)  # the first pass is exact here
            assert h.score - h.ctc_score == pytest.approx(lm_bonus, abs=1e-9)
            want[tuple(h.tokens)] = (ctc_weight * ctc + (1 - ctc_weight) * decoder_score(b, h.tokens) + lm_bonus,
                                     h.ctc_score, h.token_frames)
        assert len(got[b]) == len(want) == nbest.nbest
        for h in got[b]:
            score, ctc, frames = want[tuple(h.tokens)]
            assert h.score == pytest.approx(score, abs=1e-4)
            assert h.ctc_score == ctc and h.token_frames == frames
        scores = [h.score for h in got[b]]
        assert scores == sorted(scores, reverse=True)
    assert any([h.tokens for h in g] != [h.tokens for h in f] for g, f in zip(got, first))  # the order changed
