import math

import pytest
import torch

from asrkit.nets.attention import LocationAwareAttention
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder
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


# ---- sharpening, smoothing, windowing (the paper's section 2.3) -------------------------------------------------


def _loop_weights(att: LocationAwareAttention, s, h, alpha, length: int, first: bool = False):
    """alpha_ij of the paper for one utterance, frame by frame in Python floats:
    exp(beta e_ij) / sum_j exp(beta e_ij), or sigmoid(beta e_ij) / sum_j sigmoid(beta e_ij) with smoothing,
    the sum running over the valid frames in [m - w, m + w - 1], m = first frame where cumsum(alpha) >= 0.5
    (no window at the first step, ``first``). Energies come from the valid frames only, so padding that
    leaks into the scores or the location conv makes the result differ."""
    T = len(h)
    e = _loop_energies(att, s, h[:length], alpha[:length])
    beta, w = att.sharpening, att.window
    lo, hi = 0, length - 1
    if w > 0 and not first:
        c = 0.0
        for m in range(length):
            c += alpha[m]
            if c >= 0.5:
                break
        lo, hi = max(lo, m - w), min(hi, m + w - 1)
    num = []
    for j in range(T):
        if lo <= j <= hi:
            num.append(1.0 / (1.0 + math.exp(-beta * e[j])) if att.smoothing else math.exp(beta * e[j]))
        else:
            num.append(0.0)
    z = sum(num)
    return [n / z for n in num]


def _tie_free_alignments(lengths, T: int, peaks=()):
    """(B, T) alignments summing to 1 over the valid frames, whose cumulative sums stay clear of 0.5 (so the
    float32 median and the Python one cannot fall on different sides of a tie). ``peaks``: (row, frame)
    pairs that get most of the mass, to put the median at the edges of the utterance."""
    g = torch.Generator().manual_seed(1)
    mask = lengths_to_mask(torch.tensor(lengths), T)
    alpha = (torch.randn(len(lengths), T, generator=g) * 2).masked_fill(~mask, float("-inf"))
    for b, j in peaks:
        alpha[b, j] = 8.0
    alpha = alpha.softmax(-1)
    c = alpha.double().cumsum(-1)
    assert ((c - 0.5).abs() > 1e-4).all(), "fixture alignment is too close to a median tie"
    return alpha, mask


OPTIONS = [dict(), dict(sharpening=2.5), dict(sharpening=0.5), dict(smoothing=True), dict(window=1),
           dict(window=2), dict(window=2, sharpening=2.0, smoothing=True)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_weights_equal_loop_implementation_of_the_paper_formulas(options):
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3, **options)
    lengths, T = [9, 6, 4], 9
    # Row 1 peaks on its last valid frame (its window runs into the padding), row 2 on frame 0 (window runs
    # below frame 0): catches bounds that are not clipped or that let padding in.
    alpha, mask = _tie_free_alignments(lengths, T, peaks=[(1, 5), (2, 0)])
    h, s = torch.randn(3, T, 3), torch.randn(3, 4)
    h[1, 6:] = 1e3  # garbage on padding must not reach valid frames
    for prev, first in ((alpha, False), (LocationAwareAttention.initial_weights(mask), True)):
        ctx, got = att(s, h, mask, prev)
        for b, n in enumerate(lengths):
            ref = torch.tensor(_loop_weights(att, s[b].tolist(), h[b].tolist(), prev[b].tolist(), n, first))
            # Wrong formula (beta missing or applied twice, exp instead of sigmoid), wrong median, wrong bounds:
            torch.testing.assert_close(got[b], ref, atol=1e-5, rtol=1e-5)
            # Outside the window and on padding the weight is exactly 0, not merely small: catches masking by a
            # penalty too weak to underflow exp (say -20), which the tolerance above would let through.
            assert torch.all(got[b][ref == 0] == 0)
            torch.testing.assert_close(ctx[b], got[b] @ h[b], atol=1e-5, rtol=1e-5)


def _plain_softmax(att, s, h, mask, prev):
    """Today's normalisation, written out: catches any change of the default behaviour."""
    e = att.energies(s, att.project_memory(h), prev).float()
    return e.masked_fill(~mask, torch.finfo(e.dtype).min).softmax(-1) * mask


def test_defaults_and_beta_one_are_bitwise_the_plain_softmax():
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3)
    assert (att.sharpening, att.smoothing, att.window) == (1.0, False, 0)  # defaults must keep old models as trained
    alpha, mask = _tie_free_alignments([7, 5], 7)
    h, s = torch.randn(2, 7, 3), torch.randn(2, 4)
    want = _plain_softmax(att, s, h, mask, alpha)
    assert torch.equal(att(s, h, mask, alpha)[1], want)
    att_beta1 = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3, sharpening=1.0)
    att_beta1.load_state_dict(att.state_dict())
    assert torch.equal(att_beta1(s, h, mask, alpha)[1], want)  # beta = 1 is exactly today's result


def test_sharpening_makes_alignments_peakier():
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3)
    with torch.no_grad():
        att.score_proj.weight.mul_(4)  # spread the energies so the alignments are far from flat
    alpha, mask = _tie_free_alignments([8, 5], 8)
    h, s = torch.randn(2, 8, 3), torch.randn(2, 4)

    def entropy(w):
        return -(w * w.clamp(min=1e-30).log()).sum(-1)

    w1 = att(s, h, mask, alpha)[1]
    att.sharpening = 3.0
    w3 = att(s, h, mask, alpha)[1]
    # beta > 1 must sharpen, not flatten (catches e / beta in place of beta * e)...
    assert torch.all(entropy(w3) < entropy(w1) - 1e-3)
    # ...and keep the ranking of frames (catches a beta applied after the normalisation).
    assert torch.equal(w3.argmax(-1), w1.argmax(-1))
    torch.testing.assert_close(w3.sum(-1), torch.ones(2), atol=1e-5, rtol=0)


def test_smoothing_is_the_sigmoid_normalisation_even_for_very_negative_energies():
    torch.manual_seed(0)
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3, smoothing=True)
    alpha, mask = _tie_free_alignments([6, 4], 6)
    h, s = torch.randn(2, 6, 3), torch.randn(2, 4)
    e = att.energies(s, att.project_memory(h), alpha)
    want = torch.sigmoid(e) * mask
    want = want / want.sum(-1, keepdim=True)
    # Catches softmax left in place (or sigmoid without the renormalisation over valid frames).
    torch.testing.assert_close(att(s, h, mask, alpha)[1], want, atol=1e-5, rtol=1e-5)
    # Energies of about -250 everywhere: sigmoid underflows to 0 in float32, so a literal sigmoid(e) / sum gives
    # 0 / 0 = NaN; the ratio itself is uniform (all energies are equal once tanh saturates).
    with torch.no_grad():
        att.memory_proj.bias.fill_(50.0)
        att.score_proj.weight.fill_(-50.0)
    w = att(s, h, mask, alpha)[1]
    torch.testing.assert_close(w, LocationAwareAttention.initial_weights(mask), atol=1e-5, rtol=0)


def test_alignment_median_is_the_first_frame_reaching_half_the_mass():
    w = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # [0.5, 0.5] -> 0 catches "> 0.5" in place of ">= 0.5"; the zero row (a zero-length utterance) gives T.
    assert LocationAwareAttention.alignment_median(w).tolist() == [2, 0, 2, 4]
    # The uniform alpha_0 puts the median in the middle of the valid frames.
    mask = lengths_to_mask(torch.tensor([4, 5, 8]), 8)
    assert LocationAwareAttention.alignment_median(LocationAwareAttention.initial_weights(mask)).tolist() == [1, 2, 3]


def test_window_keeps_only_frames_around_the_median_renormalised():
    torch.manual_seed(0)
    w = 2
    att = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3, window=w)
    lengths, T = [12, 9, 5], 12
    alpha, mask = _tie_free_alignments(lengths, T, peaks=[(2, 4)])
    h, s = torch.randn(3, T, 3), torch.randn(3, 4)
    got = att(s, h, mask, alpha)[1]
    e = att.energies(s, att.project_memory(h), alpha)
    for b, n in enumerate(lengths):
        m = LocationAwareAttention.alignment_median(alpha[b:b + 1]).item()
        lo, hi = max(0, m - w), min(n, m + w)  # frames lo .. hi - 1
        assert torch.all(got[b, :lo] == 0) and torch.all(got[b, hi:] == 0)  # exactly 0 outside, padding included
        # Inside: the softmax over the window alone (catches weights cut to zero but not renormalised).
        torch.testing.assert_close(got[b, lo:hi], e[b, lo:hi].softmax(-1), atol=1e-5, rtol=1e-5)
    # A window wider than the utterance is no window at all (catches bounds that drop frames at the edges).
    att_wide = LocationAwareAttention(3, 4, 5, conv_channels=2, conv_kernel=3, window=T)
    att_wide.load_state_dict(att.state_dict())
    assert torch.equal(att_wide(s, h, mask, alpha)[1], _plain_softmax(att, s, h, mask, alpha))
    # The first step (uniform alpha_0) is not windowed: a window around the middle would hide the start.
    alpha0 = LocationAwareAttention.initial_weights(mask)
    assert torch.equal(att(s, h, mask, alpha0)[1], _plain_softmax(att, s, h, mask, alpha0))


def test_zero_length_utterance_with_all_options_gives_zero_weights_not_nan():
    att = LocationAwareAttention(3, 4, 5, sharpening=2.0, smoothing=True, window=2)
    mask = lengths_to_mask(torch.tensor([3, 0]), 3)
    ctx, w = att(torch.randn(2, 4), torch.randn(2, 3, 3), mask, LocationAwareAttention.initial_weights(mask))
    assert torch.all(w[1] == 0) and torch.all(ctx[1] == 0) and torch.isfinite(w).all()


@pytest.mark.parametrize("bad", [dict(sharpening=0.0), dict(sharpening=-1.0), dict(sharpening=float("nan")),
                                 dict(window=-1), dict(window=2.5), dict(window=True)])
def test_bad_options_are_rejected(bad):
    with pytest.raises(ValueError, match="sharpening|window"):
        LocationAwareAttention(3, 4, 5, **bad)


# ---- through the LSTM decoder ------------------------------------------------------------------------------------


def _decoder(**options) -> LSTMAttentionDecoder:
    torch.manual_seed(0)
    # Positional parameters as before: vocab, memory_dim, embed, hidden, layers, attention_dim, channels, kernel,
    # dropout, sos_id.
    return LSTMAttentionDecoder(7, 6, 8, 16, 1, 12, 2, 5, 0.0, 2, **options).eval()


def test_decoder_threads_the_options_to_its_attention():
    att = _decoder(sharpening=2.0, smoothing=True, window=5).attention
    assert (att.sharpening, att.smoothing, att.window) == (2.0, True, 5)
    att = _decoder().attention
    assert (att.sharpening, att.smoothing, att.window) == (1.0, False, 0)
    assert att.location_conv.kernel_size == (5,)  # the positional conv_kernel still lands where it did


def test_decode_step_with_a_window_over_long_memory_of_different_lengths():
    w = 6
    dec = _decoder(window=w)
    lens = torch.tensor([600, 250, 37])
    memory = torch.randn(3, 600, 6)
    mask = lengths_to_mask(lens, 600)
    ys, state, prev = torch.full((3, 1), 2), None, None
    with torch.no_grad():
        for i in range(10):
            logp, state = dec.decode_step(ys, memory, lens, state)
            a = state.att_weights  # alpha_i (3, 600)
            assert torch.isfinite(logp).all()
            torch.testing.assert_close(a.sum(-1), torch.ones(3), atol=1e-5, rtol=0)
            assert torch.all(a[~mask] == 0)  # padding exactly 0 in every row, whatever its length
            if i == 0:
                assert torch.all(a[mask] > 0)  # first step not windowed: every valid frame keeps some weight
            else:
                for b in range(3):
                    m = LocationAwareAttention.alignment_median(prev[b:b + 1]).item()
                    lo, hi = max(0, m - w), min(int(lens[b]), m + w)
                    # Catches a window around the wrong row's median, or around a median taken over padding.
                    assert torch.all(a[b, :lo] == 0) and torch.all(a[b, hi:] == 0)
                    assert a[b, lo:hi].sum() > 1 - 1e-5
            prev = a
            ys = torch.cat([ys, logp.argmax(-1, keepdim=True)], 1)
        # The incremental state, a recomputation from scratch and the teacher-forced pass agree under the window.
        fresh, fresh_state = dec.decode_step(ys[:, :-1], memory, lens, None)
        torch.testing.assert_close(fresh, logp, atol=1e-5, rtol=1e-5)
        tf = dec.attention_weights(ys[:, :-1], None, memory, lens)
        torch.testing.assert_close(tf[:, -1], state.att_weights, atol=1e-5, rtol=1e-5)


def test_set_decoding_window_overrides_the_trained_setting():
    plain, windowed = _decoder(), _decoder(window=4)
    # window is not part of the weights: a checkpoint trained without it loads as before.
    assert plain.state_dict().keys() == windowed.state_dict().keys()
    lens = torch.tensor([80, 30])
    memory, ys = torch.randn(2, 80, 6), torch.tensor([[2, 3, 4, 5, 6], [2, 4, 4, 3, 1]])
    with torch.no_grad():
        before = plain.decode_step(ys, memory, lens)[0]
        want = windowed.decode_step(ys, memory, lens)[0]
        assert not torch.allclose(before, want)  # the window matters here, so the next check means something
        plain.set_decoding_window(4)
        assert torch.equal(plain.decode_step(ys, memory, lens)[0], want)
        plain.set_decoding_window(0)  # and off again, exactly as before
        assert torch.equal(plain.decode_step(ys, memory, lens)[0], before)
    with pytest.raises(ValueError, match="window"):
        plain.set_decoding_window(-3)
