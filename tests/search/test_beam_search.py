"""The batched label-synchronous beam search against a simple per-utterance reference."""
from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import List, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F

from asrkit.search import CTCPrefixScorer, DecoderScorer, LengthBonus, beam_search, joint_beam_search
from asrkit.search.interfaces import GainBound
from host_sync import no_host_sync
from reference_beam_search import NEG_INF, RefCTC, length_penalty, reference_beam_search

bs = importlib.import_module("asrkit.search.beam_search")  # the module (the package exports a function of that name)
REPO = Path(__file__).resolve().parents[2]
EOS = 2


class ToyDecoder:
    """A random recurrent "decoder" with a StepDecoder interface, float64:
    h_i = tanh(0.5 h_{i-1} + E[y_{i-1}]), logits = W[y_{i-1}] + h_i + memory[i mod T_b]."""

    def __init__(self, vocab: int, gen: torch.Generator) -> None:
        self.table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * 2
        self.embed = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)

    def decode_step(self, ys, memory, memory_lens, state=None):
        h = torch.zeros(ys.shape[0], self.table.shape[0], dtype=torch.float64) if state is None else state[0]
        for tok in (ys.unbind(1) if state is None else (ys[:, -1],)):
            h = torch.tanh(0.5 * h + self.embed[tok])
        frame = (ys.shape[1] - 1) % memory_lens  # (N,)
        mem = memory.gather(1, frame[:, None, None].expand(-1, 1, memory.shape[2]))[:, 0]
        return (self.table[ys[:, -1]] + h + mem).log_softmax(-1), (h,)


class BigramScorer:
    """A tiny fake LM (or decoder) as a BatchScorer: next-token log-scores ``table[last token]`` (V, V),
    <sos> = <eos> = row 2; it scores all V tokens at once, so it can be a full scorer. ``ref`` is the
    same function of a whole prefix, for the reference search."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table.to(torch.float64)
        self.vocab_size = table.shape[0]

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch * beam,), EOS, dtype=torch.long, device=device)  # (N,) last token

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[state[:, None], tokens.clamp(min=0)]  # (N, C)

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens >= 0, tokens, state.index_select(0, index))

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        return self.table[state, EOS]

    def max_gain(self) -> GainBound:
        return 0.0, max(0.0, float(self.table.max())), False

    def ref(self, prefix) -> List[float]:
        return self.table[prefix[-1] if prefix else EOS].tolist()


def random_bigram(vocab: int, gen: torch.Generator) -> BigramScorer:
    return BigramScorer((torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * 3).log_softmax(-1))


def bigram_table(rows: dict, vocab: int = 6, floor: float = -30.0) -> torch.Tensor:
    """A (V, V) table of log-scores ``floor`` except ``rows[last][next]``."""
    table = torch.full((vocab, vocab), floor, dtype=torch.float64)
    for last, row in rows.items():
        for nxt, value in row.items():
            table[last, nxt] = value
    return table


def decoder_ref(decoder, memory: torch.Tensor, lens: torch.Tensor, b: int):
    """Reference decoder scores of utterance b: the whole prefix from scratch, one row."""
    def scores(prefix) -> List[float]:
        ys = torch.tensor([[EOS, *prefix]])
        with torch.no_grad():
            return decoder.decode_step(ys, memory[b:b + 1], lens[b:b + 1], None)[0][0].double().tolist()
    return scores


def problem(batch: int, frames: int, vocab: int, gen: torch.Generator, dim: Optional[int] = None):
    """Random memory (B, T, D), CTC log-probs (B, T, V), lengths (B,) >= 1."""
    memory = torch.randn(batch, frames, dim or vocab, generator=gen, dtype=torch.float64)
    lp = (torch.randn(batch, frames, vocab, generator=gen, dtype=torch.float64) * 2).log_softmax(-1)
    lens = torch.randint(1, frames + 1, (batch,), generator=gen)
    return memory, lp, lens


def run_and_compare(decoder, memory, lp, lens, max_lens, weights, beam, nbest, pre_beam=None, bonus=0.0,
                    tol=1e-7, dtype=torch.float64, lm=None, alpha: float = 0.0,
                    full: Optional[Sequence[str]] = None) -> None:
    batch, vocab = lp.shape[0], lp.shape[2]
    scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
    if lm is not None:
        scorers["lm"] = lm[0]
    scorers = {n: sc for n, sc in scorers.items() if n in weights}
    w = dict(weights, length_bonus=bonus)
    kw = {} if full is None else dict(full_scorers=full)
    if alpha:
        kw["length_penalty"] = alpha
    got = beam_search(scorers, w, max_lens, beam=beam, nbest=nbest, pre_beam=pre_beam, dtype=dtype, **kw).to_lists()
    for b in range(batch):
        refs = {"decoder": decoder_ref(decoder, memory, lens, b), "ctc": RefCTC(lp[b, :int(lens[b])].tolist(), vocab)}
        if lm is not None:
            refs["lm"] = lm[1]
        want = reference_beam_search(refs, weights, vocab, beam, int(max_lens[b]), bonus=bonus, nbest=nbest,
                                     pre_beam=pre_beam or int(1.5 * beam), alpha=alpha,
                                     full=("decoder",) if full is None else full)
        mine = [(tuple(h.tokens), h.score, h.ctc_score) for h in got[b]]
        assert [m[0] for m in mine] == [r[0] for r in want], f"utterance {b}"
        for m, r in zip(mine, want):
            assert m[1] == pytest.approx(r[1], abs=tol) and m[2] == pytest.approx(r[2], abs=tol)


@pytest.mark.parametrize("beam", [1, 3, 6])
def test_attention_only_equals_reference(beam: int) -> None:
    gen = torch.Generator().manual_seed(beam)
    for trial in range(4):
        batch, vocab = 1 + trial % 3, 4 + 2 * trial
        memory, lp, lens = problem(batch, 7, vocab, gen)
        max_lens = torch.randint(0, 7, (batch,), generator=gen)
        run_and_compare(ToyDecoder(vocab, gen), memory, lp, lens, max_lens, {"decoder": 1.0}, beam,
                        nbest=min(beam, 2), bonus=0.3 * trial)


@pytest.mark.parametrize("beam,pre_beam", [(1, None), (3, None), (5, 2), (4, 100)])
def test_joint_ctc_attention_equals_reference(beam: int, pre_beam: Optional[int]) -> None:
    gen = torch.Generator().manual_seed(10 + beam)
    for trial in range(3):
        batch, vocab = 1 + trial, 5 + trial
        memory, lp, lens = problem(batch, 8, vocab, gen)
        run_and_compare(ToyDecoder(vocab, gen), memory, lp, lens, lens.clone(), {"decoder": 0.7, "ctc": 0.3}, beam,
                        nbest=beam, pre_beam=pre_beam, bonus=0.5 if trial == 1 else 0.0)


def test_transformer_decoder_joint_search_equals_reference() -> None:
    from asrkit.nets.decoder import TransformerDecoder

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(20)
    vocab = 7
    decoder = TransformerDecoder(vocab, d_model=16, num_heads=2, ffn_dim=32, num_layers=2).eval()
    memory, lp, lens = problem(3, 9, vocab, gen, dim=16)
    memory = memory.float()
    run_and_compare(decoder, memory, lp, lens, lens.clone(), {"decoder": 0.6, "ctc": 0.4}, beam=4, nbest=2,
                    tol=1e-4, dtype=torch.float32)


def test_ngram_lm_fusion_equals_reference_and_weight_zero_equals_no_lm() -> None:
    from asrkit.lm import ngram_scorer

    token_list = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "C", "Z"]
    lm = ngram_scorer(REPO / "tests" / "lm" / "fixtures" / "chars_2gram.arpa", token_list)
    vocab = len(token_list)

    def lm_ref(prefix) -> List[float]:  # the same LM, one row, history rebuilt from scratch
        state = lm.init_state(1, 1, torch.device("cpu"))
        for tok in prefix:
            state = lm.select_state(state, torch.tensor([0]), torch.tensor([tok]))
        return lm.score(state, torch.arange(vocab)[None])[0].double().tolist()

    gen = torch.Generator().manual_seed(21)
    memory, lp, lens = problem(2, 8, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    weights = {"decoder": 0.7, "ctc": 0.3, "lm": 0.5}
    run_and_compare(decoder, memory, lp, lens, lens.clone(), weights, beam=4, nbest=2, lm=(lm, lm_ref), tol=1e-5)

    def search(lm_weight: Optional[float]):
        scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
        weights = {"decoder": 0.7, "ctc": 0.3}
        if lm_weight is not None:
            scorers["lm"], weights["lm"] = lm, lm_weight
        return beam_search(scorers, weights, lens, beam=4, dtype=torch.float64)

    with_lm, without = search(0.0), search(None)
    assert torch.equal(with_lm.tokens, without.tokens) and torch.equal(with_lm.scores, without.scores)


@pytest.mark.parametrize("alpha,lm_full", [(0.0, False), (0.8, False), (0.0, True), (1.2, True)])
def test_batch_equals_one_utterance_at_a_time(alpha: float, lm_full: bool) -> None:
    # Catches: a length penalty or LM pre-beam that mixes utterances (per-batch instead of per-row
    # lengths or max_lens, a topk over the wrong axis, the early stop reading another utterance's pool).
    gen = torch.Generator().manual_seed(22)
    vocab = 9
    memory, lp, lens = problem(5, 10, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    kw = dict(ctc_weight=0.4, beam=5, nbest=3, weights={"length_bonus": 0.2})
    if alpha or lm_full:
        kw = dict(kw, scorers={"lm": random_bigram(vocab, gen)}, weights={"lm": 0.5, "length_bonus": 0.2},
                  length_penalty=alpha, full_scorers=("lm",) if lm_full else ())
    batched = joint_beam_search(decoder, memory, lens, lp, **kw).to_lists()
    for b in range(5):
        t = int(lens[b])
        single = joint_beam_search(decoder, memory[b:b + 1, :t], lens[b:b + 1], lp[b:b + 1, :t], **kw).to_lists()[0]
        assert [h.tokens for h in single] == [h.tokens for h in batched[b]]
        assert [h.score for h in single] == pytest.approx([h.score for h in batched[b]], abs=1e-5)
        assert [h.ctc_score for h in single] == pytest.approx([h.ctc_score for h in batched[b]], abs=1e-5)


def test_beam_one_equals_a_greedy_argmax_loop() -> None:
    gen = torch.Generator().manual_seed(23)
    vocab = 8
    memory, _, lens = problem(6, 9, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    max_lens = torch.randint(0, 9, (6,), generator=gen)
    got = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, {"decoder": 1.0}, max_lens, beam=1,
                      dtype=torch.float64).best()
    for b in range(6):
        ref = decoder_ref(decoder, memory, lens, b)
        prefix, score = (), 0.0
        while True:
            lp = ref(prefix)
            if len(prefix) == int(max_lens[b]):
                score += lp[EOS]
                break
            lp[0] = NEG_INF  # the blank is never emitted
            tok = max(range(vocab), key=lambda c: lp[c])
            score += lp[tok]
            if tok == EOS:
                break
            prefix += (tok,)
        assert got[b].tokens == list(prefix) and got[b].score == pytest.approx(score, abs=1e-9)


def test_ctc_weight_zero_equals_attention_only() -> None:
    gen = torch.Generator().manual_seed(24)
    memory, lp, lens = problem(3, 8, 7, gen)
    decoder = ToyDecoder(7, gen)
    joint = joint_beam_search(decoder, memory, lens, lp, ctc_weight=0.0, beam=4)
    scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
    zero = beam_search(scorers, {"decoder": 1.0, "ctc": 0.0}, lens, beam=4)
    att = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, {"decoder": 1.0}, lens, beam=4)
    for other in (joint, zero):
        assert torch.equal(other.tokens, att.tokens) and torch.equal(other.scores, att.scores)


def test_ctc_weight_one_scores_the_best_hypothesis_with_its_ctc_probability() -> None:
    gen = torch.Generator().manual_seed(25)
    vocab = 6
    memory, lp, lens = problem(4, 12, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp.float(), lens)}
    got = beam_search(scorers, {"decoder": 0.0, "ctc": 1.0}, lens, beam=5, pre_beam=vocab).best()
    for b in range(4):
        tokens = got[b].tokens
        assert 0 not in tokens and EOS not in tokens
        target = torch.tensor([tokens or [1]])
        want = -F.ctc_loss(lp[b:b + 1].transpose(0, 1), target, lens[b:b + 1], torch.tensor([len(tokens)]),
                           reduction="none")
        assert got[b].ctc_score == pytest.approx(float(want), abs=1e-4)
        assert got[b].score == pytest.approx(got[b].ctc_score, abs=1e-6)
        ref = reference_beam_search({"ctc": RefCTC(lp[b, :int(lens[b])].tolist(), vocab)}, {"ctc": 1.0}, vocab, 5,
                                    int(lens[b]))
        assert tuple(tokens) == ref[0][0]


def test_early_stopping_is_exact_and_stops_early(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(26)
    memory, lp, lens = problem(4, 10, 6, gen)
    decoder = ToyDecoder(6, gen)
    max_lens = torch.full((4,), 60)
    steps = []
    real_step = bs._step
    monkeypatch.setattr(bs, "_step", lambda *a: (steps.append(1), real_step(*a)))
    for bonus in (0.0, 0.4):
        kw = dict(beam=3, nbest=2, dtype=torch.float64)
        weights = {"decoder": 1.0, "length_bonus": bonus}
        steps.clear()
        early = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, weights, max_lens, **kw)
        ran = len(steps)
        with monkeypatch.context() as mp:
            mp.setattr(bs, "_CHECK_EVERY", 10 ** 9)
            full = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, weights, max_lens, **kw)
        if bonus == 0.0:  # a large bonus keeps long hypotheses promising: no early end
            assert ran < 60 and ran % bs._CHECK_EVERY == 0
        assert torch.equal(early.tokens, full.tokens) and torch.equal(early.scores, full.scores)


@pytest.mark.parametrize("alpha,lm_full", [(0.0, False), (0.7, True)])
def test_search_steps_never_sync_with_the_host(monkeypatch: pytest.MonkeyPatch, alpha: float, lm_full: bool) -> None:
    # Catches a host sync in the token loop, e.g. a length penalty computed from tensor lengths with
    # .item() or a Python branch on an LM's scores in the pre-beam.
    ran: list = []
    monkeypatch.setattr(bs, "_step", no_host_sync(bs._step, ran))
    monkeypatch.setattr(bs, "_force_end", no_host_sync(bs._force_end, ran))
    gen = torch.Generator().manual_seed(27)
    memory, lp, lens = problem(3, 10, 8, gen)
    joint_beam_search(ToyDecoder(8, gen), memory, lens, lp, ctc_weight=0.3, beam=4,
                      scorers={"lm": random_bigram(8, gen)}, weights={"lm": 0.3, "length_bonus": 0.5},
                      length_penalty=alpha, full_scorers=("lm",) if lm_full else ()).to_lists()
    assert "_step" in ran and "_force_end" in ran


@pytest.mark.parametrize("kwargs,match", [
    (dict(beam=0), "beam"),
    (dict(nbest=5, beam=4), "nbest"),
    (dict(pre_beam=0), "pre_beam"),
    (dict(weights={"decoder": 1.0, "lm": 1.0}), "weight 'lm' has no scorer"),
    (dict(weights={}), "scorer 'decoder' has no weight"),
    (dict(weights={"decoder": 0.0}), "nonzero weight"),
    (dict(weights={"decoder": float("nan")}), "weight 'decoder' is nan: weights must be finite"),
    (dict(max_lens=torch.tensor([3.0])), "max_lens"),
    (dict(full_scorers=("lm",)), "full scorer 'lm' has no scorer"),
    (dict(full_scorers="decoder"), "collection of scorer names"),
    (dict(length_penalty=float("nan")), "length_penalty"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    gen = torch.Generator().manual_seed(28)
    memory, _, lens = problem(1, 4, 5, gen)
    args = dict(scorers={"decoder": DecoderScorer(ToyDecoder(5, gen), memory, lens)}, weights={"decoder": 1.0},
                max_lens=torch.tensor([3]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        beam_search(**args)


# ---- GNMT length penalty -------------------------------------------------------------------------

def test_length_penalty_zero_is_todays_search_exactly() -> None:
    # Catches a penalty that leaks in when off: e.g. dividing by (5 + |Y|) / 6 without the power, or
    # normalising with the wrong length, would change the scores (bit for bit compared here).
    gen = torch.Generator().manual_seed(40)
    memory, lp, lens = problem(3, 9, 7, gen)
    decoder = ToyDecoder(7, gen)
    scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
    weights = {"decoder": 0.7, "ctc": 0.3, "length_bonus": 0.3}
    today = beam_search(scorers, weights, lens, beam=4, dtype=torch.float64)
    zero = beam_search(scorers, weights, lens, beam=4, dtype=torch.float64, length_penalty=0.0)
    for field in ("tokens", "lengths", "scores", "ctc_scores"):
        assert torch.equal(getattr(today, field), getattr(zero, field)), field


@pytest.mark.parametrize("alpha", [0.6, 1.5, -0.5])
def test_length_penalty_equals_reference(alpha: float) -> None:
    # Catches a penalty applied to the wrong length (counting <eos>, or the step instead of the
    # hypothesis), to live beams instead of only finished ones, a pool that keeps the raw best
    # instead of the normalised best, or reported scores that are not the normalised ones.
    gen = torch.Generator().manual_seed(41)
    for trial in range(3):
        batch, vocab = 1 + trial, 5 + trial
        memory, lp, lens = problem(batch, 8, vocab, gen)
        max_lens = torch.randint(0, 8, (batch,), generator=gen) if trial == 0 else lens.clone()
        run_and_compare(ToyDecoder(vocab, gen), memory, lp, lens, max_lens, {"decoder": 0.7, "ctc": 0.3}, beam=4,
                        nbest=3, bonus=0.2 * trial, alpha=alpha)


def test_length_penalty_lets_a_slightly_worse_longer_hypothesis_win() -> None:
    # Catches a length penalty that does not change the ranking (ignored, or applied to every
    # hypothesis with one common length). Tokens: 3 = a, 4 = b. "a <eos>" scores -1.0, "b <eos>"
    # -1.05, "b b" (forced end at max_len 2) -1.1: raw, "a" wins; with alpha = 1,
    # lp(1) = 1 and lp(2) = 7/6, so "b b" wins with -1.1 * 6/7 = -0.943.
    table = bigram_table({EOS: {3: -0.5, 4: -0.35}, 3: {EOS: -0.5}, 4: {4: -0.05, EOS: -0.7}})
    scorer = BigramScorer(table)
    for alpha, want in ((0.0, [3]), (1.0, [4, 4])):
        got = beam_search({"decoder": scorer}, {"decoder": 1.0}, torch.tensor([2]), beam=3, nbest=3,
                          dtype=torch.float64, length_penalty=alpha).to_lists()[0]
        ref = reference_beam_search({"decoder": scorer.ref}, {"decoder": 1.0}, 6, 3, 2, pre_beam=4, nbest=3,
                                    alpha=alpha)
        assert got[0].tokens == want and [tuple(h.tokens) for h in got] == [r[0] for r in ref]
        assert [h.score for h in got] == pytest.approx([r[1] for r in ref], abs=1e-12)
    # The reported score is the normalised one, and the N-best is sorted by it.
    assert got[0].score == pytest.approx(-1.1 / length_penalty(2, 1.0), abs=1e-12)
    assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)


# Traps for the early stop under a length penalty (max_len 20, beam 2, 1-best; "a <eos>" = -1.0,
# a = 3, fills the pool first; each comment's "bound" is the bound the search must not use).
CHAIN = {EOS: {3: -0.5, 4: -0.055}, 3: {EOS: -0.5}, 11: {EOS: -0.01, 11: -1.0}}
CHAIN.update({j: {j + 1: -0.055, EOS: -5.0} for j in range(4, 11)})
EARLY_STOP_TRAPS = {
    # alpha 1, b = 4: b^k <eos> = -0.1 k - 1.0, normalised -(0.1 k + 1) * 6 / (5 + k), rising with k up
    # to the forced end: b^20 (-0.72) beats b^19 <eos> (-0.725). After 16 tokens the best live raw
    # score (-1.6) is below the pool's (b^15 <eos>, -0.75): the raw bound "best live < worst
    # finished" stops there and returns b^15; the exact bound -1.6 / lp(20) = -0.38 runs on.
    "raw bound": (bigram_table({EOS: {3: -0.5, 4: -0.1}, 3: {EOS: -0.5}, 4: {4: -0.1, EOS: -1.0}}), 1.0, (4,) * 20),
    # alpha 1, b = 4, c = 5: one costly token, then nearly free ones: b c^k <eos> = -2.45 - 0.01 k,
    # normalised by lp(k + 1), overtakes "a" at k = 10 and wins at the forced end, b c^19 = -2.64 /
    # lp(20) = -0.63. After 8 tokens the live -2.47 is below -1.0 even normalised by its present
    # length (-2.47 / lp(8) = -1.14): a bound normalised by the current length, not the longest
    # reachable, stops there and returns "a".
    "current-length bound": (bigram_table({EOS: {3: -0.5, 4: -2.4}, 3: {EOS: -0.5}, 4: {5: -0.01},
                                           5: {5: -0.01, EOS: -0.05}}), 1.0, (4,) + (5,) * 19),
    # alpha -1 (lp(L) = 6 / (5 + L): longer is worse): a chain of tokens 4 .. 11 at -0.055 each whose
    # only cheap <eos> is after 11 (-0.01): 4 .. 11 <eos> = -0.45 * 13/6 = -0.975 beats "a". After 8
    # tokens the live -0.44 normalised by the longest length, -0.44 * 25/6 = -1.83, is below -1.0: a
    # bound normalised only at max_len stops there and returns "a"; with alpha < 0 (or a positive
    # bound, from a length bonus) the shortest ending is the one to bound, -0.44 * 13/6 = -0.953
    # (and it is this length, not one more: -0.44 * 14/6 = -1.03 would stop too).
    "max-length bound": (bigram_table(CHAIN, vocab=12), -1.0, tuple(range(4, 12))),
}


@pytest.mark.parametrize("trap", sorted(EARLY_STOP_TRAPS))
def test_length_penalty_early_stop_waits_for_the_winner(monkeypatch: pytest.MonkeyPatch, trap: str) -> None:
    # Catches an early stop that is not exact under the length penalty: see EARLY_STOP_TRAPS.
    table, alpha, want = EARLY_STOP_TRAPS[trap]
    scorer = BigramScorer(table)
    vocab = table.shape[0]
    got = beam_search({"decoder": scorer}, {"decoder": 1.0}, torch.tensor([20, 20]), beam=2, nbest=1,
                      dtype=torch.float64, length_penalty=alpha).to_lists()
    ref = reference_beam_search({"decoder": scorer.ref}, {"decoder": 1.0}, vocab, 2, 20, pre_beam=3, alpha=alpha)
    assert ref[0][0] == want
    for hyps in got:
        assert tuple(hyps[0].tokens) == want and hyps[0].score == pytest.approx(ref[0][1], abs=1e-12)


@pytest.mark.parametrize("alpha", [0.6, 1.0, -0.5])
def test_length_penalty_early_stop_is_exact_and_stops_early(monkeypatch: pytest.MonkeyPatch, alpha: float) -> None:
    # Catches an early-stop bound that is too loose to ever stop under a penalty (a wasted search
    # to max_len) or too tight (stopping before a hypothesis that would still enter the N-best: the
    # result would differ from the search that never checks).
    gen = torch.Generator().manual_seed(42)
    memory, lp, lens = problem(4, 10, 6, gen)
    decoder = ToyDecoder(6, gen)
    max_lens = torch.tensor([60, 45, 60, 50])
    steps: list = []
    real_step = bs._step
    monkeypatch.setattr(bs, "_step", lambda *a: (steps.append(1), real_step(*a)))
    kw = dict(beam=3, nbest=2, dtype=torch.float64, length_penalty=alpha)
    weights = {"decoder": 1.0}
    early = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, weights, max_lens, **kw)
    ran = len(steps)
    with monkeypatch.context() as mp:
        mp.setattr(bs, "_CHECK_EVERY", 10 ** 9)
        full = beam_search({"decoder": DecoderScorer(decoder, memory, lens)}, weights, max_lens, **kw)
    assert ran < 60 and ran % bs._CHECK_EVERY == 0
    assert torch.equal(early.tokens, full.tokens) and torch.equal(early.scores, full.scores)


# ---- an LM as a full scorer: its scores join the pre-beam ----------------------------------------

@pytest.mark.parametrize("beam,pre_beam,alpha", [(1, 1, 0.0), (3, 2, 0.0), (4, None, 0.7)])
def test_lm_as_full_scorer_equals_reference(beam: int, pre_beam: Optional[int], alpha: float) -> None:
    # Catches an LM named full that is still scored only on the pre-beam, counted twice (once in the
    # pre-beam's fused score, once as a partial scorer), or left out of the total.
    gen = torch.Generator().manual_seed(43 + beam)
    for trial in range(2):
        batch, vocab = 2 + trial, 6 + trial
        memory, lp, lens = problem(batch, 8, vocab, gen)
        lm = random_bigram(vocab, gen)
        run_and_compare(ToyDecoder(vocab, gen), memory, lp, lens, lens.clone(), {"decoder": 0.6, "ctc": 0.4, "lm": 0.8},
                        beam=beam, nbest=beam, pre_beam=pre_beam, lm=(lm, lm.ref), full=("decoder", "lm"),
                        bonus=0.3 * trial, alpha=alpha)


def test_lm_as_full_scorer_brings_its_token_into_the_pre_beam() -> None:
    # Catches a full_scorers option that does not reach the pre-beam. The decoder ranks token 5 last
    # (-3.0), so with pre_beam 2 it never becomes a candidate and the LM (which wants 5) cannot help;
    # with the LM full, decoder + LM ranks 5 first (-3.1 against -5.5 for 3), and "5 5" wins.
    dec = BigramScorer(bigram_table({r: {3: -0.5, EOS: -1.0, 4: -1.5, 5: -3.0, 1: -4.0} for r in range(6)}))
    lm = BigramScorer(bigram_table({r: {5: -0.1} for r in range(6)}, floor=-5.0))
    scorers, weights = {"decoder": dec, "lm": lm}, {"decoder": 1.0, "lm": 1.0}
    max_lens = torch.tensor([2])
    results = {}
    for full in (("decoder",), ("decoder", "lm")):
        got = beam_search(scorers, weights, max_lens, beam=2, nbest=2, pre_beam=2, full_scorers=full,
                          dtype=torch.float64).to_lists()[0]
        ref = reference_beam_search({"decoder": dec.ref, "lm": lm.ref}, weights, 6, 2, 2, full=full, pre_beam=2,
                                    nbest=2)
        assert [tuple(h.tokens) for h in got] == [r[0] for r in ref], full
        assert [h.score for h in got] == pytest.approx([r[1] for r in ref], abs=1e-12)
        results[full] = got[0].tokens
    assert 5 not in results[("decoder",)] and results[("decoder", "lm")] == [5, 5]


def test_joint_search_full_scorers_names_extra_full_scorers() -> None:
    # Catches joint_beam_search dropping full_scorers (or replacing the decoder by them): its
    # result must equal beam_search with the decoder and the LM full.
    gen = torch.Generator().manual_seed(44)
    vocab = 7
    memory, lp, lens = problem(3, 8, vocab, gen)
    decoder, lm = ToyDecoder(vocab, gen), random_bigram(vocab, gen)
    joint = joint_beam_search(decoder, memory, lens, lp, ctc_weight=0.3, beam=3, pre_beam=2, scorers={"lm": lm},
                              weights={"lm": 1.0}, full_scorers=("lm",), length_penalty=0.5)
    scorers = {"lm": lm, "decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
    plain = beam_search(scorers, {"lm": 1.0, "decoder": 0.7, "ctc": 0.3}, lens, beam=3, pre_beam=2,
                        full_scorers=("decoder", "lm"), length_penalty=0.5)
    default = joint_beam_search(decoder, memory, lens, lp, ctc_weight=0.3, beam=3, pre_beam=2, scorers={"lm": lm},
                                weights={"lm": 1.0}, length_penalty=0.5)
    assert torch.equal(joint.tokens, plain.tokens) and torch.equal(joint.scores, plain.scores)
    assert not torch.equal(joint.scores, default.scores)  # the option is not a no-op here


@pytest.mark.parametrize("conf", ["tiny_transformer.yaml", "tiny_blstm_location_attention.yaml"])
def test_tiny_model_joint_search_end_to_end(conf: str) -> None:
    from asrkit.config import load_config
    from asrkit.models.registry import build_model

    torch.manual_seed(0)
    vocab = 30
    model = build_model(load_config(REPO / "conf" / conf), vocab).eval()
    gen = torch.Generator().manual_seed(29)
    wav_lens = torch.tensor([16000, 11000, 6400])
    wav = 0.1 * torch.randn(3, 16000, generator=gen)
    with torch.no_grad():
        enc, enc_lens = model.encode(wav, wav_lens)
        kw = dict(ctc_weight=0.3, beam=4, nbest=2)
        batched = joint_beam_search(model, enc, enc_lens, model.ctc_log_probs(enc), **kw).to_lists()
        for b in range(3):
            assert batched[b], f"utterance {b}: no hypothesis"
            for hyp in batched[b]:
                assert all(0 < t < vocab and t != EOS for t in hyp.tokens)
                assert len(hyp.tokens) <= int(enc_lens[b]) and hyp.score <= 0.0
            enc1, lens1 = model.encode(wav[b:b + 1, :int(wav_lens[b])], wav_lens[b:b + 1])
            single = joint_beam_search(model, enc1, lens1, model.ctc_log_probs(enc1), **kw).to_lists()[0]
            assert [h.tokens for h in single] == [h.tokens for h in batched[b]]
            assert [h.score for h in single] == pytest.approx([h.score for h in batched[b]], abs=1e-3)


# A word LM whose closing of YORK after NEW adds ln P(YORK | NEW) - LA(YORK) = (3 - 0.35) ln 10 = +6.10 nats.
NEW_YORK_ARPA = """\\data\\
ngram 1=5
ngram 2=2

\\1-grams:
-1.0\t<unk>
-99\t<s>\t0
-1.0\t</s>
-1.0\tNEW\t0
-3.0\tYORK\t0

\\2-grams:
-0.1\t<s> NEW
-0.35\tNEW YORK

\\end\\
"""
NY_TOKENS = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "N", "E", "W", "Y", "O", "R", "K"]


def test_a_word_lm_closing_a_word_is_not_stopped_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The early stop assumed that no scorer adds a positive score to a running hypothesis. A word LM with
    # look-ahead adds ln P(w | h) - LA(w) when w closes: after 8 tokens the running NEW\u2581YORK (-7.21: the
    # decoder's -0.07, the LM's LA(N) + closing NEW + LA(Y) = -2.30 + 2.07 - 6.91) is below the finished NEW
    # (-4.55), so the old bound stopped there and returned NEW; closing YORK then adds +6.10: -3.42 wins.
    from asrkit.lm import ngram_scorer

    (tmp_path / "ny.arpa").write_text(NEW_YORK_ARPA, encoding="utf-8")
    lm = ngram_scorer(tmp_path / "ny.arpa", NY_TOKENS, units="word")
    ids = {t: i for i, t in enumerate(NY_TOKENS)}
    spelled = "NEW\u2581YORK"
    rows = {EOS: {ids["N"]: 0.0}, ids["K"]: {EOS: -0.01}}  # a "decoder" that spells NEW YORK, or ends after NEW
    rows.update({ids[a]: {ids[b]: -0.01} for a, b in zip(spelled, spelled[1:])})
    rows[ids["W"]][EOS] = -2.0
    scorers = {"decoder": BigramScorer(bigram_table(rows, vocab=len(NY_TOKENS))), "lm": lm}
    steps: list = []
    real_step = bs._step
    monkeypatch.setattr(bs, "_step", lambda *a: (steps.append(1), real_step(*a)))
    kw = dict(beam=2, nbest=1, dtype=torch.float64)
    early = beam_search(scorers, {"decoder": 1.0, "lm": 1.0}, torch.tensor([40]), **kw)
    ran = len(steps)
    with monkeypatch.context() as mp:
        mp.setattr(bs, "_CHECK_EVERY", 10 ** 9)
        full = beam_search(scorers, {"decoder": 1.0, "lm": 1.0}, torch.tensor([40]), **kw)
    want = [ids[c] for c in spelled]
    assert full.to_lists()[0][0].tokens == want  # the exhaustive search's answer
    assert early.to_lists()[0][0].tokens == want and torch.equal(early.scores, full.scores)
    lm_total = (-0.1 - 0.35 - 1.0) * math.log(10)  # ln P(NEW | <s>) P(YORK | NEW) P(</s> | YORK)
    assert float(early.scores[0, 0]) == pytest.approx(lm_total - 0.08, abs=1e-5)
    assert ran == 16  # and still an early stop: the bound is the LM's largest closing gain, not infinity


def test_scorers_without_a_gain_bound_or_with_a_negative_weight_run_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # A scorer that states no bound (or one weighted negatively that could add anything) leaves the search
    # nothing to stop on: it runs every utterance to max_len. A count weighted negatively adds nothing.
    class Unbounded(BigramScorer):
        max_gain = None  # not a BoundedScorer

    table = bigram_table({EOS: {3: -0.5}, 3: {EOS: -0.5, 3: -1.0}})
    steps: list = []
    real_step = bs._step
    monkeypatch.setattr(bs, "_step", lambda *a: (steps.append(1), real_step(*a)))
    for scorers, weights, want in (({"decoder": BigramScorer(table)}, {"decoder": 1.0}, 8),
                                   ({"decoder": Unbounded(table)}, {"decoder": 1.0}, 30),
                                   ({"decoder": BigramScorer(table), "lm": BigramScorer(table)},
                                    {"decoder": 1.0, "lm": -0.5}, 30),
                                   ({"decoder": BigramScorer(table), "length_bonus": LengthBonus()},
                                    {"decoder": 1.0, "length_bonus": -0.5}, 8)):
        steps.clear()
        beam_search(scorers, weights, torch.tensor([30]), beam=2, nbest=1, vocab_size=6, dtype=torch.float64)
        assert len(steps) == want, (list(scorers), weights)
