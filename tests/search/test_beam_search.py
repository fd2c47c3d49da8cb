"""The batched label-synchronous beam search against a simple per-utterance reference."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import List, Optional

import pytest
import torch
import torch.nn.functional as F

from asrkit.search import CTCPrefixScorer, DecoderScorer, beam_search, joint_beam_search
from host_sync import no_host_sync
from reference_beam_search import NEG_INF, RefCTC, reference_beam_search

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
                    tol=1e-7, dtype=torch.float64, lm=None) -> None:
    batch, vocab = lp.shape[0], lp.shape[2]
    scorers = {"decoder": DecoderScorer(decoder, memory, lens), "ctc": CTCPrefixScorer(lp, lens)}
    if lm is not None:
        scorers["lm"] = lm[0]
    scorers = {n: sc for n, sc in scorers.items() if n in weights}
    w = dict(weights, length_bonus=bonus)
    got = beam_search(scorers, w, max_lens, beam=beam, nbest=nbest, pre_beam=pre_beam, dtype=dtype).to_lists()
    for b in range(batch):
        refs = {"decoder": decoder_ref(decoder, memory, lens, b), "ctc": RefCTC(lp[b, :int(lens[b])].tolist(), vocab)}
        if lm is not None:
            refs["lm"] = lm[1]
        want = reference_beam_search(refs, weights, vocab, beam, int(max_lens[b]), bonus=bonus, nbest=nbest,
                                     pre_beam=pre_beam or int(1.5 * beam))
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


def test_batch_equals_one_utterance_at_a_time() -> None:
    gen = torch.Generator().manual_seed(22)
    vocab = 9
    memory, lp, lens = problem(5, 10, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    kw = dict(ctc_weight=0.4, beam=5, nbest=3, weights={"length_bonus": 0.2})
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


def test_search_steps_never_sync_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list = []
    monkeypatch.setattr(bs, "_step", no_host_sync(bs._step, ran))
    monkeypatch.setattr(bs, "_force_end", no_host_sync(bs._force_end, ran))
    gen = torch.Generator().manual_seed(27)
    memory, lp, lens = problem(3, 10, 8, gen)
    joint_beam_search(ToyDecoder(8, gen), memory, lens, lp, ctc_weight=0.3, beam=4,
                      weights={"length_bonus": 0.5}).to_lists()
    assert "_step" in ran and "_force_end" in ran


@pytest.mark.parametrize("kwargs,match", [
    (dict(beam=0), "beam"),
    (dict(nbest=5, beam=4), "nbest"),
    (dict(pre_beam=0), "pre_beam"),
    (dict(weights={"decoder": 1.0, "lm": 1.0}), "weight 'lm' has no scorer"),
    (dict(weights={}), "scorer 'decoder' has no weight"),
    (dict(weights={"decoder": 0.0}), "nonzero weight"),
    (dict(max_lens=torch.tensor([3.0])), "max_lens"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    gen = torch.Generator().manual_seed(28)
    memory, _, lens = problem(1, 4, 5, gen)
    args = dict(scorers={"decoder": DecoderScorer(ToyDecoder(5, gen), memory, lens)}, weights={"decoder": 1.0},
                max_lens=torch.tensor([3]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        beam_search(**args)


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
