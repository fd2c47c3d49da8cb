"""Dynamic chunk training (WeNet U2): the per-batch draw, its seeding, the model's hook, and the config keys."""
import collections

import pytest
import torch

from asrkit.config import (ConfigError, ConformerEncoderConfig, EncoderStreamingConfig, ExperimentConfig,
                           FrontendConfig, ModelConfig, NoDecoderConfig, TransformerEncoderConfig, from_dict)
from asrkit.models.dynamic_chunk import DynamicChunk
from asrkit.models.registry import build_model


def draws(chunk: DynamicChunk, n: int, seed: int, frames: int = 60):
    g = torch.Generator().manual_seed(seed)
    return [chunk.draw(frames, g) for _ in range(n)]


def test_draw_shares_follow_u2():
    """Catches a full-context share other than full_context_prob, chunks outside 1..max_chunk_frames or not
    uniform over it (an off-by-one would leave 25 out or let 0 in), and a left context not taken from config.
    4000 draws: the full share is within 5 standard deviations (0.04) of 0.5; each of the 25 chunk sizes is
    expected about 80 times (standard deviation 9)."""
    out = draws(DynamicChunk(left_chunks=3), 4000, seed=1)
    full = [d for d in out if d[0] == 0]
    assert all(d == (0, -1) for d in full) and abs(len(full) / 4000 - 0.5) < 0.04
    counts = collections.Counter(c for c, _ in out if c)
    assert sorted(counts) == list(range(1, 26)) and min(counts.values()) > 40 and max(counts.values()) < 125
    assert {left for c, left in out if c} == {3}
    assert all(c == 0 for c, _ in draws(DynamicChunk(full_context_prob=1.0), 50, seed=2))
    assert all(1 <= c <= 4 for c, _ in draws(DynamicChunk(full_context_prob=0.0, max_chunk_frames=4), 50, seed=2))


def test_dynamic_left_chunks_are_uniform_up_to_all_earlier_chunks():
    """Catches a left-context draw beyond (frames - 1) // chunk, one that never reaches it or 0, and a draw that
    crashes on a one-frame batch (no earlier chunk: left 0)."""
    chunk = DynamicChunk(full_context_prob=0.0, max_chunk_frames=5, dynamic_left_chunks=True)
    out = draws(chunk, 3000, seed=3, frames=21)
    for c in range(1, 6):
        lefts = {left for chunk, left in out if chunk == c}
        assert lefts == set(range(20 // c + 1)), (c, lefts)
    assert {left for _, left in draws(DynamicChunk(0.0, 5, dynamic_left_chunks=True), 20, seed=4, frames=1)} == {0}


def test_draws_are_reproducible_from_the_seed():
    """Catches a draw from an unseeded source (Python's random, time): torch.manual_seed (what the trainer seeds
    per rank, and saves in checkpoints) fixes the sequence; another seed gives another."""
    chunk = DynamicChunk(dynamic_left_chunks=True)

    def seq(seed):
        torch.manual_seed(seed)
        return [chunk.draw(40) for _ in range(30)]
    assert seq(5) == seq(5) != seq(6)
    assert draws(chunk, 30, seed=7, frames=40) == draws(chunk, 30, seed=7, frames=40)


def streaming_config(kind="conformer", **streaming):
    cls = ConformerEncoderConfig if kind == "conformer" else TransformerEncoderConfig
    enc = cls(d_model=16, num_heads=2, ffn_dim=32, num_layers=2, dropout=0.0,
              streaming=EncoderStreamingConfig(**streaming), **({"conv_kernel": 5} if kind == "conformer" else {}))
    return ExperimentConfig(frontend=FrontendConfig(n_mels=20),
                            model=ModelConfig(ctc_weight=1.0, encoder=enc, decoder=NoDecoderConfig()))


def batch():
    g = torch.Generator().manual_seed(0)
    return {"wav": 0.1 * torch.randn(2, 12000, generator=g), "wav_lens": torch.tensor([12000, 9000]),
            "tokens": torch.tensor([[5, 6, 7], [4, 3, -1]]), "token_lens": torch.tensor([3, 2])}


def test_training_draws_a_chunk_per_batch_and_eval_uses_full_context(monkeypatch):
    """Catches a model that never draws (trains full context only), draws in eval (validation and decoding
    must see full context), or passes the encoder something other than the draw (the left context drawn for the
    batch's encoder frames, not its feature frames or feature size); and a trained model that does not encode
    with full context afterwards."""
    model = build_model(streaming_config(dynamic_chunk=True, causal_conv=True, chunk_frames=4, left_chunks=2,
                                         dynamic_left_chunks=True), 9)
    assert model.dynamic_chunk == DynamicChunk(0.5, 25, 2, True) and model.encoder.layers[0].conv.left_pad == 4
    seen = []
    forward = model.encoder.forward

    def spy(*args, **kwargs):
        seen.append((kwargs.get("chunk_frames"), kwargs.get("left_chunks")))
        return forward(*args, **kwargs)
    monkeypatch.setattr(model.encoder, "forward", spy)
    b = batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    torch.manual_seed(11)
    for _ in range(4):
        opt.zero_grad()
        model(b)["loss"].backward()
        opt.step()
    frames = int(model.output_lengths(torch.tensor([12000]))[0])
    torch.manual_seed(11)
    assert seen == [model.dynamic_chunk.draw(frames) for _ in range(4)]
    assert len(set(seen)) > 2 and frames == 17
    model.eval()
    seen.clear()
    feats, lens = model.frontend(b["wav"], b["wav_lens"])
    enc, _ = model.encode_features(feats, lens)
    assert seen == [(None, None)]
    torch.testing.assert_close(enc, forward(feats, lens, chunk_frames=0)[0])
    assert (enc - forward(feats, lens, chunk_frames=4)[0]).abs().max() > 1e-3
    torch.testing.assert_close(model.encode_features(feats, lens, chunk_frames=4, left_chunks=2)[0],
                               forward(feats, lens, chunk_frames=4, left_chunks=2)[0])


def test_static_chunk_trains_and_encodes_with_its_chunk():
    """Catches a fixed chunk (dynamic_chunk off, chunk_frames > 0) that is not used, or a draw without dynamic_chunk."""
    model = build_model(streaming_config("transformer", chunk_frames=3, left_chunks=1), 9).eval()
    assert model.dynamic_chunk is None
    feats, lens = model.frontend(batch()["wav"], batch()["wav_lens"])
    torch.testing.assert_close(model.encode_features(feats, lens)[0],
                               model.encoder(feats, lens, chunk_frames=3, left_chunks=1)[0])
    assert build_model(streaming_config("transformer"), 9).dynamic_chunk is None


def test_streaming_keys_load_and_bad_values_name_the_key():
    """Catches the section not parsed from YAML, unchecked values, and causal_conv accepted on an encoder that
    has no convolution (a Transformer)."""
    m = from_dict(ModelConfig, {"encoder": {"kind": "conformer", "streaming": {
        "dynamic_chunk": True, "chunk_frames": 16, "left_chunks": 4, "causal_conv": True}}}, "model")
    assert m.encoder.streaming == EncoderStreamingConfig(True, 16, 4, True) and m.encoder.streaming.chunked
    assert not EncoderStreamingConfig().chunked and EncoderStreamingConfig(chunk_frames=1).chunked
    with pytest.raises(ConfigError, match=r"'model.encoder.streaming.chunk'"):
        from_dict(ModelConfig, {"encoder": {"streaming": {"chunk": 4}}}, "model")
    for bad, key in (({"chunk_frames": -1}, "chunk_frames"), ({"left_chunks": -2}, "left_chunks"),
                     ({"max_chunk_frames": 0}, "max_chunk_frames"), ({"full_context_prob": 1.5}, "full_context_prob"),
                     ({"full_context_prob": -0.1}, "full_context_prob")):
        with pytest.raises(ConfigError, match=f"model.encoder.streaming.{key}"):
            EncoderStreamingConfig(**bad)
    EncoderStreamingConfig(chunk_frames=0, left_chunks=-1, max_chunk_frames=1, full_context_prob=1.0)  # the least
    with pytest.raises(ConfigError, match="model.encoder.streaming.causal_conv.*transformer"):
        build_model(streaming_config("transformer", causal_conv=True), 9)
