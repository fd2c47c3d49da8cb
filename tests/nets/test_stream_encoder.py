"""The encoders' chunk step with explicit caches: a stream fed chunk by chunk (or in irregular pieces) gives the
full forward's output under the same chunk mask; streams at different positions batch; caches stay bounded."""
import pytest
import torch

from asrkit.nets.conformer import ConformerLayer
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.stream_cache import EncoderCache
from asrkit.nets.transformer import TransformerEncoder


def encoder(kind, num_layers=2, causal=True, input_layer="conv2d", **kw):
    torch.manual_seed(0)
    builder = None
    if kind == "conformer":
        def builder():
            return ConformerLayer(16, 2, 32, conv_kernel=5, dropout=0.0, causal_conv=causal)
    return TransformerEncoder(20, d_model=16, num_heads=2, ffn_dim=32, num_layers=num_layers, dropout=0.0,
                              input_layer=input_layer, layer_builder=builder, positional=builder is None,
                              **kw).eval()


def stream(enc, feats, cache, pieces=None, head=None):
    """Feed feats (B, T, F) in chunks of input_frames_needed() (or the given piece sizes), then final."""
    outs, pos, t = [], 0, feats.size(1)
    while True:
        need = cache.input_frames_needed() if pieces is None else pieces[len(outs) % len(pieces)]
        if pos + need > t:
            break
        out, cache = enc.forward_chunk(feats[:, pos:pos + need], cache, ctc_head=head)
        assert pieces is not None or out.size(1) == cache.chunk_frames
        outs.append(out)
        pos += need
    out, cache = enc.forward_chunk(feats[:, pos:], cache, ctc_head=head, final=True)
    return torch.cat(outs + [out], dim=1), cache


CASES = [("transformer", 1, -1), ("transformer", 3, 0), ("transformer", 4, 2), ("conformer", 1, 1),
         ("conformer", 3, -1), ("conformer", 4, 0), ("conformer", 2, 2)]
DEJAVU = [("stacked_fbank", "a", True), ("subsampled", "b", False), ("stacked_fbank", "concat", True),
          ("stacked_fbank", "sum", False)]


@pytest.mark.parametrize("kind,chunk,left", CASES)
def test_stream_equals_the_chunk_masked_forward(kind, chunk, left):
    """Catches positions restarting at each chunk (absolute sinusoids or rotary angles without the stream's
    offset), a left context kept too short or too long, a convolution cache that drops or repeats frames, the
    subsampling's leftover frames lost at chunk boundaries, and a final chunk that drops the last frames."""
    enc = encoder(kind, num_layers=3, interctc_layers=(1,), self_condition=True, vocab_size=7)
    head = torch.nn.Linear(16, 7)
    feats = torch.randn(1, 97, 20)  # 23 encoder frames: the last chunk is short for most sizes
    ref, lens, _ = enc(feats, torch.tensor([97]), head, chunk_frames=chunk, left_chunks=left)
    out, cache = stream(enc, feats, enc.init_stream(1, torch.device("cpu"), chunk, left), head=head)
    assert out.shape == ref.shape and int(cache.offset[0]) == int(lens[0]) == 23
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dejavu_input,combine,pre_ln", DEJAVU)
@pytest.mark.parametrize("left", [-1, 1])
def test_stream_with_dejavu_equals_the_chunk_masked_forward(dejavu_input, combine, pre_ln, left):
    """Catches the re-presentation's left context (either half of O) not cached or not bounded, its positions E
    restarting at each chunk, and stacked feature frames taken from the wrong place of a chunk's input."""
    enc = encoder("transformer", num_layers=3, dejavu_layer=2, dejavu_input=dejavu_input, dejavu_combine=combine,
                  normalize_before=pre_ln, dejavu_dim=8, dejavu_pos_dim=4)
    feats = torch.randn(2, 97, 20)
    ref, _, _ = enc(feats, torch.tensor([97, 97]), chunk_frames=3, left_chunks=left)
    out, cache = stream(enc, feats, enc.init_stream(2, torch.device("cpu"), 3, left), pieces=[13, 1, 30])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert cache.dejavu_keys.shape[:4] == (2, 2, 2, 23 if left < 0 else 3)
    a, b = cache.unstack()
    assert a.dejavu_keys.shape[:2] == (1, 2)
    both = EncoderCache.stack([a, b])
    torch.testing.assert_close(both.dejavu_keys, cache.dejavu_keys)
    torch.testing.assert_close(both.dejavu_values, cache.dejavu_values)


@pytest.mark.parametrize("input_layer", ["conv2d6", "conv2d8"])
def test_stream_in_irregular_pieces_with_other_subsamplings(input_layer):
    """Catches leftover frames miscounted when pieces do not fall on chunk boundaries (pieces of 1 frame to
    2 s), and a chunk step that assumes x4 subsampling."""
    enc = encoder("conformer", input_layer=input_layer)
    feats = torch.randn(2, 260, 20)
    ref, _, _ = enc(feats, torch.tensor([260, 260]), chunk_frames=3, left_chunks=1)
    out, _ = stream(enc, feats, enc.init_stream(2, torch.device("cpu"), 3, 1), pieces=[1, 37, 4, 200, 9])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,left,extra", [("transformer", -1, {}), ("conformer", 2, {}), ("conformer", -1, {}),
                                             ("transformer", -1, {"num_layers": 3, "dejavu_layer": 1})])
def test_streams_at_different_positions_batch_like_each_alone(kind, left, extra):
    """Catches stacked caches whose shorter left contexts are not masked (padding attended to), offsets not
    kept per stream, unstack mixing up rows or keeping the padding, and stack accepting streams whose next
    chunks need different input."""
    enc = encoder(kind, **extra)
    c = 2
    a_feats, b_feats = torch.randn(1, 60, 20), torch.randn(1, 60, 20)
    caches = []
    for feats, ahead in ((a_feats, 4), (b_feats, 1)):  # a is 4 chunks in, b 1 chunk in
        cache = enc.init_stream(1, torch.device("cpu"), c, left)
        pos = 0
        for _ in range(ahead):
            need = cache.input_frames_needed()
            _, cache = enc.forward_chunk(feats[:, pos:pos + need], cache)
            pos += need
        caches.append((cache, pos))
    (ca, pa), (cb, pb) = caches
    assert ca.key_valid.size(1) != cb.key_valid.size(1) or left >= 0
    need = ca.input_frames_needed()
    assert need == cb.input_frames_needed() == 4 * c
    both = EncoderCache.stack([ca, cb])
    x = torch.cat([a_feats[:, pa:pa + need], b_feats[:, pb:pb + need]])
    out, new = enc.forward_chunk(x, both)
    alone_a, next_a = enc.forward_chunk(a_feats[:, pa:pa + need], ca)
    alone_b, next_b = enc.forward_chunk(b_feats[:, pb:pb + need], cb)
    torch.testing.assert_close(out, torch.cat([alone_a, alone_b]), atol=1e-5, rtol=1e-5)
    for got, want in zip(new.unstack(), (next_a, next_b)):
        for name in ("feats", "offset", "keys", "values", "key_valid", "conv", "dejavu_keys", "dejavu_values"):
            if extra or not name.startswith("dejavu"):
                torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-5, rtol=1e-5)
            else:
                assert getattr(got, name) is getattr(want, name) is None
    fresh = enc.init_stream(1, torch.device("cpu"), c, left)
    assert fresh.input_frames_needed() == 4 * c + 3
    with pytest.raises(ValueError, match=r"^streams holding 0 and 3 leftover feature frames cannot be stacked: their "
                                         r"next chunks need different input \(11 and 8 frames\); stack streams "
                                         r"whose input_frames_needed\(\) agree$"):
        EncoderCache.stack([fresh, ca])
    with pytest.raises(ValueError, match="^streams with different chunk_frames / left_chunks cannot be stacked$"):
        EncoderCache.stack([ca, enc.init_stream(1, torch.device("cpu"), c + 1, left)])


def test_caches_stay_bounded_over_a_long_stream():
    """Catches a cache that keeps the whole history (memory growing with the stream) instead of left_chunks
    chunks, and leftover input that accumulates."""
    enc = encoder("conformer")
    cache = enc.init_stream(1, torch.device("cpu"), 3, 2)
    for i in range(40):
        _, cache = enc.forward_chunk(torch.randn(1, cache.input_frames_needed(), 20), cache)
        assert cache.keys.size(3) == cache.values.size(3) == cache.key_valid.size(1) == min(3 * (i + 1), 6)
        assert cache.feats.size(1) == 3 and cache.conv.shape == (1, 2, 16, 4)
    assert int(cache.offset[0]) == 120 and cache.left_frames() == 6
    unlimited = enc.init_stream(1, torch.device("cpu"), 3, -1)
    for _ in range(5):
        _, unlimited = enc.forward_chunk(torch.randn(1, unlimited.input_frames_needed(), 20), unlimited)
    assert unlimited.keys.size(3) == 15 and unlimited.left_frames() == -1


def test_partial_input_waits_and_the_right_context_is_the_subsampling_overlap():
    """Catches a chunk step that emits frames before a chunk is complete, and a stated right context other
    than the receptive field's overlap (3 feature frames = 30 ms at x4, 5 at x6, 7 at x8)."""
    enc = encoder("transformer")
    cache = enc.init_stream(1, torch.device("cpu"), 4, -1)
    out, cache = enc.forward_chunk(torch.randn(1, 18, 20), cache)  # 19 frames complete 4 encoder frames
    assert out.shape == (1, 0, 16) and cache.input_frames_needed() == 1 and int(cache.offset[0]) == 0
    out, cache = enc.forward_chunk(torch.randn(1, 1, 20), cache)
    assert out.shape == (1, 4, 16) and cache.input_frames_needed() == 16
    out, _ = enc.forward_chunk(torch.zeros(1, 0, 20), cache, final=True)
    assert out.shape == (1, 0, 16)
    assert [encoder("transformer", input_layer=k).streaming_right_context_frames
            for k in ("conv2d", "conv2d6", "conv2d8")] == [3, 5, 7]


def test_encoders_that_cannot_stream_are_refused_naming_the_option():
    """Catches a centred convolution, Deja-vu or a BLSTM streamed silently (their outputs would need the future),
    and a stream without a chunk size."""
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="causal_conv"):
        encoder("conformer", causal=False).init_stream(1, cpu, 4, -1)
    with pytest.raises(ValueError, match="model.encoder.kind blstm"):
        BLSTMEncoder(20, 8, 2).init_stream(1, cpu, 4, -1)
    with pytest.raises(ValueError, match="chunk_frames > 0"):
        encoder("transformer").init_stream(1, cpu)
    with pytest.raises(ValueError, match="left_chunks >= -1"):
        encoder("transformer").init_stream(1, cpu, 4, -2)
    enc = encoder("transformer", chunk_frames=5, left_chunks=3)
    default = enc.init_stream(2, cpu)
    assert (default.chunk_frames, default.left_chunks, default.batch_size) == (5, 3, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stream_on_cuda_equals_the_chunk_masked_forward(monkeypatch):
    """Catches cache tensors, positions or masks made on the CPU for a stream on a GPU (an error, or a copy per
    chunk), and stacked streams that leave the device."""
    # cuDNN's TF32 convolutions (on by default from Ampere) round to 10 bits: 6e-4 apart on an H200
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    enc = encoder("conformer", num_layers=2).cuda()
    feats = torch.randn(2, 97, 20, device="cuda")
    ref, _, _ = enc(feats, torch.tensor([97, 97], device="cuda"), chunk_frames=4, left_chunks=1)
    caches = enc.init_stream(2, torch.device("cuda"), 4, 1).unstack()
    out, cache = stream(enc, feats, EncoderCache.stack(caches))
    assert all(t.device.type == "cuda" for t in (cache.feats, cache.offset, cache.keys, cache.key_valid, cache.conv))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_stream_runs_in_bfloat16():
    """Catches cache tensors or positions (rotary tables, Deja-vu's E) made in float32 for a bfloat16 model: a
    dtype error, or float32 activations out."""
    enc = encoder("conformer", num_layers=3, dejavu_layer=1).to(torch.bfloat16)
    cache = enc.init_stream(2, torch.device("cpu"), 2, 1)
    for _ in range(2):
        out, cache = enc.forward_chunk(torch.randn(2, cache.input_frames_needed(), 20, dtype=torch.bfloat16), cache)
        assert out.dtype == cache.keys.dtype == cache.dejavu_keys.dtype == cache.conv.dtype == torch.bfloat16
        assert out.shape == (2, 2, 16) and torch.isfinite(out).all()
