"""Deja-vu re-presentation: the paper's equations written out, shapes, padding invariance, gradient flow."""
import math

import pytest
import torch
import torch.nn.functional as F

from asrkit.nets.representation import FeatureRepresentation
from asrkit.nets.transformer import TransformerEncoder


def sinusoids(length, dim):
    """Vaswani et al. positions written independently: sin on even dims, cos on odd dims."""
    table = torch.zeros(length, dim)
    for p in range(length):
        for i in range(dim):
            angle = p / 10000 ** ((i - i % 2) / dim)
            table[p, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


def plain_mha(mha, q_in, kv_in, key_mask):
    """softmax(QK^T / sqrt(d)) V with a (B, Tk) key mask."""
    b, tq, d = q_in.shape
    h, dh = mha.num_heads, mha.head_dim
    q = mha.q_proj(q_in).view(b, tq, h, dh).transpose(1, 2)
    k = mha.k_proj(kv_in).view(b, -1, h, dh).transpose(1, 2)
    v = mha.v_proj(kv_in).view(b, -1, h, dh).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return mha.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, tq, d))


def reference(rep, z0, zk, mask, combine):
    """Section 3.1 of the paper, pre-LN Transformer layer run over all 2S rows of O, then split."""
    s = zk.size(1)
    e = sinusoids(s, rep.pos_dim).expand(zk.size(0), s, rep.pos_dim)
    z0p = torch.cat([F.layer_norm(z0 @ rep.input_proj.weight.T + rep.input_proj.bias, (rep.feat_dim,),
                                  rep.input_norm.weight, rep.input_norm.bias), e], -1)
    zkp = torch.cat([F.layer_norm(zk @ rep.layer_proj.weight.T + rep.layer_proj.bias, (rep.feat_dim,),
                                  rep.layer_norm.weight, rep.layer_norm.bias), e], -1)
    o = torch.cat([z0p, zkp], 1)
    h = rep.attn_norm(o)
    y = o + plain_mha(rep.attn, h, h, torch.cat([mask, mask], 1))
    y = y + rep.ffn(rep.ffn_norm(y))
    a, b = y[:, :s], y[:, s:]
    merged = {"a": a, "b": b, "sum": a + b, "concat": torch.cat([a, b], -1)}[combine]
    return rep.out(merged)


@pytest.mark.parametrize("combine", ["a", "b", "sum", "concat"])
def test_matches_the_papers_equations(combine):
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=2, ffn_dim=24, feat_dim=10, pos_dim=6, combine=combine).eval()
    z0, zk = torch.randn(2, 9, 12), torch.randn(2, 9, 16)
    mask = torch.arange(9)[None] < torch.tensor([9, 5])[:, None]
    out = rep(z0, zk, mask)
    assert out.shape == (2, 9, 16)
    ref = reference(rep, z0, zk, mask, combine)
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :5], ref[1, :5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_valid_frames_do_not_depend_on_padding(pre_ln):
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24, normalize_before=pre_ln).eval()
    z0, zk = torch.randn(1, 7, 12), torch.randn(1, 7, 16)
    single = rep(z0, zk, torch.ones(1, 7, dtype=torch.bool))
    padded = rep(torch.cat([z0, 50 * torch.randn(1, 4, 12)], 1), torch.cat([zk, 50 * torch.randn(1, 4, 16)], 1),
                 torch.arange(11)[None] < 7)
    torch.testing.assert_close(padded[:, :7], single, atol=1e-5, rtol=1e-5)


def test_gradients_reach_both_inputs_and_every_parameter():
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24)
    z0 = torch.randn(2, 6, 12, requires_grad=True)
    zk = torch.randn(2, 6, 16, requires_grad=True)
    rep(z0, zk, torch.arange(6)[None] < torch.tensor([6, 4])[:, None]).sum().backward()
    for name, p in rep.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert z0.grad[1, :4].abs().sum() > 0 and zk.grad[1, :4].abs().sum() > 0
    assert float(z0.grad[1, 4:].abs().sum()) == 0.0  # padding frames influence nothing


def test_width_must_split_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        FeatureRepresentation(12, 16, num_heads=3, ffn_dim=24)  # 16 + 4 = 20


@pytest.mark.parametrize("dejavu_input", ["subsampled", "stacked_fbank"])
def test_encoder_with_dejavu_padding_and_gradients(dejavu_input):
    torch.manual_seed(0)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=3, dejavu_layer=2,
                             dejavu_input=dejavu_input).eval()
    assert enc.intermediate_layers == (2,)  # the auxiliary loss sits at the re-presentation layer
    a = torch.randn(1, 40, 20)
    single, n, inter = enc.forward_intermediate(a, torch.tensor([40]))
    assert single.shape == (1, int(n[0]), 16) and inter[0].shape == single.shape
    batch, lens, inter_b = enc.forward_intermediate(torch.cat([a, torch.randn(1, 24, 20)], 1).expand(2, -1, -1),
                                                    torch.tensor([40, 64]))
    torch.testing.assert_close(batch[0, : int(n[0])], single[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inter_b[0][0, : int(n[0])], inter[0][0], atol=1e-5, rtol=1e-5)
    enc.train()
    feats = torch.randn(2, 40, 20, requires_grad=True)
    out, _, inter = enc.forward_intermediate(feats, torch.tensor([40, 30]))
    (out.sum() + inter[0].sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())
    assert enc.dejavu.input_proj.weight.grad.abs().sum() > 0
