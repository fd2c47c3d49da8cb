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


def fake_decoder(utts: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A deterministic "decoder score" of each padded row: depends on its utterance and tokens only."""
    weights = torch.arange(1, tokens.shape[1] + 1, dtype=torch.float32).sin()
    return -(torch.where(tokens >= 0, tokens, 0).float() * weights).abs().sum(1) - 0.3 * lengths - 0.7 * utts


def test_ctc_weight_one_keeps_the_first_pass_order_and_scores() -> None:
    nbest = first_pass()

    def no_decoder(*args: torch.Tensor) -> torch.Tensor:
        raise AssertionError("ctc_weight 1 needs no decoder pass")

    out = attention_rescore(nbest, no_decoder, ctc_weight=1.0)
    for name in ("tokens", "lengths", "scores", "ctc_scores", "token_frames"):
        assert torch.equal(getattr(out, name), getattr(nbest, name)), name


@pytest.mark.parametrize("max_rows", [1, 2, 5, 7, 512])
def test_chunks_score_every_live_row_once_with_its_utterance(max_rows: int) -> None:
    # Catches: a row scored with another utterance's index (rows // N), a chunk larger than max_rows,
    # a live row left out or scored twice, empty slots scored, tokens cut shorter than the chunk's
    # longest hypothesis, and results that depend on the chunking.
    full = first_pass()
    n = full.nbest
    dead = torch.zeros(3, n, dtype=torch.bool)
    dead[1, -2:] = dead[2, -1] = True  # empty slots: -inf, no tokens
    nbest = NBest(tokens=full.tokens.masked_fill(dead[..., None], -1), lengths=full.lengths.masked_fill(dead, 0),
                  scores=full.scores.masked_fill(dead, NEG_INF), ctc_scores=full.ctc_scores.masked_fill(dead, NEG_INF),
                  token_frames=full.token_frames.masked_fill(dead[..., None], -1))
    live = ~dead
    assert live.sum() > 7 and len(set(nbest.lengths[live].tolist())) > 2  # several chunks, several lengths
    calls = []

    def recording(utts: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        calls.append((utts.clone(), tokens.clone(), lengths.clone()))
        return fake_decoder(utts, tokens, lengths)

    out = attention_rescore(nbest, recording, ctc_weight=0.0, max_rows=max_rows)
    assert all(len(u) <= max_rows for u, _, _ in calls)
    assert sum(len(u) for u, _, _ in calls) == int(live.sum())
    seen = sorted((int(u), tuple(t[:int(n_)].tolist())) for c in calls for u, t, n_ in zip(*c))
    want = sorted((b, tuple(nbest.tokens[b, k, :int(nbest.lengths[b, k])].tolist()))
                  for b in range(3) for k in range(n) if live[b, k])
    assert seen == want
    for _, tokens, lengths in calls:
        assert tokens.shape[1] == int(lengths.max())
    whole = fake_decoder(torch.arange(3).repeat_interleave(n), nbest.tokens.reshape(3 * n, -1),
                         nbest.lengths.reshape(3 * n)).view(3, n)
    want_scores = (whole + nbest.scores - nbest.ctc_scores)[live]
    assert sorted(out.scores[out.scores > NEG_INF].tolist()) == pytest.approx(sorted(want_scores.tolist()), abs=1e-4)


def test_max_rows_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        attention_rescore(first_pass(), fake_decoder, ctc_weight=0.5, max_rows=0)


def test_ctc_weight_zero_ranks_by_decoder_score_plus_the_lm_part() -> None:
    nbest = first_pass()
    n = nbest.nbest
    att = fake_decoder(torch.arange(3).repeat_interleave(n), nbest.tokens.reshape(3 * n, -1),
                       nbest.lengths.reshape(3 * n)).view(3, n)
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

    def score_fn(utts: torch.Tensor, tok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        seen["utts"], seen["tokens"], seen["lengths"] = utts.clone(), tok.clone(), lengths.clone()
        return torch.tensor([-6.0, -2.0])

    out = attention_rescore(nbest, score_fn, ctc_weight=0.5)
    assert seen["tokens"].tolist() == [[5, 6], [5, 7]] and seen["lengths"].tolist() == [2, 2]  # no empty slot
    assert seen["utts"].tolist() == [0, 0]
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
    out = attention_rescore(nbest, lambda u, t, n: model.score_tokens(enc[u], enc_lens[u], t, n), ctc_weight,
                            max_rows=4)  # several passes, an empty hypothesis's among them

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


@pytest.mark.parametrize("ctc_weight", [-0.1, 1.5])
def test_ctc_weight_outside_zero_one_is_refused(ctc_weight: float) -> None:
    with pytest.raises(ValueError, match=rf"ctc_weight must be in \[0, 1\], got {ctc_weight}"):
        attention_rescore(first_pass(), fake_decoder, ctc_weight=ctc_weight)


def test_scores_keep_float64_precision_and_weight_one_returns_them_exactly() -> None:
    # Catches: decoder scores stored in float32 before the combination (-2 - 1e-10 would round to -2), and
    # ctc_weight 1 taking the general formula, whose (score - ctc) + ctc is not the score in floating point.
    tokens = torch.tensor([[[5, 6], [5, 7]]])
    scores = torch.tensor([[1e-17, -1.5]], dtype=torch.float64)
    nbest = NBest(tokens=tokens, lengths=torch.tensor([[2, 2]]), scores=scores,
                  ctc_scores=torch.tensor([[1.0, -1.5]], dtype=torch.float64), token_frames=torch.full_like(tokens, -1))

    def score_fn(utts: torch.Tensor, tok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.tensor([-2.0 - 1e-10, -3.0], dtype=torch.float64)

    assert attention_rescore(nbest, score_fn, ctc_weight=1.0).scores[0].tolist() == [1e-17, -1.5]
    out = attention_rescore(nbest, score_fn, ctc_weight=0.0)
    assert out.scores.dtype == torch.float64
    assert out.scores[0].tolist() == [-3.0, (1e-17 - 1.0) + (-2.0 - 1e-10)]  # float32: a tie at -3
