"""Minimum word error rate training: word errors, the N-best expected-error loss and its gradient against the
formulas written out, and the loss on real models (attention N-best and CTC N-best)."""
from __future__ import annotations

import pytest
import torch

from asrkit.config import (ExperimentConfig, FrontendConfig, ModelConfig, NoDecoderConfig, TransformerDecoderConfig,
                           TransformerEncoderConfig)
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.mwer import expected_errors, mwer_loss, word_errors


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


def _model(decoder: bool):
    torch.manual_seed(0)
    enc = TransformerEncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=2, dropout=0.0)
    dec = TransformerDecoderConfig(num_layers=1, num_heads=4, ffn_dim=64, dropout=0.0) if decoder \
        else NoDecoderConfig()
    cfg = ExperimentConfig(frontend=FrontendConfig(n_mels=20),
                           model=ModelConfig(ctc_weight=0.3 if decoder else 1.0, encoder=enc, decoder=dec))
    return build_model(cfg, 8)


@pytest.mark.parametrize("decoder", [True, False], ids=["attention", "ctc"])
def test_mwer_loss_on_a_model_has_gradients_and_leaves_the_mode(decoder):
    model = _model(decoder).train()
    tok = CharTokenizer(list("ABCDE"))  # ids 3..7, "▁" is not in it: one word per utterance
    g = torch.Generator().manual_seed(1)
    batch = {"wav": 0.1 * torch.randn(2, 8000, generator=g), "wav_lens": torch.tensor([8000, 6000]),
             "texts": ["ABC", "DE"]}
    out = mwer_loss(model, batch, tok, nbest=3, ctc_weight=0.3)
    assert model.training  # the search ran in eval mode, training mode is back
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
