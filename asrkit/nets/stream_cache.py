"""What a chunk-wise encoder carries from one chunk of a stream to the next (the contract of issue 30's
"Encoder chunk step"): tensors with the batch first, held by the caller, never by the modules.

Shapes (B streams, N layers, H heads, L cached frames, Dh head size, D model size, K-1 convolution frames,
r leftover feature frames of F features):

- ``feats`` (B, r, F): feature frames received but not yet encoded; the next encoder frame's receptive field
  starts at ``feats[:, 0]``. Streams in one batch hold the same r (their next chunk needs the same input).
- ``offset`` (B,) long: encoder frames emitted so far, the position of the next one (absolute sinusoid or
  rotary positions).
- ``keys``, ``values`` (B, N, H, L, Dh): each layer's self-attention keys and values of the left context
  (rotated keys in rotary layers), at most ``left_chunks * chunk_frames`` frames (all of them with -1).
- ``key_valid`` (B, L) bool: which cached frames exist. Valid frames are right-aligned: a young stream stacked
  with older ones has invalid (padding) frames at the left.
- ``conv`` (B, N, D, K-1): the last inputs of each layer's causal depthwise convolution (zeros at the start, as
  the offline forward's left padding); (B, N, D, 0) for layers without one.
- ``dejavu_keys``, ``dejavu_values`` (B, 2, H', L, Dh'): the Deja-vu re-presentation's keys and values of the
  left context, its Z0' rows and its Zk' rows (None without Deja-vu). Its stacked feature frames need no cache:
  they lie inside the subsampling's receptive field, whose leftover frames ``feats`` holds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class EncoderCache:
    feats: torch.Tensor
    offset: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    key_valid: torch.Tensor
    conv: torch.Tensor
    chunk_frames: int  # encoder frames per chunk
    left_chunks: int  # chunks of left context; -1 = all
    receptive_field: int  # feature frames one encoder frame reads
    stride: int  # feature frames per encoder frame
    dejavu_keys: Optional[torch.Tensor] = None
    dejavu_values: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.offset.size(0)

    def input_frames_needed(self) -> int:
        """Feature frames that complete the next chunk: the receptive field of ``chunk_frames`` encoder frames
        less the leftover frames held (so a stream's first chunk needs ``receptive_field - stride`` more)."""
        return self.receptive_field + self.stride * (self.chunk_frames - 1) - self.feats.size(1)

    def left_frames(self) -> int:
        """Encoder frames of left context kept per layer; -1 = all."""
        return self.left_chunks * self.chunk_frames if self.left_chunks >= 0 else -1

    @staticmethod
    def stack(caches: Sequence["EncoderCache"]) -> "EncoderCache":
        """One batch of the streams of ``caches`` (each of any batch size), in order. Streams at different
        positions have left contexts of different lengths: the shorter ones are padded at the left (invalid)."""
        first = caches[0]
        for c in caches[1:]:
            if (c.chunk_frames, c.left_chunks, c.receptive_field, c.stride) != (
                    first.chunk_frames, first.left_chunks, first.receptive_field, first.stride):
                raise ValueError("streams with different chunk_frames / left_chunks cannot be stacked")
            if c.feats.size(1) != first.feats.size(1):
                raise ValueError(f"streams holding {first.feats.size(1)} and {c.feats.size(1)} leftover feature "
                                 f"frames cannot be stacked: their next chunks need different input "
                                 f"({first.input_frames_needed()} and {c.input_frames_needed()} frames); stack "
                                 f"streams whose input_frames_needed() agree")
        length = max(c.key_valid.size(1) for c in caches)

        def left_pad(x: torch.Tensor, dim: int) -> torch.Tensor:  # pad dim on the left up to `length`
            pad = [0, 0] * (x.dim() - 1 - dim) + [length - x.size(dim), 0]
            return F.pad(x, pad)
        return dataclasses.replace(
            first, feats=torch.cat([c.feats for c in caches]), offset=torch.cat([c.offset for c in caches]),
            keys=torch.cat([left_pad(c.keys, 3) for c in caches]),
            values=torch.cat([left_pad(c.values, 3) for c in caches]),
            key_valid=torch.cat([left_pad(c.key_valid, 1) for c in caches]),  # pads with False
            conv=torch.cat([c.conv for c in caches]),
            dejavu_keys=None if first.dejavu_keys is None else torch.cat([left_pad(c.dejavu_keys, 3) for c in caches]),
            dejavu_values=None if first.dejavu_values is None else torch.cat(
                [left_pad(c.dejavu_values, 3) for c in caches]))

    def unstack(self) -> List["EncoderCache"]:
        """One cache per stream (batch size 1), its left-context padding removed."""
        out = []
        for b in range(self.batch_size):
            n = int(self.key_valid[b].sum())  # valid frames are the last n
            start = self.key_valid.size(1) - n
            out.append(dataclasses.replace(
                self, feats=self.feats[b:b + 1], offset=self.offset[b:b + 1], keys=self.keys[b:b + 1, :, :, start:],
                values=self.values[b:b + 1, :, :, start:], key_valid=self.key_valid[b:b + 1, start:],
                conv=self.conv[b:b + 1],
                dejavu_keys=None if self.dejavu_keys is None else self.dejavu_keys[b:b + 1, :, :, start:],
                dejavu_values=None if self.dejavu_values is None else self.dejavu_values[b:b + 1, :, :, start:]))
        return out
