"""The composed AsrModel: loss terms, parts present or absent, every encoder with every decoder."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrkit.config import (BLSTMEncoderConfig, ConfigError, ConformerEncoderConfig, ExperimentConfig, FrontendConfig,
                           LSTMLocationDecoderConfig, ModelConfig, NoDecoderConfig, TransformerDecoderConfig,
                           TransformerEncoderConfig)
from asrkit.models.asr import AsrModel, decoder_io
from asrkit.models.registry import build_model

VOCAB = 12


def config(ctc_weight=0.3, interctc_weight=0.0, lsm_weight=0.1, dropout=0.1, **enc):
    encoder = TransformerEncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=3, dropout=dropout, **enc)
    decoder = (NoDecoderConfig() if ctc_weight == 1.0 else
               TransformerDecoderConfig(num_layers=1, num_heads=4, ffn_dim=64, dropout=dropout))
    model = ModelConfig(ctc_weight=ctc_weight, interctc_weight=interctc_weight, lsm_weight=lsm_weight,
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
    b = batch()
    out = model(b)
    # Independent recomputation from the parts.
    feats, feat_lens = model.frontend(b["wav"], b["wav_lens"])
    enc, lens, inter = model.encoder(feats, feat_lens, model.ctc)
    assert len(inter) == 2

    def ctc(h):
        lp = (h @ model.ctc.proj.weight.T + model.ctc.proj.bias).log_softmax(-1).transpose(0, 1)
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


def test_extreme_ctc_weights_build_only_the_trained_part():
    """ctc_weight 1 builds no decoder, 0 no CTC head: an untrained part can be neither saved nor decoded with."""
    torch.manual_seed(0)
    only_ctc = build_model(config(ctc_weight=1.0), VOCAB).eval()
    assert only_ctc.decoder is None and only_ctc.ctc is not None
    out = only_ctc(batch())
    assert "loss_att" not in out and "acc" not in out
    torch.testing.assert_close(out["loss"], out["loss_ctc"])
    only_att = build_model(config(ctc_weight=0.0), VOCAB).eval()
    assert only_att.ctc is None and not any(k.startswith("ctc.") for k in only_att.state_dict())
    out = only_att(batch())
    assert "loss_ctc" not in out
    torch.testing.assert_close(out["loss"], out["loss_att"])
    with pytest.raises(RuntimeError, match=r"^this model has no CTC head \(model.ctc_weight is 0\)$"):
        only_att.ctc_log_probs(torch.zeros(1, 2, 32))


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


def test_pure_ctc_model_has_exactly_its_parts():
    torch.manual_seed(0)
    model = build_model(config(ctc_weight=1.0), VOCAB).eval()
    assert type(model) is AsrModel and model.decoder is None
    prefixes = {k.split(".")[0] for k in model.state_dict()}
    assert {"encoder", "ctc"} <= prefixes <= {"frontend", "encoder", "ctc"}  # checkpoint keys: the parts'
    with pytest.raises(RuntimeError, match=r"^this model has no attention decoder \(model.decoder.kind is none\)$"):
        model.decode_step(torch.tensor([[2]]), torch.zeros(1, 3, 32), torch.tensor([3]))
    out = model(batch())
    assert set(out) == {"loss", "loss_ctc", "num_infinite_ctc"}
    torch.testing.assert_close(out["loss"], out["loss_ctc"])
    enc, lens = model.encode(batch()["wav"], batch()["wav_lens"])
    assert model.ctc_log_probs(enc).shape == (3, enc.size(1), VOCAB) and model.subsampling_factor == 4
    assert model.vocab_size == VOCAB
    # Features computed apart (transcription does it in loader workers) encode to the same thing.
    feats, feat_lens = model.frontend(batch()["wav"], batch()["wav_lens"])
    enc2, lens2 = model.encode_features(feats, feat_lens)
    torch.testing.assert_close(enc2, enc)
    assert lens2.tolist() == lens.tolist()


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
    # ctc_weight 1 with a decoder section would leave the decoder untrained: refused, naming the fix.
    bad = dataclasses.replace(config(), model=dataclasses.replace(config().model, ctc_weight=1.0))
    with pytest.raises(ConfigError, match="decoder.kind: none"):
        build_model(bad, VOCAB)
    with pytest.raises(ConfigError, match="set it to 1.0"):
        build_model(dataclasses.replace(config(), model=dataclasses.replace(config().model,
                                                                            decoder=NoDecoderConfig())), VOCAB)


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


ENCODERS = {
    "transformer": TransformerEncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=2),
    "conformer": ConformerEncoderConfig(d_model=32, num_heads=4, ffn_dim=64, num_layers=2, conv_kernel=5),
    "blstm": BLSTMEncoderConfig(hidden_size=16, num_layers=2),
}
DECODERS = {
    "transformer": TransformerDecoderConfig(num_layers=1, num_heads=4, ffn_dim=64),
    "lstm_location": LSTMLocationDecoderConfig(embed_dim=16, hidden_size=24, attention_dim=16, conv_kernel=5),
    "none": NoDecoderConfig(),
}


@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_every_encoder_trains_with_every_decoder(encoder, decoder):
    """Any pairing is built from a config alone and one optimizer step lowers its loss on the batch."""
    torch.manual_seed(0)
    ctc_weight = 1.0 if decoder == "none" else 0.3
    cfg = ExperimentConfig(frontend=FrontendConfig(n_mels=20), model=ModelConfig(
        ctc_weight=ctc_weight, encoder=ENCODERS[encoder], decoder=DECODERS[decoder]))
    model = build_model(cfg, VOCAB).train()
    assert (model.decoder is None) == (decoder == "none") and model.ctc is not None
    for module in model.modules():  # a deterministic step, so the loss before and after compare
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    b = batch()
    first = model(b)
    opt.zero_grad()
    first["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    opt.step()
    assert model(b)["loss"] < first["loss"]


def test_iterated_loss_uses_a_head_of_its_own_per_layer_as_in_the_paper():
    """Deja-vu (Tjandra et al. 2020, Fig. 2 and sec. 3): an MLP + softmax per intermediate layer on that layer's
    raw output (not the final LayerNorm, not the shared CTC head), ctc_term = L_final + lambda * sum_k L_k.
    Catches a shared head, a mean instead of a sum, (1 - lambda) on the final loss, or the final norm reused."""
    torch.manual_seed(0)
    cfg = config(ctc_weight=1.0, interctc_weight=0.3, interctc_layers=(1,), dejavu_layer=2)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, intermediate_loss="iterated"))
    model = build_model(cfg, VOCAB).eval()
    assert model.aux_heads is not None and len(model.aux_heads) == 2
    b = batch()
    out = model(b)
    feats, feat_lens = model.frontend(b["wav"], b["wav_lens"])
    enc, lens, inter = model.encoder(feats, feat_lens, model.ctc)

    def ctc(log_probs):
        return F.ctc_loss(log_probs.transpose(0, 1), b["tokens"].clamp(min=0), lens, b["token_lens"],
                          reduction="sum") / 3

    def mlp(head, h):  # the head written out from its raw weights: LayerNorm, Linear, ReLU, Linear
        norm, first, _, second = head.net
        x = F.layer_norm(h, (h.size(-1),), norm.weight, norm.bias, norm.eps)
        return (torch.relu(x @ first.weight.T + first.bias) @ second.weight.T + second.bias).log_softmax(-1)

    final = ctc((enc @ model.ctc.proj.weight.T + model.ctc.proj.bias).log_softmax(-1))
    aux = [ctc(mlp(head, h)) for head, h in zip(model.aux_heads, inter)]
    torch.testing.assert_close(out["loss"], final + 0.3 * (aux[0] + aux[1]), atol=1e-4, rtol=1e-5)
    # The heads read the raw residual stream of layers 1 and 2 (no shared final LayerNorm in between).
    x, x_lens = model.encoder.subsampling(feats, feat_lens)
    mask = (torch.arange(x.size(1))[None] < x_lens[:, None]).unsqueeze(1)
    torch.testing.assert_close(inter[0], model.encoder.layers[0](x, mask), atol=1e-5, rtol=1e-5)


def test_iterated_loss_refuses_self_conditioning():
    cfg = config(interctc_weight=0.3, interctc_layers=(1,), self_condition=True)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, intermediate_loss="iterated"))
    with pytest.raises(ConfigError, match="intermediate_loss: interctc"):
        build_model(cfg, VOCAB)


def _parts():
    torch.manual_seed(0)
    model = build_model(config(), VOCAB)
    return model.frontend, model.encoder, model.ctc, model.decoder


def test_parts_and_weights_must_agree():
    """Each clause of the constructor's checks on its own: a model of no parts, a weight out of range, a CTC
    head without CTC weight (or a decoder with ctc_weight 1) alone, a bad normalisation, another vocabulary."""
    frontend, encoder, ctc, decoder = _parts()
    with pytest.raises(ValueError, match="^a model needs a CTC head, a decoder or both$"):
        AsrModel(frontend, encoder, VOCAB, None, None, ctc_weight=0.3, lsm_weight=0.1)
    with pytest.raises(ValueError, match=r"ctc_weight must be in \[0, 1\], got 1.5"):
        AsrModel(frontend, encoder, VOCAB, ctc, decoder, ctc_weight=1.5, lsm_weight=0.1)
    with pytest.raises(ValueError, match="does not match the parts"):  # the CTC side disagrees only
        AsrModel(frontend, encoder, VOCAB, None, decoder, ctc_weight=0.3, lsm_weight=0.1)
    with pytest.raises(ValueError, match="does not match the parts"):  # the decoder side disagrees only
        AsrModel(frontend, encoder, VOCAB, ctc, decoder, ctc_weight=1.0, lsm_weight=0.1)
    with pytest.raises(ValueError, match="lsm_normalize must be 'batch' or 'token', got 'mean'"):
        AsrModel(frontend, encoder, VOCAB, ctc, decoder, ctc_weight=0.3, lsm_weight=0.1, lsm_normalize="mean")
    with pytest.raises(ValueError, match=f"decoder vocabulary {VOCAB} != model vocabulary {VOCAB + 1}"):
        AsrModel(frontend, encoder, VOCAB + 1, ctc, decoder, ctc_weight=0.3, lsm_weight=0.1)
    model = AsrModel(frontend, encoder, VOCAB, ctc, decoder, ctc_weight=0.3, lsm_weight=0.1, lsm_normalize="token",
                     aux_heads=[])
    with pytest.raises(RuntimeError, match="3 intermediate layers but 0 auxiliary CTC heads"):
        model._ctc_term(ctc, torch.zeros(1, 4, 32), torch.tensor([4]), [torch.zeros(1, 4, 32)] * 3,
                        torch.tensor([[3]]), torch.tensor([1]))


def test_token_normalised_attention_loss_is_passed_on():
    """lsm_normalize token divides by the target count (the model must pass the setting on)."""
    frontend, encoder, ctc, decoder = _parts()
    model = AsrModel(frontend, encoder, VOCAB, ctc, decoder, ctc_weight=0.3, lsm_weight=0.1,
                     lsm_normalize="token").eval()
    b = batch()
    enc, lens = model.encode(b["wav"], b["wav_lens"])
    ys_in, ys_out, ys_lens = decoder_io(b["tokens"], b["token_lens"])
    targets = int((ys_out >= 0).sum())
    expected = kl_reference(model.decoder(ys_in, ys_lens, enc, lens), ys_out, 0.1) * 3 / targets
    torch.testing.assert_close(model(b)["loss_att"], expected, atol=1e-5, rtol=1e-5)


def test_decode_step_passes_the_state_on():
    """A state that does not fit the prefix is refused by the decoder: a model that dropped the state (and
    silently recomputed from scratch) would accept it."""
    model = build_model(config(), VOCAB).eval()
    enc = torch.randn(1, 5, 32)
    _, state = model.decode_step(torch.tensor([[2]]), enc, torch.tensor([5]))
    with pytest.raises(ValueError, match="covers 1 tokens, expected 2"):
        model.decode_step(torch.tensor([[2, 4, 5]]), enc, torch.tensor([5]), state)


def test_an_empty_transcript_needs_one_frame():
    model = build_model(config(), VOCAB).eval()
    samples = next(n for n in range(100, 20000, 16) if int(model.output_lengths(torch.tensor([n]))[0]) == 1)
    assert model.can_align(samples, []) and not model.can_align(samples, [5, 6])


def test_intermediate_layers_weigh_nothing_unless_asked():
    """interctc_weight defaults to 0: a model built by hand with an InterCTC encoder trains on the final CTC."""
    torch.manual_seed(0)
    parts = build_model(config(interctc_weight=0.5, interctc_layers=(1,)), VOCAB)
    model = AsrModel(parts.frontend, parts.encoder, VOCAB, parts.ctc, parts.decoder, ctc_weight=1.0 - 1e-9,
                     lsm_weight=0.1).eval()
    out = model(batch())
    assert "loss_interctc" in out
    torch.testing.assert_close(out["loss"], (1.0 - 1e-9) * out["loss_ctc"] + 1e-9 * out["loss_att"])


def test_encode_and_forward_features_give_the_encodings_of_forward_on_a_self_conditioned_model():
    """encode() (decoding) and forward_features() (training; MWER scores its N-best on its encodings) both run
    the encoder with the model's CTC head, which a self-conditioned encoder needs: the same encodings."""
    torch.manual_seed(0)
    model = build_model(config(interctc_weight=0.3, interctc_layers=(1,), self_condition=True), VOCAB).eval()
    b = batch()
    enc, lens = model.encode(b["wav"], b["wav_lens"])
    out, enc2, lens2 = model.forward_features(*model.frontend(b["wav"], b["wav_lens"]), b["tokens"], b["token_lens"])
    ref_enc, ref_lens, _ = model.encoder(*model.frontend(b["wav"], b["wav_lens"]), model.ctc)
    torch.testing.assert_close(enc, ref_enc)
    torch.testing.assert_close(enc2, ref_enc)
    assert lens.tolist() == lens2.tolist() == ref_lens.tolist()
    torch.testing.assert_close(out["loss"], model(b)["loss"])
