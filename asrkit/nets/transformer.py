"""Encoder stack: conv subsampling, then ``num_layers`` layers (pre-LN (default) or post-LN Transformer
layers, or any layer kind from ``layer_builder``, e.g. :class:`~asrkit.nets.conformer.ConformerLayer`).

Optional extras inside the layer stack (1-based layer indices, all before the last layer):

- ``interctc_layers``: the output of these layers is returned by :meth:`forward` beside the final one,
  so the model can put an auxiliary CTC loss on it (InterCTC, Lee & Watanabe 2021). With pre-LN the
  residual stream is unnormalised, so the encoder's final LayerNorm is applied to it first (shared, as
  in ESPnet, for the model's shared CTC head); ``intermediate_norm=False`` returns it raw instead, for
  heads of their own (Deja-vu's iterated loss).
- ``self_condition``: the intermediate CTC posteriors softmax(ctc_head(h_k)) are projected back to
  d_model (one Linear(V, d_model) shared by all intermediate layers) and added to the residual stream
  (self-conditioned CTC, Nozaki & Komatsu 2021). The encoder then needs ``ctc_head`` at inference too.
- ``dejavu_layer``: Deja-vu feature re-presentation (see :mod:`asrkit.nets.representation`) replaces the
  output of this layer; the layer is also an intermediate CTC layer, so the auxiliary loss sits right
  before the re-presentation (the paper's "iterated loss").

At an intermediate layer k the order is: layer k -> h_k (norm(x) or x) is returned for the auxiliary loss
-> self-conditioning (if on) -> re-presentation (if k is the Deja-vu layer).

Chunk-wise attention (WeNet U2; :func:`~asrkit.nets.mask.chunk_mask`): :meth:`TransformerEncoder.forward` with
``chunk_frames`` > 0 lets each encoder frame attend to its own chunk and ``left_chunks`` chunks before it, in every
layer; the encoder's default is fixed at construction (``chunk_frames``; 0 = full context, which a model trained
with ``dynamic_chunk`` uses, its trainer drawing a chunk per batch). InterCTC and self-conditioning work
unchanged in chunk mode (they read one frame at a time); Deja-vu's re-presentation attends under the same chunk
mask (:mod:`asrkit.nets.representation`), its stacked feature frames lie inside each encoder frame's receptive
field, so a stream has them when it has the frame.

Deja-vu input Z0 (``dejavu_input``): ``stacked_fbank`` (default, the paper's) = the raw filterbank frames,
``factor`` consecutive frames concatenated per encoder frame, the window centred in that frame's receptive
field; ``subsampled`` (an extension) = the subsampling module's output (what layer 1 receives, positions
included).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.mask import chunk_mask, lengths_to_mask
from asrkit.nets.representation import FeatureRepresentation
from asrkit.nets.stream_cache import EncoderCache
from asrkit.nets.subsampling import INPUT_LAYERS, Conv2dSubsampling

DEJAVU_INPUTS = ("subsampled", "stacked_fbank")



class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerEncoderLayer(nn.Module):
    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, normalize_before: bool = True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before
        # A stream's chunk step (TransformerEncoder.forward_chunk): no convolution state, no look-ahead.
        self.conv_left_frames = self.look_ahead = 0

    def forward(self, x: torch.Tensor, mask: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, T, D); mask: (B, 1|T, T) bool, True = may attend. ``valid`` (B, T, 1), the frames that are not
        padding, is part of the layer interface (a Conformer's convolution needs it) and not needed here."""
        if self.normalize_before:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))

    def forward_chunk(self, x: torch.Tensor, key_valid: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      conv: torch.Tensor, positions: torch.Tensor
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` of one chunk x (B, c, D) of a stream (eval: no dropout), attending to the cached left
        context keys/values (B, H, L, Dh) and to itself; key_valid (B, L + c). Returns the output and the keys
        and values of the left context and the chunk (B, H, L + c, Dh); ``conv`` and ``positions`` (positions
        were added before the first layer) are part of the layer interface."""
        h = self.norm1(x) if self.normalize_before else x
        k, v = self.self_attn.project_kv(h, h)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        a = self.self_attn.forward_projected(h, keys, values, key_valid.unsqueeze(1))
        if self.normalize_before:
            x = x + a
            return x + self.ffn(self.norm2(x)), keys, values, conv
        x = self.norm1(x + a)
        return self.norm2(x + self.ffn(x)), keys, values, conv


def stack_frames(feats: torch.Tensor, num_out: int, factor: int, receptive_field: int) -> torch.Tensor:
    """(B, T, F) -> (B, num_out, factor * F): frames [t*factor + o, (t+1)*factor + o) for output t.

    ``o = (receptive_field - factor) // 2`` centres the window in the receptive field of conv output t
    (frames [t*factor, t*factor + receptive_field)), which lies inside the input for every output frame.
    """
    off = (receptive_field - factor) // 2
    b, _, f = feats.shape
    return feats[:, off: off + num_out * factor].reshape(b, num_out, factor * f)


class TransformerEncoder(nn.Module):
    """(B, T, F) features -> (B, T', d_model) encodings and (B,) lengths."""

    def __init__(self, in_dim: int, d_model: int = 256, num_heads: int = 4, ffn_dim: int = 1024,
                 num_layers: int = 12, dropout: float = 0.1, attention_dropout: float = 0.0,
                 normalize_before: bool = True, input_layer: str = "conv2d", *,
                 interctc_layers: Sequence[int] = (), self_condition: bool = False, vocab_size: int = 0,
                 dejavu_layer: int = 0, dejavu_input: str = "stacked_fbank", dejavu_dim: int = 0,
                 dejavu_pos_dim: int = 0, dejavu_combine: str = "a", conv_channels: int = 0,
                 intermediate_norm: bool = True, layer_builder: Optional[Callable[[], nn.Module]] = None,
                 positional: bool = True, chunk_frames: int = 0, left_chunks: int = -1, dynamic_chunk: bool = False):
        """``intermediate_norm``: intermediate outputs pass through the final LayerNorm (InterCTC reads them
        with the shared CTC head); False returns the raw residual stream of those layers (for heads of their
        own, as Deja-vu's iterated loss). ``layer_builder`` makes each of the ``num_layers`` layers (any
        module with ``forward(x (B, T, D), mask (B, 1|T, T), valid (B, T, 1))``, e.g. a Conformer layer; default a
        Transformer layer), so InterCTC, self-conditioning and Deja-vu work on every layer kind. ``positional`` False
        adds no absolute positions after the subsampling, which still scales by sqrt(d_model) (for layers that
        encode position themselves, as the Conformer's rotary attention). ``chunk_frames`` > 0 and ``left_chunks``:
        chunk-wise attention by default (module docstring), unless ``dynamic_chunk`` (trained with drawn chunks,
        encodes with full context by default); either way they are a stream's default chunk."""
        super().__init__()
        if input_layer not in INPUT_LAYERS:
            raise ValueError(f"unknown input_layer '{input_layer}' (choose from {sorted(INPUT_LAYERS)})")
        for k in list(interctc_layers) + ([dejavu_layer] if dejavu_layer else []):
            if not 1 <= k < num_layers:
                raise ValueError(f"intermediate layer {k} must be in 1..{num_layers - 1} (the encoder has "
                                 f"{num_layers} layers; the last one already feeds the CTC head)")
        if dejavu_input not in DEJAVU_INPUTS:
            raise ValueError(f"unknown dejavu_input '{dejavu_input}' (choose from {DEJAVU_INPUTS})")
        if chunk_frames < 0 or left_chunks < -1:
            raise ValueError(f"chunk_frames must be >= 0 and left_chunks >= -1, got {chunk_frames} and {left_chunks}")
        self.chunk_frames, self.left_chunks, self.dynamic_chunk = chunk_frames, left_chunks, dynamic_chunk
        self.d_model = self.output_dim = d_model
        self.in_dim, self.num_heads = in_dim, num_heads
        self.intermediate_norm = intermediate_norm
        self.subsampling = Conv2dSubsampling(in_dim, d_model, INPUT_LAYERS[input_layer], dropout,
                                             pos_enc=positional, channels=conv_channels, scaled=True)
        if layer_builder is None:
            def layer_builder() -> nn.Module:
                return TransformerEncoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout,
                                               normalize_before)
        self.layers = nn.ModuleList(layer_builder() for _ in range(num_layers))
        # Pre-LN stacks leave the residual stream unnormalised: normalise once at the end.
        self.final_norm = nn.LayerNorm(d_model) if normalize_before else nn.Identity()
        self.intermediate_layers: Tuple[int, ...] = tuple(sorted(set(interctc_layers) | ({dejavu_layer} - {0})))
        self.self_condition = self_condition and bool(self.intermediate_layers)
        if self.self_condition and vocab_size <= 0:
            raise ValueError("self-conditioned CTC needs the vocabulary size")
        self.condition_proj = nn.Linear(vocab_size, d_model) if self.self_condition else None
        self.dejavu_layer, self.dejavu_input = dejavu_layer, dejavu_input
        self.dejavu: Optional[FeatureRepresentation] = None
        if dejavu_layer:
            z0_dim = d_model if dejavu_input == "subsampled" else in_dim * self.subsampling.factor
            self.dejavu = FeatureRepresentation(z0_dim, d_model, num_heads, ffn_dim, dejavu_dim, dejavu_pos_dim,
                                                dropout, attention_dropout, normalize_before, dejavu_combine)

    @property
    def subsampling_factor(self) -> int:
        return self.subsampling.factor

    def output_lengths(self, feat_lens: torch.Tensor) -> torch.Tensor:
        """Encoder frames for (B,) feature-frame counts (0 when shorter than the receptive field)."""
        return self.subsampling.output_lengths(feat_lens)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, ctc_head: Optional[CTCHead] = None, *,
                chunk_frames: Optional[int] = None, left_chunks: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
        """feats (B, T, F), feat_lens (B,) -> encodings (B, T', D), lengths (B,) and the outputs (B, T', D) of
        ``intermediate_layers`` in order (final-LayerNorm'd unless ``intermediate_norm`` is off).

        ``ctc_head`` (logits of the model's CTC layer) is required with self-conditioning. ``chunk_frames``
        (0 = full context) and ``left_chunks`` (-1 = all) override the encoder's default chunk-wise attention.
        """
        if self.self_condition and ctc_head is None:
            raise ValueError("this encoder is self-conditioned: pass the model's ctc_head")
        default_chunk = 0 if self.dynamic_chunk else self.chunk_frames
        chunk = default_chunk if chunk_frames is None else chunk_frames
        left = self.left_chunks if left_chunks is None else left_chunks
        x, lens = self.subsampling(feats, feat_lens)  # (B, T', D)
        mask = lengths_to_mask(lens, x.size(1))  # (B, T')
        att_mask = mask.unsqueeze(1)  # (B, 1, T'): padded keys hidden
        chunks = None
        if chunk > 0:
            chunks = chunk_mask(x.size(1), chunk, left, x.device)  # (T', T')
            att_mask = att_mask & chunks  # (B, T', T')
        z0 = None
        if self.dejavu is not None:
            z0 = x if self.dejavu_input == "subsampled" else stack_frames(
                feats, x.size(1), self.subsampling.factor, self.subsampling.min_input_length)
        intermediates: List[torch.Tensor] = []
        for k, layer in enumerate(self.layers, start=1):
            x = layer(x, att_mask, mask.unsqueeze(-1))
            if k not in self.intermediate_layers:
                continue
            h = self.final_norm(x)
            intermediates.append(h if self.intermediate_norm else x)
            if self.condition_proj is not None:
                x = x + self.condition_proj(ctc_head(h).softmax(dim=-1))
            if k == self.dejavu_layer:
                x = self.dejavu(z0, x, mask, chunks)
        return self.final_norm(x), lens, intermediates

    # -- streams: chunk by chunk, with explicit caches ------------------------------------------------------------
    @property
    def streaming_right_context_frames(self) -> int:
        """Feature frames a chunk reads beyond its own span (chunk_frames x subsampling factor frames): the
        subsampling's receptive field overlaps the next encoder frame's. Chunk-wise attention and causal
        convolutions read nothing later."""
        return self.subsampling.right_context

    def init_stream(self, batch: int, device: torch.device, chunk_frames: Optional[int] = None,
                    left_chunks: Optional[int] = None) -> EncoderCache:
        """The cache of ``batch`` new streams (see :mod:`asrkit.nets.stream_cache`) encoded in chunks of
        ``chunk_frames`` encoder frames with ``left_chunks`` chunks of left context (default: the encoder's).
        Raises ValueError, naming the option, for an encoder that cannot stream."""
        chunk = self.chunk_frames if chunk_frames is None else chunk_frames
        left = self.left_chunks if left_chunks is None else left_chunks
        if chunk <= 0 or left < -1:
            raise ValueError(f"a stream needs chunk_frames > 0 and left_chunks >= -1 (model.encoder.streaming or "
                             f"the decoding options), got {chunk} and {left}")
        for layer in self.layers:
            if layer.look_ahead:
                raise ValueError(f"model.encoder.streaming.causal_conv is false: the centred convolution reads "
                                 f"{layer.look_ahead} frames ahead in every layer, so this encoder cannot stream "
                                 f"(train one with causal_conv: true)")
        p = next(self.parameters())
        n, head_dim = len(self.layers), self.d_model // self.num_heads
        kv = torch.zeros(batch, n, self.num_heads, 0, head_dim, device=device, dtype=p.dtype)
        dejavu_kv = None if self.dejavu is None else torch.zeros(
            batch, 2, self.dejavu.attn.num_heads, 0, self.dejavu.attn.head_dim, device=device, dtype=p.dtype)
        return EncoderCache(
            feats=torch.zeros(batch, 0, self.in_dim, device=device, dtype=p.dtype),
            offset=torch.zeros(batch, dtype=torch.long, device=device), keys=kv, values=kv.clone(),
            key_valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
            conv=torch.zeros(batch, n, self.d_model, self.layers[0].conv_left_frames, device=device, dtype=p.dtype),
            chunk_frames=chunk, left_chunks=left, receptive_field=self.subsampling.min_input_length,
            stride=self.subsampling.factor, dejavu_keys=dejavu_kv,
            dejavu_values=None if dejavu_kv is None else dejavu_kv.clone())

    def forward_chunk(self, feats: torch.Tensor, cache: EncoderCache, ctc_head: Optional[CTCHead] = None,
                      final: bool = False) -> Tuple[torch.Tensor, EncoderCache]:
        """The next feature frames feats (B, t, F) of the cache's streams -> the encoder frames (B, n, D) they
        complete (final-LayerNorm'd, as :meth:`forward`) and the new cache. n is a multiple of chunk_frames
        (every complete chunk; exactly one when t is ``cache.input_frames_needed()``); with ``final`` every
        encoder frame the input allows, the last chunk possibly short. The outputs of a stream fed in pieces
        equal :meth:`forward` of all its features under the same chunk_frames and left_chunks."""
        if self.self_condition and ctc_head is None:
            raise ValueError("this encoder is self-conditioned: pass the model's ctc_head")
        x_in = torch.cat([cache.feats, feats], dim=1)  # (B, r + t, F)
        b, c = x_in.size(0), cache.chunk_frames
        avail = int(self.output_lengths(torch.tensor(x_in.size(1))))
        n = avail if final else avail - avail % c
        if n == 0:
            return x_in.new_zeros(b, 0, self.d_model), dataclasses.replace(cache, feats=x_in)
        used = cache.stride * (n - 1) + cache.receptive_field  # the feature frames the n encoder frames read
        x, _ = self.subsampling(x_in[:, :used], torch.full((b,), used, device=x_in.device), cache.offset)
        z0 = None
        if self.dejavu is not None:  # Z0 of the n frames: stacked from the same input (its frame 0 is x's)
            z0 = x if self.dejavu_input == "subsampled" else stack_frames(
                x_in[:, :used], n, cache.stride, cache.receptive_field)
        keys, values, key_valid, conv = cache.keys, cache.values, cache.key_valid, cache.conv
        dk, dv = cache.dejavu_keys, cache.dejavu_values
        keep = cache.left_frames()
        outs = []
        for start in range(0, n, c):
            h = x[:, start:start + c]  # (B, c', D): one chunk
            positions = cache.offset.unsqueeze(1) + start + torch.arange(h.size(1), device=h.device)  # (B, c')
            key_valid = torch.cat([key_valid, key_valid.new_ones(b, h.size(1))], dim=1)  # (B, L + c')
            new_k, new_v, new_conv = [], [], []
            for k, layer in enumerate(self.layers, start=1):
                h, lk, lv, lc = layer.forward_chunk(h, key_valid, keys[:, k - 1], values[:, k - 1], conv[:, k - 1],
                                                    positions)
                new_k.append(lk)
                new_v.append(lv)
                new_conv.append(lc)
                if self.condition_proj is not None and k in self.intermediate_layers:
                    h = h + self.condition_proj(ctc_head(self.final_norm(h)).softmax(dim=-1))
                if k == self.dejavu_layer:
                    h, dk, dv = self.dejavu.forward_chunk(z0[:, start:start + c], h, positions, dk, dv, key_valid)
            keys, values, conv = torch.stack(new_k, 1), torch.stack(new_v, 1), torch.stack(new_conv, 1)
            if keep >= 0:  # the left context of the next chunk, not the whole history
                drop = max(key_valid.size(1) - keep, 0)
                keys, values, key_valid = keys[:, :, :, drop:], values[:, :, :, drop:], key_valid[:, drop:]
                if dk is not None:
                    dk, dv = dk[:, :, :, drop:], dv[:, :, :, drop:]
            outs.append(self.final_norm(h))
        new = dataclasses.replace(cache, feats=x_in[:, cache.stride * n:], offset=cache.offset + n, keys=keys,
                                  values=values, key_valid=key_valid, conv=conv, dejavu_keys=dk, dejavu_values=dv)
        return torch.cat(outs, dim=1), new
