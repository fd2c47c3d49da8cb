import math

import torch

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.transformer import TransformerEncoder


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
        single, n = enc(a, torch.tensor([40]))
        batch, lens = enc(torch.cat([a, torch.zeros(1, 24, 20)], 1).expand(2, -1, -1).contiguous(),
                          torch.tensor([40, 64]))
        assert int(lens[0]) == int(n[0]) == single.shape[1]
        torch.testing.assert_close(batch[0, : int(n[0])], single[0], atol=1e-5, rtol=1e-5)


def test_encoder_gradients_flow_to_every_parameter():
    torch.manual_seed(0)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2)
    out, _ = enc(torch.randn(2, 30, 20), torch.tensor([30, 22]))
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())
