import math

import pytest
import torch

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.transformer import TransformerEncoder, stack_frames


def plain_attention(mha, q_in, k_in, v_in, mask):
    """softmax(QK^T / sqrt(d)) V written out, as the reference for the SDPA path."""
    b, tq, d = q_in.shape
    h, dh = mha.num_heads, mha.head_dim
    q = mha.q_proj(q_in).view(b, tq, h, dh).transpose(1, 2)
    k = mha.k_proj(k_in).view(b, -1, h, dh).transpose(1, 2)
    v = mha.v_proj(v_in).view(b, -1, h, dh).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return mha.out_proj(out.transpose(1, 2).reshape(b, tq, d))


def test_sdpa_matches_plain_attention_with_padding_and_causal_masks():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(3, 7, 16)
    lens = torch.tensor([7, 4, 1])
    pad = (torch.arange(7)[None] < lens[:, None]).unsqueeze(1)  # (B, 1, T)
    torch.testing.assert_close(mha(x, x, x, pad), plain_attention(mha, x, x, x, pad.expand(3, 7, 7)))
    causal = torch.ones(7, 7, dtype=torch.bool).tril().unsqueeze(0) & pad
    torch.testing.assert_close(mha(x, x, x, causal), plain_attention(mha, x, x, x, causal))


def test_encoder_output_independent_of_padding():
    torch.manual_seed(0)
    for pre_ln in (True, False):
        enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2,
                                 normalize_before=pre_ln).eval()
        a = torch.randn(1, 40, 20)
        single, n, _ = enc(a, torch.tensor([40]))
        batch, lens, _ = enc(torch.cat([a, torch.zeros(1, 24, 20)], 1).expand(2, -1, -1).contiguous(),
                          torch.tensor([40, 64]))
        assert int(lens[0]) == int(n[0]) == single.shape[1]
        torch.testing.assert_close(batch[0, : int(n[0])], single[0], atol=1e-5, rtol=1e-5)


def test_encoder_gradients_flow_to_every_parameter():
    """Fails for an encoder whose attention output is multiplied by 0 or whose layers are no-ops (those
    parameters get no gradient), and for one that ignores the padding mask (padded input frames then
    reach the valid outputs). The objective is a fixed random projection of the valid output frames:
    ``.sum()`` of the final LayerNorm's output has zero gradient by construction."""
    torch.manual_seed(0)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2, dropout=0.0)
    feats = torch.randn(2, 30, 20, requires_grad=True)
    out, out_lens, _ = enc(feats, torch.tensor([30, 22]))
    valid = (torch.arange(out.size(1))[None] < out_lens[:, None])[..., None]  # (B, T', 1)
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * projection * valid).sum().backward()
    for name, p in enc.named_parameters():
        # A key bias shifts every score of a query row equally, which softmax cancels: zero gradient.
        if not name.endswith("k_proj.bias"):
            assert p.grad is not None and p.grad.abs().max() > 1e-4, name
    assert feats.grad[1, :22].abs().mean() > 1e-3
    assert feats.grad[1, 22:].abs().max() < 1e-6  # padding never reaches a valid frame


def test_intermediate_outputs_are_the_normalised_layer_outputs():
    torch.manual_seed(0)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=3, interctc_layers=(2, 1)).eval()
    feats, lens = torch.randn(2, 30, 20), torch.tensor([30, 22])
    out, out_lens, inter = enc(feats, lens)
    assert enc.intermediate_layers == (1, 2) and len(inter) == 2
    # Reference: run the layers by hand.
    x, ref_lens = enc.subsampling(feats, lens)
    mask = (torch.arange(x.size(1))[None] < ref_lens[:, None]).unsqueeze(1)
    hs = []
    for layer in enc.layers:
        x = layer(x, mask)
        hs.append(enc.final_norm(x))
    torch.testing.assert_close(inter[0], hs[0])
    torch.testing.assert_close(inter[1], hs[1])
    torch.testing.assert_close(out, hs[2])
    assert out_lens.tolist() == ref_lens.tolist()


def test_self_conditioning_adds_projected_posteriors_of_the_shared_head():
    torch.manual_seed(0)
    vocab = 7
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2, interctc_layers=(1,),
                             self_condition=True, vocab_size=vocab).eval()
    head = torch.nn.Linear(16, vocab)
    feats, lens = torch.randn(2, 30, 20), torch.tensor([30, 22])
    out, _, inter = enc(feats, lens, head)
    x, n = enc.subsampling(feats, lens)
    mask = (torch.arange(x.size(1))[None] < n[:, None]).unsqueeze(1)
    x = enc.layers[0](x, mask)
    x = x + enc.condition_proj(torch.softmax(head(enc.final_norm(x)), -1))
    torch.testing.assert_close(out, enc.final_norm(enc.layers[1](x, mask)))
    with pytest.raises(ValueError, match="ctc_head"):
        enc(feats, lens)


def test_intermediate_layer_range_is_checked():
    with pytest.raises(ValueError, match="1..2"):
        TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=3, interctc_layers=(3,))


def test_stack_frames_centres_the_window_in_the_receptive_field():
    feats = torch.arange(2 * 23 * 3, dtype=torch.float32).view(2, 23, 3)
    enc = TransformerEncoder(3 * 4, d_model=8, num_heads=2, ffn_dim=8, num_layers=1)  # only for the layout
    t_out = int(enc.output_lengths(torch.tensor([23]))[0])  # 4
    stacked = stack_frames(feats, t_out, 4, enc.subsampling.min_input_length)  # receptive field 7 -> offset 1
    assert stacked.shape == (2, t_out, 12)
    for t in range(t_out):
        torch.testing.assert_close(stacked[1, t], feats[1, 4 * t + 1: 4 * t + 5].reshape(-1))
    assert 4 * (t_out - 1) + 5 <= 23  # the last window lies inside the utterance


def test_zero_length_rows_stay_finite_and_weights_match_plain_softmax():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    pad = (torch.arange(5)[None] < torch.tensor([3, 0])[:, None]).unsqueeze(1)  # second utterance is empty
    out = mha(x, x, x, pad)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:1], plain_attention(mha, x[:1], x[:1], x[:1], pad[:1].expand(1, 5, 5)))
    w = mha.attention_weights(x, x, pad)  # (B, H, Tq, Tk)
    q = mha.q_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    k = mha.k_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    ref = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~pad.unsqueeze(1), float("-inf"))[:1].softmax(-1)
    torch.testing.assert_close(w[:1], ref)
    assert float(w[0, :, :, 3:].abs().sum()) == 0.0
