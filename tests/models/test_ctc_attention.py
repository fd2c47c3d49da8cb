"""Joint CTC/attention Transformer and the pure-CTC model it extends."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrkit.config import (ConfigError, DecoderConfig, EncoderConfig, ExperimentConfig, FrontendConfig,
                           ModelConfig)
from asrkit.models.ctc_attention import CTCAttentionTransformer, decoder_io
from asrkit.models.ctc_transformer import CTCTransformer
from asrkit.models.registry import build_model

VOCAB = 12


def config(name="ctc_attention", ctc_weight=0.3, interctc_weight=0.0, lsm_weight=0.1, dropout=0.1, **enc):
    encoder = EncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=3, dropout=dropout, **enc)
    decoder = DecoderConfig(num_layers=1, num_heads=4, ffn_dim=64, dropout=dropout)
    model = ModelConfig(name=name, ctc_weight=ctc_weight, interctc_weight=interctc_weight, lsm_weight=lsm_weight,
                        encoder=encoder, decoder=decoder)
    return ExperimentConfig(frontend=FrontendConfig(n_mels=20), model=model)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"wav": 0.1 * torch.randn(3, 9600, generator=g), "wav_lens": torch.tensor([9600, 8000, 6400]),
            "tokens": torch.tensor([[5, 6, 7, 8, 9], [10, 11, 11, -1, -1], [4, 3, -1, -1, -1]]),
            "token_lens": torch.tensor([5, 3, 2])}


def kl_reference(logits, targets, smoothing):
    vocab = logits.size(-1)
    q = torch.full_like(logits, smoothing / (vocab - 1))
    q.scatter_(-1, targets.clamp(min=0).unsqueeze(-1), 1 - smoothing)
    per_token = F.kl_div(logits.log_softmax(-1), q, reduction="none").sum(-1)
    return (per_token * (targets >= 0)).sum() / logits.size(0)


def test_decoder_io_hand_case():
    tokens = torch.tensor([[5, 6, 7], [8, -1, -1]])
    ys_in, ys_out, ys_lens = decoder_io(tokens, torch.tensor([3, 1]))
    assert ys_in.tolist() == [[2, 5, 6, 7], [2, 8, 2, 2]]
    assert ys_out.tolist() == [[5, 6, 7, 2], [8, 2, -1, -1]]
    assert ys_lens.tolist() == [4, 2]


def test_loss_terms_combine_as_documented():
    torch.manual_seed(0)
    model = build_model(config(interctc_weight=0.4, interctc_layers=(1,), dejavu_layer=2), VOCAB).eval()
    assert isinstance(model, CTCAttentionTransformer)
    b = batch()
    out = model(b)
    # Independent recomputation from the parts.
    feats, feat_lens = model.frontend(b["wav"], b["wav_lens"])
    enc, lens, inter = model.encoder.forward_intermediate(feats, feat_lens, model.ctc_head)
    assert len(inter) == 2

    def ctc(h):
        lp = model.ctc_head(h).log_softmax(-1).transpose(0, 1)
        return F.ctc_loss(lp, b["tokens"].clamp(min=0), lens, b["token_lens"], reduction="sum") / 3

    ys_in, ys_out, ys_lens = decoder_io(b["tokens"], b["token_lens"])
    att = kl_reference(model.decoder(ys_in, ys_lens, enc, lens), ys_out, 0.1)
    inter_mean = (ctc(inter[0]) + ctc(inter[1])) / 2
    expected = 0.3 * (0.6 * ctc(enc) + 0.4 * inter_mean) + 0.7 * att
    torch.testing.assert_close(out["loss"], expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["loss_ctc"], ctc(enc), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["loss_interctc"], inter_mean, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["loss_att"], att, atol=1e-4, rtol=1e-5)
    assert int(out["num_infinite_ctc"]) == 0


def test_eval_output_has_attention_maps_for_plots():
    torch.manual_seed(0)
    model = build_model(config(), VOCAB)
    assert "attention" not in model(batch())  # training: no extra decoder pass
    model.eval()
    b = batch()
    out = model(b)
    _, lens = model.encode(b["wav"], b["wav_lens"])
    att = out["attention"]
    assert att.shape == (3, 6, int(lens.max()))  # (B, L+1, T)
    torch.testing.assert_close(att.sum(-1), torch.ones(3, 6))
    assert float(att[2, :, int(lens[2]):].sum()) == 0.0  # no weight on padding frames


def test_extreme_ctc_weights_skip_the_unused_branch():
    torch.manual_seed(0)
    only_ctc = build_model(config(ctc_weight=1.0), VOCAB).eval()
    out = only_ctc(batch())
    assert "loss_att" not in out and "acc" not in out
    torch.testing.assert_close(out["loss"], out["loss_ctc"])
    only_att = build_model(config(ctc_weight=0.0), VOCAB).eval()
    out = only_att(batch())
    assert "loss_ctc" not in out
    torch.testing.assert_close(out["loss"], out["loss_att"])


class StubDecoder(nn.Module):
    """Returns fixed logits whose argmax is ``self.pred``."""

    vocab_size = VOCAB

    def __init__(self, pred):
        super().__init__()
        self.pred = pred

    def forward(self, ys_in, ys_lens, memory, memory_lens):
        return F.one_hot(self.pred, VOCAB).float() * 10.0


def test_acc_on_a_hand_made_case():
    model = build_model(config(), VOCAB).eval()
    b = batch()  # ys_out: [5 6 7 8 9 2], [10 11 11 2 -1 -1], [4 3 2 -1 -1 -1] -> 13 targets
    pred = torch.tensor([[5, 6, 7, 8, 9, 2],     # 6 right
                         [10, 4, 11, 2, 0, 0],   # 3 right, 1 wrong (padding predictions ignored)
                         [4, 4, 4, 2, 2, 2]])    # 1 right, 2 wrong
    model.decoder = StubDecoder(pred)
    model.train()  # eval mode would ask the stub for attention maps
    assert model(b)["acc"].item() == pytest.approx(10 / 13)


def test_ctc_transformer_keeps_its_interface():
    torch.manual_seed(0)
    model = build_model(config(name="ctc_transformer"), VOCAB).eval()
    assert type(model) is CTCTransformer and not hasattr(model, "decoder")
    prefixes = {k.split(".")[0] for k in model.state_dict()}
    assert {"encoder", "ctc_head"} <= prefixes <= {"frontend", "encoder", "ctc_head"}  # checkpoint keys as before
    out = model(batch())
    assert set(out) == {"loss", "loss_ctc", "num_infinite_ctc"}
    torch.testing.assert_close(out["loss"], out["loss_ctc"])
    enc, lens = model.encode(batch()["wav"], batch()["wav_lens"])
    assert model.ctc_log_probs(enc).shape == (3, enc.size(1), VOCAB) and model.subsampling_factor == 4
    assert model.vocab_size == VOCAB


def test_output_lengths_and_can_align_agree_with_the_real_encoder():
    torch.manual_seed(0)
    model = build_model(config(), VOCAB).eval()
    b = batch()
    _, lens = model.encode(b["wav"], b["wav_lens"])
    assert model.output_lengths(b["wav_lens"]).tolist() == lens.tolist()
    frames = int(lens[2])  # 6400 samples
    assert model.can_align(6400, list(range(3, 3 + frames)))
    assert not model.can_align(6400, list(range(3, 4 + frames)))
    assert not model.can_align(6400, [4] * (frames // 2 + 1))  # repeats need blanks in between


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="interctc_weight"):
        build_model(config(interctc_weight=0.3), VOCAB)
    with pytest.raises(ConfigError, match="model.encoder.interctc_layers"):
        build_model(config(interctc_layers=(3,)), VOCAB)
    with pytest.raises(ConfigError, match="dejavu_input"):
        build_model(config(dejavu_layer=1, dejavu_input="mfcc"), VOCAB)
    bad = dataclasses.replace(config(), model=dataclasses.replace(config().model, ctc_weight=1.5))
    with pytest.raises(ConfigError, match="ctc_weight"):
        build_model(bad, VOCAB)


@pytest.mark.parametrize("extra", [{}, {"interctc_weight": 0.3, "interctc_layers": (1,), "self_condition": True},
                                   {"interctc_weight": 0.3, "dejavu_layer": 2}], ids=["plain", "sc-interctc", "dejavu"])
def test_joint_model_overfits_a_few_utterances(extra):
    torch.manual_seed(0)
    model = build_model(config(dropout=0.0, **extra), VOCAB)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    b = batch()
    losses, ctc_losses = [], []
    for _ in range(100):
        out = model(b)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
        ctc_losses.append(out["loss_ctc"].item())
    # Both branches learn: the decoder fits within ~30 steps, CTC leaves its blank plateau later.
    assert losses[-1] < 0.1 * losses[0], losses[::10]
    assert ctc_losses[-1] < 0.1 * ctc_losses[0], ctc_losses[::10]
    assert float(out["acc"]) > 0.9
