"""Deja-vu re-presentation: the paper's equations written out, shapes, padding invariance, gradient flow."""
import math

import pytest
import torch

from asrkit.nets.representation import FeatureRepresentation
from asrkit.nets.transformer import TransformerEncoder
from reference_layers import linear, norm


def sinusoids(length, dim):
    """Vaswani et al. positions written independently: sin on even dims, cos on odd dims."""
    table = torch.zeros(length, dim)
    for p in range(length):
        for i in range(dim):
            angle = p / 10000 ** ((i - i % 2) / dim)
            table[p, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


def plain_mha(mha, q_in, kv_in, key_mask):
    """softmax(QK^T / sqrt(d)) V with a (B, Tk) key mask or a (B, Tq, Tk) query-key mask."""
    b, tq, d = q_in.shape
    h, dh = mha.num_heads, mha.head_dim
    q = mha.q_proj(q_in).view(b, tq, h, dh).transpose(1, 2)
    k = mha.k_proj(kv_in).view(b, -1, h, dh).transpose(1, 2)
    v = mha.v_proj(kv_in).view(b, -1, h, dh).transpose(1, 2)
    allowed = key_mask[:, None, None, :] if key_mask.dim() == 2 else key_mask[:, None]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~allowed, float("-inf"))
    return mha.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, tq, d))


# A key projection's bias adds q . b_k to every score of a query row, which softmax cancels: its
# gradient is zero by construction, so it is the one parameter a gradient test must not demand.
ZERO_GRAD_BY_CONSTRUCTION = "k_proj.bias"


def feed_forward(x, rep):
    """W_b ReLU(W_a x + b_a) + b_b, from the raw weights (a missing or moved ReLU in the module differs)."""
    first, second = [m for m in rep.ffn if isinstance(m, torch.nn.Linear)]
    return linear(torch.relu(linear(x, first)), second)


def reference(rep, z0, zk, mask, combine, pre_ln=True, chunk=None):
    """Section 3.1 of the paper, one Transformer layer run over all 2S rows of O, then split; every
    operation written out from raw weights so that no sub-module of ``rep`` is trusted. ``chunk`` (S, S): row r
    of O (frame r mod S) may attend to row q when chunk[r mod S, q mod S]."""
    s = zk.size(1)
    e = sinusoids(s, rep.pos_dim).expand(zk.size(0), s, rep.pos_dim)
    z0p = torch.cat([norm(linear(z0, rep.input_proj), rep.input_norm), e], -1)
    zkp = torch.cat([norm(linear(zk, rep.layer_proj), rep.layer_norm), e], -1)
    o = torch.cat([z0p, zkp], 1)
    key_mask = torch.cat([mask, mask], 1)
    if chunk is not None:
        rows = torch.tensor([[bool(chunk[r % s, q % s]) for q in range(2 * s)] for r in range(2 * s)])
        key_mask = key_mask[:, None, :] & rows
    if pre_ln:
        h = norm(o, rep.attn_norm)
        y = o + plain_mha(rep.attn, h, h, key_mask)
        y = y + feed_forward(norm(y, rep.ffn_norm), rep)
    else:
        y = norm(o + plain_mha(rep.attn, o, o, key_mask), rep.attn_norm)
        y = norm(y + feed_forward(y, rep), rep.ffn_norm)
    a, b = y[:, :s], y[:, s:]
    merged = {"a": a, "b": b, "sum": a + b, "concat": torch.cat([a, b], -1)}[combine]
    w3, final_norm = rep.out[0], rep.out[2]
    return norm(torch.relu(linear(merged, w3)), final_norm)  # Z_{k+1} = LayerNorm(ReLU(merged W3))


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("combine", ["a", "b", "sum", "concat"])
def test_matches_the_papers_equations(combine, pre_ln):
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=2, ffn_dim=24, feat_dim=10, pos_dim=6, combine=combine,
                                normalize_before=pre_ln).eval()
    # Non-trivial LayerNorm affine parameters, so a norm that ignores them (or is skipped) shows.
    with torch.no_grad():
        for m in rep.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    z0, zk = torch.randn(2, 9, 12), torch.randn(2, 9, 16)
    mask = torch.arange(9)[None] < torch.tensor([9, 5])[:, None]
    out = rep(z0, zk, mask)
    assert out.shape == (2, 9, 16)
    ref = reference(rep, z0, zk, mask, combine, pre_ln)
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :5], ref[1, :5], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("combine", ["a", "b", "sum", "concat"])
def test_chunk_mask_holds_for_both_halves(combine, pre_ln):
    """Catches a chunk mask applied to one half of O only, to the wrong query rows (split b's rows are frames
    0..S-1 again), or not at all (chunks of 2 frames, one chunk of left context, padding too)."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=2, ffn_dim=24, feat_dim=10, pos_dim=6, combine=combine,
                                normalize_before=pre_ln).eval()
    z0, zk = torch.randn(2, 9, 12), torch.randn(2, 9, 16)
    mask = torch.arange(9)[None] < torch.tensor([9, 6])[:, None]
    chunk = torch.tensor([[s // 2 <= t // 2 and s // 2 >= t // 2 - 1 for s in range(9)] for t in range(9)])
    out = rep(z0, zk, mask, chunk)
    ref = reference(rep, z0, zk, mask, combine, pre_ln, chunk)
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :6], ref[1, :6], atol=1e-5, rtol=1e-5)
    assert (out[0] - rep(z0, zk, mask)[0]).abs().max() > 1e-3


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
    """The objective is a fixed random projection of the output: ``.sum()`` of a LayerNorm output is
    constant, so its gradient is zero by construction and would check nothing."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24)
    z0 = torch.randn(2, 6, 12, requires_grad=True)
    zk = torch.randn(2, 6, 16, requires_grad=True)
    mask = torch.arange(6)[None] < torch.tensor([6, 4])[:, None]
    out = rep(z0, zk, mask)
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * projection * mask[..., None]).sum().backward()  # the loss reads valid frames only
    for name, p in rep.named_parameters():
        if not name.endswith(ZERO_GRAD_BY_CONSTRUCTION):
            assert p.grad is not None and p.grad.abs().max() > 1e-3, name  # every parameter is used
    for grad in (z0.grad, zk.grad):
        assert grad[1, :4].abs().mean() > 1e-2  # valid frames of both streams reach the output
        # Padded frames are masked out of the attention keys: nothing flows back to them (float noise
        # allowed, a leak through the mask would be of the order of the valid frames' gradients).
        assert grad[1, 4:].abs().max() < 1e-6


def test_attention_dropout_is_applied_in_training_only():
    """Catches an ``attention_dropout`` that is accepted but never used (the other dropout is 0 here)."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24, dropout=0.0, attention_dropout=0.5)
    z0, zk, mask = torch.randn(1, 6, 12), torch.randn(1, 6, 16), torch.ones(1, 6, dtype=torch.bool)
    rep.train()
    assert not torch.allclose(rep(z0, zk, mask), rep(z0, zk, mask))
    rep.eval()
    torch.testing.assert_close(rep(z0, zk, mask), rep(z0, zk, mask))
    plain = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24, dropout=0.0, attention_dropout=0.0).train()
    torch.testing.assert_close(plain(z0, zk, mask), plain(z0, zk, mask))  # no other randomness in training


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
    single, n, inter = enc(a, torch.tensor([40]))
    assert single.shape == (1, int(n[0]), 16) and inter[0].shape == single.shape
    batch, lens, inter_b = enc(torch.cat([a, torch.randn(1, 24, 20)], 1).expand(2, -1, -1),
                                                    torch.tensor([40, 64]))
    torch.testing.assert_close(batch[0, : int(n[0])], single[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inter_b[0][0, : int(n[0])], inter[0][0], atol=1e-5, rtol=1e-5)
    enc.train()
    for module in enc.modules():  # deterministic training forward, so gradients are comparable
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    feats = torch.randn(2, 40, 20, requires_grad=True)
    out, out_lens, inter = enc(feats, torch.tensor([40, 30]))
    valid = (torch.arange(out.size(1))[None] < out_lens[:, None])[..., None]
    gen = torch.Generator().manual_seed(2)
    # Random projections of both outputs (a LayerNorm'd output's .sum() has zero gradient by construction).
    loss = (out * torch.randn(out.shape, generator=gen) * valid).sum() \
        + (inter[0] * torch.randn(out.shape, generator=gen) * valid).sum()
    loss.backward()
    for name, p in enc.named_parameters():
        if not name.endswith(ZERO_GRAD_BY_CONSTRUCTION):
            assert p.grad is not None and p.grad.abs().max() > 1e-4, name
    # Features past the second utterance's length (30 frames) influence nothing.
    assert feats.grad[1, :30].abs().mean() > 1e-3 and feats.grad[1, 30:].abs().max() < 1e-6


def test_default_layer_is_pre_ln():
    """The encoder's default (pre-LN) is the block's default too: a post-LN default would differ."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=2, ffn_dim=24, feat_dim=10, pos_dim=6, combine="a").eval()
    z0, zk, mask = torch.randn(1, 5, 12), torch.randn(1, 5, 16), torch.ones(1, 5, dtype=torch.bool)
    torch.testing.assert_close(rep(z0, zk, mask), reference(rep, z0, zk, mask, "a", pre_ln=True),
                               atol=1e-5, rtol=1e-5)


def test_feed_forward_dropout_is_applied_in_training():
    """Only the feed-forward's own dropout is left random here: catches a feed-forward without dropout."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24, dropout=0.5, attention_dropout=0.0).train()
    rep.dropout.p = 0.0  # the residual dropouts
    z0, zk, mask = torch.randn(1, 6, 12), torch.randn(1, 6, 16), torch.ones(1, 6, dtype=torch.bool)
    assert not torch.allclose(rep(z0, zk, mask), rep(z0, zk, mask))


def test_runs_in_bfloat16():
    """The position table follows the inputs' dtype (a float32 table would promote the stream and fail)."""
    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24).eval().to(torch.bfloat16)
    out = rep(torch.randn(1, 5, 12, dtype=torch.bfloat16), torch.randn(1, 5, 16, dtype=torch.bfloat16),
              torch.ones(1, 5, dtype=torch.bool))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="combine must be one of .* got 'mean'"):
        FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24, combine="mean")
    rep = FeatureRepresentation(12, 16, num_heads=4, ffn_dim=24)
    with pytest.raises(ValueError, match=r"disagree on \(batch, frames\): \(2, 5\) vs \(2, 6\)"):
        rep(torch.randn(2, 5, 12), torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.bool))


def test_defaults_are_the_papers():
    """Without arguments the block and the encoder build the paper's Deja-vu (split A over Z0 = the stacked
    input features), the same as the config's defaults; sum, concat and the subsampled Z0 are opt-in."""
    import inspect

    from asrkit.config import TransformerEncoderConfig

    torch.manual_seed(0)
    rep = FeatureRepresentation(12, 16, num_heads=2, ffn_dim=24, feat_dim=10, pos_dim=6).eval()
    assert rep.combine == "a" and rep.out[0].in_features == 16  # W3 reads one split (d_c + d_e), not both
    z0, zk, mask = torch.randn(2, 5, 12), torch.randn(2, 5, 16), torch.arange(5)[None] < torch.tensor([[5], [3]])
    torch.testing.assert_close(rep(z0, zk, mask)[mask], reference(rep, z0, zk, mask, "a")[mask],
                               atol=1e-5, rtol=1e-5)
    enc = TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=3, dejavu_layer=2)
    assert enc.dejavu_input == "stacked_fbank" and enc.dejavu.combine == "a"
    assert enc.dejavu.input_proj.in_features == 20 * enc.subsampling_factor  # W1 reads stacked filterbank frames
    cfg, params = TransformerEncoderConfig(), inspect.signature(TransformerEncoder).parameters
    assert (params["dejavu_input"].default, params["dejavu_combine"].default) == (cfg.dejavu_input, cfg.dejavu_combine)
    assert inspect.signature(FeatureRepresentation).parameters["combine"].default == cfg.dejavu_combine
