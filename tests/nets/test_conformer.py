"""Conformer layer: the macaron equations written out from raw weights, rotary attention against plain
softmax attention and its relative-position property, padding invariance, gradient flow, and the layer
inside the encoder stack with InterCTC and Deja-vu."""
import math

import pytest
import torch
import torch.nn.functional as F

from asrkit.nets.conformer import ConformerLayer, RotarySelfAttention
from asrkit.nets.transformer import TransformerEncoder
from reference_layers import linear, norm


def rotate_reference(x):
    """RoPE written per position and pair: (x0, x1) at position p, pair i -> rotation by p / 10000^(2i/d)."""
    b, h, t, d = x.shape
    out = torch.empty_like(x)
    for p in range(t):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            x0, x1 = x[..., p, 2 * i], x[..., p, 2 * i + 1]
            out[..., p, 2 * i] = x0 * c - x1 * s
            out[..., p, 2 * i + 1] = x0 * s + x1 * c
    return out


def attention_reference(attn: RotarySelfAttention, x, valid):
    """softmax(rot(Q) rot(K)^T / sqrt(d)) V per head, padded keys masked."""
    m = attn.mha
    b, t, _ = x.shape
    q, k, v = (linear(x, p).view(b, t, m.num_heads, m.head_dim).transpose(1, 2) for p in (m.q_proj, m.k_proj,
                                                                                          m.v_proj))
    scores = rotate_reference(q) @ rotate_reference(k).transpose(-1, -2) / math.sqrt(m.head_dim)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return linear((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1), m.out_proj)


def conv_reference(conv, x, valid):
    h = F.glu(linear(x, conv.pointwise_in), dim=-1) * valid[..., None]
    w = conv.depthwise.weight  # (D, 1, K)
    k = w.size(-1)
    padded = F.pad(h, (0, 0, k // 2, k // 2))
    out = torch.stack([(padded[:, t: t + k] * w[:, 0].T).sum(1) for t in range(h.size(1))], 1) + conv.depthwise.bias
    return linear(F.silu(norm(out, conv.norm)), conv.pointwise_out)


def layer_reference(layer: ConformerLayer, x, valid):
    def ffn(seq, y):
        return linear(F.silu(linear(y, seq[0])), seq[3])

    x = x + 0.5 * ffn(layer.ffn1, norm(x, layer.norm_ffn1))
    x = x + attention_reference(layer.attn, norm(x, layer.norm_attn), valid)
    x = x + conv_reference(layer.conv, norm(x, layer.norm_conv), valid)
    x = x + 0.5 * ffn(layer.ffn2, norm(x, layer.norm_ffn2))
    return norm(x, layer.norm_out)


def make_layer(kernel=5):
    torch.manual_seed(0)
    layer = ConformerLayer(16, 2, 32, conv_kernel=kernel, dropout=0.0).eval()
    with torch.no_grad():  # non-trivial norms, so a skipped or misplaced LayerNorm shows
        for m in layer.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
    return layer


def test_layer_matches_the_macaron_equations():
    """Catches a missing 1/2 on either FFN, a module out of order, BatchNorm-like statistics, a conv reading
    padding, or rotations applied to values (or not at all)."""
    layer = make_layer()
    x = torch.randn(2, 9, 16)
    valid = torch.arange(9)[None] < torch.tensor([9, 6])[:, None]
    out = layer(x, valid.unsqueeze(1))
    ref = layer_reference(layer, x, valid)
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :6], ref[1, :6], atol=1e-5, rtol=1e-5)


def test_rotary_attention_matches_plain_softmax_with_rotated_queries_and_keys():
    """Catches rotations missing, applied to values, paired wrongly or with another base, a wrong 1/sqrt(d),
    a padding mask ignored, and NaN from a zero-length utterance (it must stay finite)."""
    torch.manual_seed(0)
    attn = RotarySelfAttention(16, 2).eval()
    x = torch.randn(3, 7, 16, requires_grad=True)
    valid = torch.arange(7)[None] < torch.tensor([7, 4, 0])[:, None]
    out = attn(x, valid.unsqueeze(1))
    torch.testing.assert_close(out[:2], attention_reference(attn, x[:2], valid[:2]), atol=1e-5, rtol=1e-5)
    out.sum().backward()  # a NaN from the empty utterance would poison the whole batch's gradient
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_rotary_scores_depend_on_relative_offset_only():
    """Catches absolute positions (a sinusoid added, angles not shared by the two members of a pair, so not a
    rotation, or queries and keys rotated by different tables): the same content three frames later must get
    the same scores and outputs. A rotation that does nothing passes that trivially, so scores of identical
    frames must still vary with the offset."""
    torch.manual_seed(0)
    attn = RotarySelfAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    shifted = torch.cat([torch.randn(1, 3, 16), x], 1)  # x at positions 3..8, three masked frames before it
    q, k, _ = attn.project(x)  # (1, H, 6, Dh)
    q_s, k_s, _ = attn.project(shifted)
    torch.testing.assert_close(q_s[:, :, 3:] @ k_s[:, :, 3:].transpose(-1, -2), q @ k.transpose(-1, -2),
                               atol=1e-5, rtol=1e-5)
    valid = torch.tensor([[False] * 3 + [True] * 6])
    alone = attn(x, torch.ones(1, 1, 6, dtype=torch.bool))
    torch.testing.assert_close(attn(shifted, valid.unsqueeze(1))[:, 3:], alone, atol=1e-5, rtol=1e-5)

    q, k, _ = attn.project(x[:, :1].expand(1, 6, 16))  # one frame repeated: only positions tell them apart
    scores = (q @ k.transpose(-1, -2))[0]  # (H, 6, 6)
    torch.testing.assert_close(scores[:, 1:, 1:], scores[:, :-1, :-1], atol=1e-5, rtol=1e-5)  # Toeplitz
    assert (scores[:, 0] - scores[:, 0, :1]).abs().max() > 1e-2  # and not constant along a row


def test_valid_frames_do_not_depend_on_padding():
    """Catches the depthwise conv reading padded frames (no zeroing before it), attention to padded keys, and
    statistics over time or batch in the conv module's norm (BatchNorm): large random padding would show."""
    layer = make_layer(kernel=7)
    x = torch.randn(1, 8, 16)
    alone = layer(x, torch.ones(1, 1, 8, dtype=torch.bool))
    padded = layer(torch.cat([x, 50 * torch.randn(1, 5, 16)], 1), (torch.arange(13) < 8)[None, None])
    torch.testing.assert_close(padded[:, :8], alone, atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_parameter_and_not_the_padding():
    """Catches a branch that is scaled to 0 or never used (its parameters get no gradient) and padding that
    reaches valid frames (padded inputs get a gradient). Objective: a fixed random projection of the valid
    frames (``.sum()`` of the final LayerNorm's output has zero gradient by construction)."""
    layer = make_layer().train()
    x = torch.randn(2, 10, 16, requires_grad=True)
    valid = torch.arange(10)[None] < torch.tensor([10, 7])[:, None]
    out = layer(x, valid.unsqueeze(1))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1)) * valid[..., None]).sum().backward()
    for name, p in layer.named_parameters():
        if not name.endswith("k_proj.bias"):  # softmax cancels a key bias: zero gradient by construction
            assert p.grad is not None and p.grad.abs().max() > 1e-4, name
    assert x.grad[1, :7].abs().mean() > 1e-3 and x.grad[1, 7:].abs().max() < 1e-6


def test_bad_sizes_are_refused():
    """Catches an even kernel accepted ('same' padding would shift outputs by half a frame) and an odd head
    size accepted (its last dim would have no partner to rotate with)."""
    with pytest.raises(ValueError, match="odd"):
        ConformerLayer(16, 2, 32, conv_kernel=4)
    with pytest.raises(ValueError, match="even head size"):
        ConformerLayer(18, 6, 32)


def test_encoder_stack_of_conformer_layers_with_interctc_and_dejavu():
    """Catches an encoder that ignores ``layer_builder`` or rebuilds one shared layer, intermediate outputs or
    the Deja-vu input that see padding (large random padding frames here), and ``positional=False`` that
    still adds absolute sinusoids or drops the sqrt(d_model) scale of the subsampling output."""
    torch.manual_seed(0)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=3, interctc_layers=(1,),
                             dejavu_layer=2, dejavu_input="stacked_fbank", positional=False,
                             layer_builder=lambda: ConformerLayer(16, 2, 32, conv_kernel=5, dropout=0.0)).eval()
    assert all(isinstance(layer, ConformerLayer) for layer in enc.layers) and enc.intermediate_layers == (1, 2)
    assert len({id(layer) for layer in enc.layers}) == 3
    a = torch.randn(1, 40, 20)
    single, n, inter = enc(a, torch.tensor([40]))
    padded = torch.cat([a, 50 * torch.randn(1, 24, 20)], 1).expand(2, -1, -1)
    batch, lens, inter_b = enc(padded, torch.tensor([40, 64]))
    assert int(lens[0]) == int(n[0]) == single.size(1) and len(inter) == len(inter_b) == 2
    torch.testing.assert_close(batch[0, : int(n[0])], single[0], atol=1e-5, rtol=1e-5)
    for h, h_b in zip(inter, inter_b):
        torch.testing.assert_close(h_b[0, : int(n[0])], h[0], atol=1e-5, rtol=1e-5)

    sub = enc.subsampling  # positional=False: the projection times sqrt(d_model), nothing added
    c = sub.conv(a.unsqueeze(1))  # (1, C, T', F')
    projected = linear(c.transpose(1, 2).flatten(2), sub.out)  # (1, T', D)
    torch.testing.assert_close(sub(a, torch.tensor([40]))[0], projected * math.sqrt(16), atol=1e-5, rtol=1e-5)
