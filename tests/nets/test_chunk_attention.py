"""Chunk-wise attention in the encoders (dynamic chunk training's forward) and the Conformer's causal
convolution: references are full-context forwards on cut inputs and convolutions written out."""
import pytest
import torch
import torch.nn.functional as F

from asrkit.nets.conformer import ConformerLayer, ConvolutionModule
from asrkit.nets.transformer import TransformerEncoder
from reference_layers import linear


def encoder(kind, num_layers=2, causal=True, kernel=5, **kw):
    torch.manual_seed(0)
    builder = None
    if kind == "conformer":
        def builder():
            return ConformerLayer(16, 2, 32, conv_kernel=kernel, dropout=0.0, causal_conv=causal)
    return TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=num_layers, dropout=0.0,
                              layer_builder=builder, positional=builder is None, **kw).eval()


@pytest.mark.parametrize("kind", ["transformer", "conformer"])
@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_one_layer_chunk_equals_full_context_on_the_audio_up_to_the_chunk(kind, chunk):
    """With one layer and all left chunks, a chunk's outputs are those of a full-context forward of the
    features up to the end of that chunk (the chunk sees itself and everything before it, nothing after).
    Catches a mask that lets a chunk see the next one, hides part of its own or of an earlier one, and chunks
    that do not start at frame 0. (A Conformer's convolution of width > 1 mixes in earlier frames' chunk-masked
    attention outputs, which no full-context forward has: width 1 here; the next test covers the convolution.)"""
    enc = encoder(kind, num_layers=1, kernel=1)
    feats = torch.randn(1, 55, 20)  # 12 encoder frames
    out, lens, _ = enc(feats, torch.tensor([55]), chunk_frames=chunk)
    n = int(lens[0])
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        cut = 4 * (end - 1) + 7  # the feature frames encoder frame end - 1 reads
        ref, _, _ = enc(feats[:, :cut], torch.tensor([cut]), chunk_frames=0)
        torch.testing.assert_close(out[:, start:end], ref[:, start:end], atol=1e-5, rtol=1e-5)
    full, _, _ = enc(feats, torch.tensor([55]))
    assert (out - full).abs().max() > 1e-3  # the chunks did restrict something


@pytest.mark.parametrize("kind", ["transformer", "conformer"])
@pytest.mark.parametrize("chunk,left", [(2, -1), (3, 0), (2, 1), (5, 2)])
def test_chunks_never_see_the_future_and_left_context_is_bounded(kind, chunk, left):
    """Changing the features after chunk k's receptive field leaves chunks 0..k unchanged in every layer, with
    InterCTC outputs and self-conditioning on; changing features far before chunk k changes it only when its
    left context reaches them. Catches look-ahead through the mask, the convolution or self-conditioning, and a
    left context that is not bounded (or bounded too tightly)."""
    enc = encoder(kind, num_layers=3, interctc_layers=(1, 2), self_condition=True, vocab_size=7)
    head = torch.nn.Linear(16, 7)
    feats = torch.randn(1, 4 * 20 + 3, 20)  # 20 encoder frames
    lens = torch.tensor([feats.size(1)])
    out, _, inter = enc(feats, lens, head, chunk_frames=chunk, left_chunks=left)
    k = 2  # chunk k = frames [k * chunk, (k + 1) * chunk)
    end = (k + 1) * chunk
    later = feats.clone()
    later[:, 4 * (end - 1) + 7:] += 3 * torch.randn_like(later[:, 4 * (end - 1) + 7:])
    out2, _, inter2 = enc(later, lens, head, chunk_frames=chunk, left_chunks=left)
    torch.testing.assert_close(out2[:, :end], out[:, :end], atol=1e-5, rtol=1e-5)
    for h, h2 in zip(inter, inter2):
        torch.testing.assert_close(h2[:, :end], h[:, :end], atol=1e-5, rtol=1e-5)
    assert (out2[:, end:] - out[:, end:]).abs().max() > 1e-3

    # The last chunk K of a Transformer reads chunks K - 3 * left .. K after 3 layers (each reaches left chunks
    # further back): change only encoder frame 0's features (frame 1's receptive field starts at feature 4).
    earlier = feats.clone()
    earlier[:, :4] += 3 * torch.randn_like(earlier[:, :4])
    moved = (enc(earlier, lens, head, chunk_frames=chunk, left_chunks=left)[0] - out)[:, -1].abs().max()
    if left < 0 or (kind == "transformer" and 19 // chunk - 3 * left <= 0):
        assert moved > 1e-4
    elif kind == "transformer":
        assert moved < 1e-5


def test_chunk_default_follows_construction_and_explicit_arguments_override():
    """Catches a dynamic-chunk encoder that does not encode with full context by default (a model trained with
    drawn chunks decodes whole recordings with full context), and a fixed-chunk encoder that ignores its chunk."""
    feats, lens = torch.randn(2, 47, 20), torch.tensor([47, 39])
    full = encoder("transformer")(feats, lens)[0]
    chunked = encoder("transformer")(feats, lens, chunk_frames=3, left_chunks=1)[0]
    torch.testing.assert_close(encoder("transformer", chunk_frames=3, left_chunks=1, dynamic_chunk=True)(
        feats, lens)[0], full)
    torch.testing.assert_close(encoder("transformer", chunk_frames=3, left_chunks=1)(feats, lens)[0], chunked)
    torch.testing.assert_close(encoder("transformer", chunk_frames=3)(feats, lens, chunk_frames=0)[0], full)
    assert (chunked - full).abs().max() > 1e-3


@pytest.mark.parametrize("dejavu_input,combine", [("stacked_fbank", "a"), ("subsampled", "sum")])
def test_dejavu_never_sees_the_future_in_chunk_mode(dejavu_input, combine):
    """Catches Deja-vu's re-presentation attending over the whole utterance under a chunk mask (through either
    half of O), and stacked feature frames from beyond a chunk's receptive field."""
    enc = encoder("conformer", num_layers=3, dejavu_layer=1, dejavu_input=dejavu_input, dejavu_combine=combine)
    feats = torch.randn(1, 83, 20)  # 20 encoder frames
    lens = torch.tensor([83])
    out, _, _ = enc(feats, lens, chunk_frames=3, left_chunks=1)
    later = feats.clone()
    later[:, 4 * 8 + 7:] += 3 * torch.randn_like(later[:, 4 * 8 + 7:])  # after chunk 2's receptive field
    out2, _, _ = enc(later, lens, chunk_frames=3, left_chunks=1)
    torch.testing.assert_close(out2[:, :9], out[:, :9], atol=1e-5, rtol=1e-5)
    assert (out2[:, 9:] - out[:, 9:]).abs().max() > 1e-3
    full, _, _ = enc(later, lens, chunk_frames=0)
    assert (full[:, :9] - out[:, :9]).abs().max() > 1e-3  # full context reads the changed frames


def test_causal_convolution_matches_a_left_padded_loop_and_ignores_padding():
    """Catches right padding, a centred kernel, a kernel flipped, and padded frames read by valid ones."""
    torch.manual_seed(0)
    conv = ConvolutionModule(8, 4, dropout=0.0, causal=True).eval()  # an even width is fine when causal
    x = torch.randn(2, 9, 8)
    valid = (torch.arange(9)[None] < torch.tensor([9, 6])[:, None]).unsqueeze(-1)
    h = F.glu(linear(x, conv.pointwise_in), dim=-1) * valid
    w = conv.depthwise.weight[:, 0]  # (D, K)
    ref = torch.stack([sum(w[:, j] * (h[:, t - 3 + j] if t - 3 + j >= 0 else 0) for j in range(4))
                       for t in range(9)], 1) + conv.depthwise.bias
    expected = conv.pointwise_out(F.silu(conv.norm(ref)))
    out = conv(x, valid)
    torch.testing.assert_close(out[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :6], expected[1, :6], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="odd"):
        ConvolutionModule(8, 4, causal=False)
    assert conv.depthwise.weight.shape == ConvolutionModule(8, 5).depthwise.weight.shape[:2] + (4,)
