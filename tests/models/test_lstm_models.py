import math
import pathlib

import pytest
import torch
from torch import nn

from asrkit.config import ConfigError, load_config
from asrkit.models.asr import AsrModel, CTCHead, decoder_io
from asrkit.models.registry import build_model
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder

CONF = pathlib.Path(__file__).resolve().parents[2] / "conf"
FEAT_DIM, VOCAB = 8, 10


class FeatureFrontend(nn.Module):
    """Stands in for the audio frontend: the batch's "wav" already holds (B, T, F) features."""
    output_dim = FEAT_DIM

    def forward(self, feats, lens):
        return feats, lens


def _batch(seed: int = 0):
    """Four random-feature utterances with fixed short targets over ids 3..9 (no blank/unk/sos)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([30, 26, 22, 28])
    feats = torch.randn(4, 30, FEAT_DIM, generator=g)
    targets = [[3, 4, 5], [6, 7, 7, 8], [9, 3], [5, 8, 4, 6, 3]]
    tokens = torch.full((4, 5), -1)
    for i, t in enumerate(targets):
        tokens[i, : len(t)] = torch.tensor(t)
    return {"wav": feats, "wav_lens": lens, "tokens": tokens, "token_lens": torch.tensor([len(t) for t in targets]),
            "utts": ["a", "b", "c", "d"], "texts": ["", "", "", ""]}, targets


@pytest.fixture(autouse=True)
def one_thread():
    """Small LSTMs are slower, not faster, with several threads on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _overfit(model: nn.Module, batch, decodes_targets, key: str, max_steps: int, lr: float) -> float:
    """Adam until greedy decoding gives the targets (checked every 10 steps); returns final/initial ``key`` loss."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    first = None
    for step in range(1, max_steps + 1):
        out = model(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        first = float(out[key]) if first is None else first
        if step % 10 == 0:
            model.eval()
            done = decodes_targets(model)
            model.train()
            if done:
                return float(out[key]) / first
    pytest.fail(f"no overfit in {max_steps} steps: {key} went from {first:.3f} to {float(out[key]):.3f}")


def _ctc_greedy(model: AsrModel, batch):
    with torch.no_grad():
        enc, enc_lens = model.encode(batch["wav"], batch["wav_lens"])
        best = model.ctc_log_probs(enc).argmax(-1)
    hyps = []
    for b in range(best.size(0)):  # greedy CTC: collapse repeats, drop blanks
        path = best[b, : int(enc_lens[b])].tolist()
        hyps.append([p for i, p in enumerate(path) if p != 0 and (i == 0 or p != path[i - 1])])
    return hyps


def _attention_greedy(model: AsrModel, batch, steps: int = 6):
    """Greedy search through the incremental decode_step API; returns (B, steps) tokens after <sos>."""
    with torch.no_grad():
        enc, enc_lens = model.encode(batch["wav"], batch["wav_lens"])
        ys, state = torch.full((enc.size(0), 1), 2), None
        for _ in range(steps):
            logp, state = model.decoder.decode_step(ys, enc, enc_lens, state)
            ys = torch.cat([ys, logp.argmax(-1, keepdim=True)], dim=1)
    return ys[:, 1:].tolist()


def _attention_model(ctc_weight: float = 0.3, lsm_weight: float = 0.0, layers: int = 1) -> AsrModel:
    enc = BLSTMEncoder(FEAT_DIM, 24, num_layers=2, dropout=0.0, input_layer="none", pyramid_layers=(1,))
    dec = LSTMAttentionDecoder(VOCAB, enc.output_dim, embed_dim=16, hidden_size=32, num_layers=layers,
                               attention_dim=24, conv_channels=4, conv_kernel=5, dropout=0.0)
    ctc = CTCHead(enc.output_dim, VOCAB) if ctc_weight > 0 else None
    return AsrModel(FeatureFrontend(), enc, VOCAB, ctc, dec, ctc_weight=ctc_weight, lsm_weight=lsm_weight)


def test_blstm_ctc_overfits_a_few_utterances():
    torch.manual_seed(0)
    batch, targets = _batch()
    enc = BLSTMEncoder(FEAT_DIM, 32, 2, 0.0, input_layer="none")
    model = AsrModel(FeatureFrontend(), enc, VOCAB, CTCHead(enc.output_dim, VOCAB), None, ctc_weight=1.0,
                     lsm_weight=0.0)
    assert _ctc_greedy(model, batch) != targets
    ratio = _overfit(model, batch, lambda m: _ctc_greedy(m, batch) == targets, "loss_ctc", max_steps=300, lr=3e-2)
    assert ratio < 0.05


def test_attention_model_overfits_and_greedy_decodes_the_targets():
    torch.manual_seed(0)
    batch, targets = _batch()
    model = _attention_model(ctc_weight=0.3)

    def decodes_targets(m):  # the targets, then <eos>
        return all(h[: len(t) + 1] == t + [2] for h, t in zip(_attention_greedy(m, batch), targets))

    assert not decodes_targets(model)
    ratio = _overfit(model, batch, decodes_targets, "loss_att", max_steps=200, lr=3e-2)
    assert ratio < 0.1


def test_decode_step_reproduces_teacher_forced_forward():
    torch.manual_seed(0)
    batch, _ = _batch()
    model = _attention_model(layers=2).eval()
    with torch.no_grad():
        enc, enc_lens = model.encode(batch["wav"], batch["wav_lens"])
        ys_in, _, ys_lens = decoder_io(batch["tokens"], batch["token_lens"])
        logits = model.decoder(ys_in, ys_lens, enc, enc_lens)
        attention = model.decoder.attention_weights(ys_in, ys_lens, enc, enc_lens)
        state = None
        for i in range(ys_in.size(1)):
            logp, state = model.decoder.decode_step(ys_in[:, : i + 1], enc, enc_lens, state)
            torch.testing.assert_close(logp, logits[:, i].log_softmax(-1), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(state.att_weights, attention[:, i])
        # state=None recomputes the whole prefix and lands on the same scores
        logp_full, _ = model.decoder.decode_step(ys_in, enc, enc_lens, None)
        torch.testing.assert_close(logp_full, logits[:, -1].log_softmax(-1), atol=1e-5, rtol=1e-5)
        # Every state field is indexed by hypothesis on dim 0: reordering rows reorders the scores.
        _, state = model.decoder.decode_step(ys_in[:, :2], enc, enc_lens, None)
        perm = torch.tensor([2, 0, 0, 3])
        moved = type(state)(*(t[perm] for t in state))
        logp_p, _ = model.decoder.decode_step(ys_in[perm, :3], enc[perm], enc_lens[perm], moved)
        torch.testing.assert_close(logp_p, logits[perm, 2].log_softmax(-1), atol=1e-5, rtol=1e-5)


def test_loss_terms_match_a_reference_computation():
    torch.manual_seed(0)
    batch, targets = _batch()
    model = _attention_model(ctc_weight=0.4, lsm_weight=0.1).eval()
    out = model(batch)
    with torch.no_grad():
        enc, enc_lens = model.encode(batch["wav"], batch["wav_lens"])
        total = 0.0
        for b, t in enumerate(targets):  # one utterance at a time, targets + <eos>
            ys_in = torch.tensor([[2] + t])
            logp = model.decoder(ys_in, torch.tensor([len(t) + 1]), enc[b: b + 1, : int(enc_lens[b])],
                                 enc_lens[b: b + 1])[0].log_softmax(-1)
            for i, y in enumerate(t + [2]):
                # KL to q = 0.9 on the target, 0.1 / (V - 1) on every other id (the same smoothing as every
                # decoder's): -sum q log p + sum q log q
                others = logp[i].sum() - logp[i, y]
                total -= 0.9 * logp[i, y] + 0.1 / (VOCAB - 1) * others
                total += 0.9 * math.log(0.9) + 0.1 * math.log(0.1 / (VOCAB - 1))
        ref_att = total / len(targets)
    torch.testing.assert_close(out["loss_att"], ref_att, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["loss"], 0.4 * out["loss_ctc"] + 0.6 * out["loss_att"])
    assert 0.0 <= float(out["acc"]) <= 1.0 and out["num_infinite_ctc"] == 0
    att = out["attention"]  # (B, L+1, T) alignments for plotting
    assert att.shape == (4, 6, int(enc_lens.max())) and not att.requires_grad
    for b in range(4):
        assert torch.all(att[b, :, int(enc_lens[b]):] == 0)
        torch.testing.assert_close(att[b].sum(-1), torch.ones(6))


def test_without_ctc_the_attention_loss_is_the_loss():
    batch, _ = _batch()
    model = _attention_model(ctc_weight=0.0)
    out = model(batch)
    assert "loss_ctc" not in out and model.ctc is None
    torch.testing.assert_close(out["loss"], out["loss_att"])
    with pytest.raises(RuntimeError, match="no CTC head"):
        model.ctc_log_probs(torch.zeros(1, 2, 48))


@pytest.mark.parametrize("name", ["tiny_blstm_ctc", "tiny_blstm_location_attention",
                                  "blstm_ctc", "blstm_location_attention"])
def test_configs_build_through_the_registry(name):
    cfg = load_config(CONF / f"{name}.yaml")
    model = build_model(cfg, vocab_size=32)
    assert model.vocab_size == 32 and model.subsampling_factor == 4
    if name.startswith("tiny"):
        g = torch.Generator().manual_seed(0)
        wav = 0.1 * torch.randn(2, 8000, generator=g)
        batch = {"wav": wav, "wav_lens": torch.tensor([8000, 6400]), "tokens": torch.tensor([[5, 6, 7], [8, 9, -1]]),
                 "token_lens": torch.tensor([3, 2]), "utts": ["x", "y"], "texts": ["", ""]}
        out = model(batch)
        assert torch.isfinite(out["loss"])
        out["loss"].backward()


def test_bad_lstm_config_is_a_config_error():
    cfg = load_config(CONF / "tiny_blstm_ctc.yaml", ["model.encoder.pyramid_layers=[3]"])
    with pytest.raises(ConfigError, match="model.encoder: pyramid_layers"):
        build_model(cfg, vocab_size=32)


def test_lstm_models_report_their_encoder_lengths():
    """output_lengths (used to drop utterances too short for their labels) matches the real encoder."""
    for name in ("conf/tiny_blstm_ctc.yaml", "conf/tiny_blstm_location_attention.yaml"):
        model = build_model(load_config(name), vocab_size=12).eval()
        wav_lens = torch.tensor([16000, 12345, 4000])
        with torch.no_grad():
            _, enc_lens = model.encode(torch.randn(3, 16000), wav_lens)
        assert model.output_lengths(wav_lens).tolist() == enc_lens.tolist()
