import math

import pytest
import torch

from asrkit.nets.attention import LocationAwareAttention
from asrkit.nets.mask import lengths_to_mask


def _loop_energies(att: LocationAwareAttention, s: torch.Tensor, h: torch.Tensor, alpha: torch.Tensor):
    """e_ij = w^T tanh(W s + V h_j + U f_ij + b), f_ij[k] = sum_r F[k, r] alpha[j + r - pad]: plain loops."""
    W = att.query_proj.weight.tolist()
    V, b = att.memory_proj.weight.tolist(), att.memory_proj.bias.tolist()
    U = att.location_proj.weight.tolist()
    Fk = att.location_conv.weight[:, 0].tolist()  # (K, r)
    w = att.score_proj.weight[0].tolist()
    A, K, R = len(b), len(Fk), len(Fk[0])
    pad = R // 2
    T = len(h)
    out = []
    for j in range(T):
        f = [sum(Fk[k][r] * (alpha[j + r - pad] if 0 <= j + r - pad < T else 0.0) for r in range(R))
             for k in range(K)]
        e = 0.0
        for a in range(A):
            z = (sum(W[a][d] * s[d] for d in range(len(s))) + sum(V[a][d] * h[j][d] for d in range(len(h[j])))
                 + sum(U[a][k] * f[k] for k in range(K)) + b[a])
            e += w[a] * math.tanh(z)
        out.append(e)
    return out


def test_energies_equal_loop_implementation_of_the_formula():
    torch.manual_seed(0)
    att = LocationAwareAttention(memory_dim=3, query_dim=4, attention_dim=5, conv_channels=2, conv_kernel=3)
    s, h = torch.randn(2, 4), torch.randn(2, 6, 3)
    alpha = torch.rand(2, 6).softmax(-1)
    got = att.energies(s, att.project_memory(h), alpha)
    for i in range(2):
        ref = _loop_energies(att, s[i].tolist(), h[i].tolist(), alpha[i].tolist())
        torch.testing.assert_close(got[i], torch.tensor(ref), atol=1e-5, rtol=1e-5)


def test_softmax_context_and_initial_weights():
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=5)
    h, s = torch.randn(2, 6, 3), torch.randn(2, 4)
    mask = lengths_to_mask(torch.tensor([6, 4]), 6)
    alpha0 = LocationAwareAttention.initial_weights(mask)
    torch.testing.assert_close(alpha0[1], torch.tensor([0.25] * 4 + [0.0] * 2))
    ctx, weights = att(s, h, mask, alpha0)
    e = att.energies(s, att.project_memory(h), alpha0)
    ref_w1 = e[1, :4].softmax(-1)
    torch.testing.assert_close(weights[1, :4], ref_w1)
    torch.testing.assert_close(ctx[1], ref_w1 @ h[1, :4])


def test_padding_frames_get_zero_weight_and_do_not_change_the_result():
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=3, conv_kernel=7)
    h, s1, s2 = torch.randn(1, 5, 3), torch.randn(1, 4), torch.randn(1, 4)
    # Alone: 5 frames.
    m = torch.ones(1, 5, dtype=torch.bool)
    ctx_a, w_a = att(s1, h, m, LocationAwareAttention.initial_weights(m))
    ctx_a2, w_a2 = att(s2, h, m, w_a)  # second step uses the first alignment through the location conv
    # Padded to 9 frames with large garbage next to a longer utterance.
    hp = torch.cat([torch.cat([h, 1e3 * torch.randn(1, 4, 3)], 1), torch.randn(1, 9, 3)])
    mp = lengths_to_mask(torch.tensor([5, 9]), 9)
    sp1, sp2 = torch.cat([s1, torch.randn(1, 4)]), torch.cat([s2, torch.randn(1, 4)])
    ctx_p, w_p = att(sp1, hp, mp, LocationAwareAttention.initial_weights(mp))
    ctx_p2, w_p2 = att(sp2, hp, mp, w_p)
    for w in (w_p, w_p2):
        assert torch.all(w[0, 5:] == 0.0)  # exactly zero, not just small
        torch.testing.assert_close(w.sum(-1), torch.ones(2))
    torch.testing.assert_close(w_p[:1, :5], w_a)
    torch.testing.assert_close(w_p2[:1, :5], w_a2)
    torch.testing.assert_close(ctx_p[:1], ctx_a)
    torch.testing.assert_close(ctx_p2[:1], ctx_a2)


def test_zero_length_utterance_gives_zero_weights_not_nan():
    att = LocationAwareAttention(3, 4, 5)
    mask = lengths_to_mask(torch.tensor([3, 0]), 3)
    ctx, w = att(torch.randn(2, 4), torch.randn(2, 3, 3), mask, LocationAwareAttention.initial_weights(mask))
    assert torch.all(w[1] == 0) and torch.all(ctx[1] == 0)
    assert torch.isfinite(w).all()


def test_even_kernel_is_rejected():
    with pytest.raises(ValueError, match="odd"):
        LocationAwareAttention(3, 4, 5, conv_kernel=4)
