"""Minimum word error rate training: word errors, the N-best expected-error loss and its gradient against the
formulas written out, and the loss on real models (attention N-best and CTC N-best)."""
from __future__ import annotations

import pytest
import torch

import torch.nn.functional as F

from asrkit.config import (ExperimentConfig, FrontendConfig, ModelConfig, NoDecoderConfig, SpecAugmentConfig,
                           SpeedPerturbConfig, TransformerDecoderConfig, TransformerEncoderConfig)
from asrkit.models.losses import ctc_loss
from asrkit.models.registry import build_model
from asrkit.search import NBest, ctc_prefix_beam_search
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.mwer import expected_errors, hypothesis_log_probs, mwer_forward, word_errors


@pytest.mark.parametrize("ref, hyp, errors", [("a b c", "a b c", 0), ("a b c", "a x c d", 2), ("a b c", "", 3),
                                              ("", "a b", 2), ("the cat", "cat the", 2), ("a  b", " a b ", 0)])
def test_word_errors(ref, hyp, errors):
    assert word_errors(ref, hyp) == errors


def test_expected_errors_and_gradient_follow_the_formula():
    """L = sum_i P^_i (W_i - mean W) with P^ the softmax over the valid slots; dL/dlogP_i = P^_i (W_i - E[W]).
    Catches a softmax over empty slots, a missing baseline, or a mean over the empty slots."""
    log_p = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]], requires_grad=True)
    errors = torch.tensor([[2, 0, 1], [4, 1, 9]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    loss = expected_errors(log_p, errors, valid)
    expected, grads = 0.0, torch.zeros(2, 3)
    for b in range(2):
        n = int(valid[b].sum())
        p = log_p[b, :n].detach().softmax(0)
        w = errors[b, :n].float()
        expected += float((p * (w - w.mean())).sum())
        grads[b, :n] = p * (w - (p * w).sum())
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(log_p.grad, grads, atol=1e-6, rtol=1e-5)


def test_an_utterance_without_hypotheses_adds_nothing():
    log_p = torch.tensor([[-1.0, -2.0], [0.0, 0.0]], requires_grad=True)
    valid = torch.tensor([[True, True], [False, False]])
    loss = expected_errors(log_p, torch.tensor([[1, 3], [5, 5]]), valid)
    loss.backward()
    assert torch.isfinite(log_p.grad).all() and float(log_p.grad[1].abs().sum()) == 0.0


def _model(decoder: bool, augment: bool = False):
    """A tiny model over 8 tokens without dropout; ``augment``: speed perturbation (factors 0.6 and 1.5, so a
    perturbed utterance never has the clean frame count) and SpecAugment."""
    torch.manual_seed(0)
    enc = TransformerEncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=2, dropout=0.0)
    dec = TransformerDecoderConfig(num_layers=1, num_heads=4, ffn_dim=64, dropout=0.0) if decoder \
        else NoDecoderConfig()
    cfg = ExperimentConfig(frontend=FrontendConfig(n_mels=20),
                           model=ModelConfig(ctc_weight=0.3 if decoder else 1.0, encoder=enc, decoder=dec),
                           speed_perturb=SpeedPerturbConfig(enabled=augment, factors=(0.6, 1.5)),
                           specaug=SpecAugmentConfig(enabled=augment, freq_mask_width=5, time_mask_width=5))
    return build_model(cfg, 8)


def _batch(tok: CharTokenizer, texts=("ABC", "DE"), lengths=(8000, 6000)):
    g = torch.Generator().manual_seed(1)
    tokens = [tok.encode(t) for t in texts]
    padded = torch.full((len(texts), max(map(len, tokens))), -1)
    for i, t in enumerate(tokens):
        padded[i, : len(t)] = torch.tensor(t)
    return {"wav": 0.1 * torch.randn(len(texts), max(lengths), generator=g), "wav_lens": torch.tensor(lengths),
            "texts": list(texts), "tokens": padded, "token_lens": torch.tensor([len(t) for t in tokens])}


@pytest.mark.parametrize("decoder", [True, False], ids=["attention", "ctc"])
def test_mwer_loss_on_a_model_has_gradients_and_leaves_the_mode(decoder):
    model = _model(decoder).train()
    tok = CharTokenizer(list("ABCDE"))  # ids 3..7, "▁" is not in it: one word per utterance
    g = torch.Generator().manual_seed(2)
    batch = _batch(tok)
    out = mwer_forward(model, batch, tok, nbest=3, ctc_weight=0.3)
    assert model.training  # the search ran in eval mode, training mode is back
    assert torch.allclose(out["loss"], model(batch)["loss"])  # no augmentation or dropout: the same model loss
    assert out["loss_mwer"].requires_grad and torch.isfinite(out["loss_mwer"])
    assert 0.0 <= float(out["mwer_errors"]) <= 2.0  # one-word references: at most 1 error + insertions
    projection = torch.randn((), generator=g)  # a scalar loss: a random scale is enough to need gradients
    (out["loss_mwer"] * projection).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_mwer_fine_tuning_through_asrkit_train(corpus, tmp_path):
    """train.init_from + train.mwer_weight: the fine-tuning run starts from the trained weights (its first
    logged loss_mwer is that model's), logs the MWER terms, and writes a model that loads."""
    from asrkit.checkpoint import MODEL_FILE, load_checkpoint
    from asrkit.pipeline.transcriber import load_from_dir
    from asrkit.train.trainer import train
    from trainkit import tiny_config

    joint = ["model.ctc_weight=0.5", "model.decoder={kind: transformer, num_layers: 1, num_heads: 2, ffn_dim: 64}"]
    base = tmp_path / "base"
    train(tiny_config(joint), str(base), str(corpus["train"]), str(corpus["dev"]), tokenizer=str(corpus["tokenizer"]),
          device="cpu")
    tuned = tmp_path / "tuned"
    cfg = tiny_config(joint + [f"train.init_from={base / MODEL_FILE}", "train.mwer_weight=0.5",
                               "train.mwer_nbest=3", "train.epochs=1", "train.lr=0.0001"])
    train(cfg, str(tuned), str(corpus["train"]), str(corpus["dev"]), tokenizer=str(corpus["tokenizer"]), device="cpu")
    log = (tuned / "train.log").read_text()
    assert f"initialised the model from {base / MODEL_FILE}" in log
    weights = load_checkpoint(tuned / MODEL_FILE)["model"]
    before = load_checkpoint(base / MODEL_FILE)["model"]
    assert any(not torch.equal(weights[k], before[k]) for k in weights)  # it trained
    model, _, _ = load_from_dir(str(tuned))
    assert model.decoder is not None


def test_mwer_settings_are_checked(corpus, tmp_path):
    from asrkit.config import ConfigError
    from asrkit.train.trainer import train
    from trainkit import tiny_config

    with pytest.raises(ConfigError, match="train.mwer_nbest"):
        train(tiny_config(["train.mwer_weight=0.5", "train.mwer_nbest=1"]), str(tmp_path / "x"),
              str(corpus["train"]), tokenizer=str(corpus["tokenizer"]), device="cpu")
    with pytest.raises(ConfigError, match="train.init_from: /no/such.pt"):
        train(tiny_config(["train.init_from=/no/such.pt"]), str(tmp_path / "y"), str(corpus["train"]),
              tokenizer=str(corpus["tokenizer"]), device="cpu")


def test_a_ctc_hypothesis_that_cannot_be_aligned_is_invalid_not_certain():
    """Issue 28 item 2: ``ctc_loss(zero_infinity=True)`` gave an infeasible hypothesis log P = 0, the highest there
    is, so it took the whole renormalised mass (without a gradient) and silenced its utterance."""
    model = _model(decoder=False).train()
    enc = torch.randn(1, 6, 32, requires_grad=True)  # 6 frames
    hyps = [[3, 4], [3, 3, 3, 3], [3, 4, 5, 6, 7, 3, 4], []]  # feasible, 4 + 3 blanks > 6, 7 > 6, empty
    tokens = torch.full((1, 4, 7), -1)
    for n, h in enumerate(hyps):
        tokens[0, n, : len(h)] = torch.tensor(h, dtype=torch.long)
    lengths = torch.tensor([[len(h) for h in hyps]])
    nbest = NBest(tokens, lengths, torch.zeros(1, 4), torch.zeros(1, 4), torch.full((1, 4, 7), -1))
    log_p = hypothesis_log_probs(model, enc, torch.tensor([6]), nbest)
    lp = model.ctc_log_probs(enc)[0].detach()  # (T, V)
    for n in (0, 3):  # the feasible ones: -ctc_loss, computed alone
        ref = -F.ctc_loss(lp, torch.tensor(hyps[n], dtype=torch.long), torch.tensor([6]), torch.tensor([len(hyps[n])]),
                          reduction="sum")
        assert float(log_p[0, n]) == pytest.approx(float(ref), rel=1e-5)
    assert log_p[0, 1] == float("-inf") and log_p[0, 2] == float("-inf")
    loss = expected_errors(log_p, torch.tensor([[0, 3, 5, 2]]), torch.isfinite(log_p))
    # Only the two feasible hypotheses share the mass: P^ = softmax over them, errors 0 and 2 (mean 1).
    p0 = torch.softmax(log_p[0, [0, 3]].detach(), 0)[0]
    assert float(loss) == pytest.approx(float(p0 * (0 - 1) + (1 - p0) * (2 - 1)), rel=1e-5)
    loss.backward()
    assert torch.isfinite(enc.grad).all() and float(enc.grad.abs().sum()) > 0


def test_the_nbest_is_decoded_and_scored_on_the_training_pass_own_features():
    """Issue 28 item 3: with speed perturbation and SpecAugment, the N-best, its scores and the model loss all
    come from one draw of the model's input. Reference: the same draw (same seed) computed by hand."""
    model = _model(decoder=False, augment=True).train()
    tok = CharTokenizer(list("ABC▁D"))  # with a word boundary: the hypotheses' word errors differ
    batch = _batch(tok, texts=("A B C", "D A", "B CD A"), lengths=(8000, 6000, 7000))
    torch.manual_seed(5)
    out = mwer_forward(model, batch, tok, nbest=3, ctc_weight=0.0)

    torch.manual_seed(5)
    feats, feat_lens = model.frontend(batch["wav"], batch["wav_lens"])  # the one augmented draw
    assert feat_lens.tolist() != model.frontend.num_frames(batch["wav_lens"]).tolist()  # it did change lengths
    with torch.no_grad():
        enc, enc_lens = model.encode_features(feats, feat_lens)  # no dropout: eval and train mode agree
        log_probs = model.ctc_log_probs(enc)
        hyps = ctc_prefix_beam_search(log_probs, enc_lens, beam=3, nbest=3)
    want_loss, _ = ctc_loss(log_probs, enc_lens, batch["tokens"], batch["token_lens"])
    want_mwer = 0.0
    for b, ref in enumerate(batch["texts"]):
        n = int(torch.isfinite(hyps.scores[b]).sum())
        assert n >= 2
        scores = torch.stack([-F.ctc_loss(log_probs[b], hyps.tokens[b, i, : hyps.lengths[b, i]],
                                          enc_lens[b: b + 1], hyps.lengths[b, i: i + 1], reduction="sum")
                              for i in range(n)])
        errors = torch.tensor([float(word_errors(ref, tok.decode(hyps.tokens[b, i, : hyps.lengths[b, i]].tolist())))
                               for i in range(n)])
        want_mwer += float((scores.softmax(0) * (errors - errors.mean())).sum())
    assert float(out["loss"]) == pytest.approx(float(want_loss), rel=1e-4)
    assert float(out["loss_mwer"]) == pytest.approx(want_mwer / 3, rel=1e-4, abs=1e-6)
