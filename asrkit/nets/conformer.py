"""Conformer encoder layer (Gulati et al. 2020, "Conformer: Convolution-augmented Transformer for Speech
Recognition"), pre-LN, as one more layer kind for :class:`~asrkit.nets.transformer.TransformerEncoder`::

    x = x + 1/2 FFN(LN(x))          macaron half-step feed-forward, Swish
    x = x + MHSA(LN(x))             rotary positions inside the attention
    x = x + Conv(LN(x))             pointwise -> GLU -> depthwise -> LN -> Swish -> pointwise
    x = x + 1/2 FFN(LN(x))
    y = LN(x)

Choices that differ from the paper, and why:
- Positions are rotary (RoPE, Su et al. 2021) instead of Transformer-XL relative sinusoids: query and key
  of each head are rotated by angles proportional to their frame index, so every attention score depends
  on the relative offset only, with no extra parameters and no (T, T) position tensor, and attention still
  runs through ``scaled_dot_product_attention``. A stack of these layers is built with ``positional=False``:
  the subsampling output is scaled by sqrt(d_model) as for Transformer layers, but gets no absolute sinusoid.
- The convolution module normalises with LayerNorm over channels instead of BatchNorm: batch statistics
  would mix padding frames and depend on the batch composition, so a padded utterance would not decode
  like the same utterance alone.
- ``conv_kernel`` 15 by default (the paper uses 32; ESPnet and WeNet use 15 or 31). After x4 subsampling a
  frame is 40 ms, so 15 frames cover 0.6 s, 0.28 s either side of the centre: a syllable or two of local
  context, which is the convolution's job; global context is the attention's, and in the paper's kernel
  ablation (3 to 65) the gains level off before its widest kernel (65 was worse than 32). A narrower kernel
  is cheaper and sees less zero padding at the edges of short utterances. Odd, so the convolution is
  centred ('same' padding). With x6/x8 subsampling the same width covers 0.9/1.2 s.
Padded frames are zeroed before the depthwise convolution, so valid outputs do not depend on padding.
``causal_conv`` pads the depthwise convolution on the left only (``kernel - 1`` frames; any width): a frame then
sees no later frame, which chunk-wise streaming needs (a centred convolution would read ``kernel // 2`` frames of
the next chunk in every layer). Same parameters, so only the padding differs.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from asrkit.nets.attention import MultiHeadAttention, no_empty_rows


def rotary_tables(positions: torch.Tensor, dim: int, dtype: torch.dtype,
                  base: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (*S, dim) for rotating pairs (2i, 2i+1) of a head's dims by ``p * base^(-2i/dim)`` at
    the integer frame positions p (any shape S: (T,), or (B, 1, T) for streams at different positions)."""
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
                         * (-math.log(base) / dim))
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (*S, dim/2)
    angles = angles.repeat_interleave(2, dim=-1)  # (*S, dim): each angle for both members of its pair
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of the last dim: (B, H, T, Dh) with (T, Dh) tables.

    Rotations compose: rot_p(q) . rot_s(k) = q . rot_{s-p}(k), so scores depend on the offset s - p only."""
    pairs = x.unflatten(-1, (-1, 2))
    swapped = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (-x1, x0) per pair
    return x * cos + swapped * sin


class RotarySelfAttention(nn.Module):
    """Multi-head self-attention with rotary positions; the projections are a :class:`MultiHeadAttention`'s."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, num_heads, dropout)
        if self.mha.head_dim % 2:
            raise ValueError(f"rotary positions need an even head size, got d_model {d_model} / {num_heads} heads")

    def project(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> queries and keys rotated by their frame index, and values, each (B, H, T, Dh).
        ``positions`` (B, T): the frames' positions in their streams (default 0..T-1)."""
        m = self.mha
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, m.num_heads, m.head_dim).transpose(1, 2)
                   for proj in (m.q_proj, m.k_proj, m.v_proj))  # (B, H, T, Dh)
        pos = torch.arange(t, device=x.device) if positions is None else positions.unsqueeze(1)  # (T,) | (B, 1, T)
        cos, sin = rotary_tables(pos, m.head_dim, q.dtype)  # (T, Dh) | (B, 1, T, Dh)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), mask (B, 1|T, T) bool (True = may attend) -> (B, T, D)."""
        q, k, v = self.project(x)
        # no_empty_rows: a zero-length utterance attends everywhere instead of making NaN (see attention.py).
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=no_empty_rows(mask).unsqueeze(1),
                                             dropout_p=self.mha.dropout if self.training else 0.0)
        b, _, t, _ = out.shape
        return self.mha.out_proj(out.transpose(1, 2).reshape(b, t, -1))

    def forward_chunk(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_valid: torch.Tensor,
                      positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One chunk x (B, c, D) at ``positions`` (B, c) attending to itself and to the cached (rotated) keys and
        values (B, H, L, Dh); key_valid (B, L + c). -> output (B, c, D), keys and values (B, H, L + c, Dh)."""
        q, k, v = self.project(x, positions)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_valid[:, None, None, :])
        b, _, t, _ = out.shape
        return self.mha.out_proj(out.transpose(1, 2).reshape(b, t, -1)), keys, values


class ConvolutionModule(nn.Module):
    """Pointwise conv (D -> 2D), GLU, depthwise conv of width ``kernel``, LayerNorm, Swish, pointwise (D -> D)."""

    def __init__(self, d_model: int, kernel: int, dropout: float = 0.1, causal: bool = False):
        super().__init__()
        if kernel < 1 or (kernel % 2 == 0 and not causal):
            raise ValueError(f"conv_kernel must be odd and positive (a centred convolution), got {kernel}")
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        # Causal: the left padding is added in forward (Conv1d pads both sides alike).
        self.left_pad = kernel - 1 if causal else 0
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=0 if causal else kernel // 2, groups=d_model)
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), valid (B, T, 1) -> (B, T, D)."""
        h = F.glu(self.pointwise_in(x), dim=-1).masked_fill(~valid, 0.0)  # padding must not leak into the conv
        h = self.depthwise(F.pad(h.transpose(1, 2), (self.left_pad, 0))).transpose(1, 2)
        return self.dropout(self.pointwise_out(F.silu(self.norm(h))))

    def forward_chunk(self, x: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Causal only: one chunk x (B, c, D) of a stream after the ``kernel - 1`` cached inputs (B, D, K-1) of the
        depthwise convolution -> (B, c, D) and the new cache (its last K-1 inputs)."""
        h = torch.cat([cache, F.glu(self.pointwise_in(x), dim=-1).transpose(1, 2)], dim=2)  # (B, D, K-1 + c)
        out = self.depthwise(h).transpose(1, 2)
        return self.pointwise_out(F.silu(self.norm(out))), h[:, :, h.size(2) - self.left_pad:]


class ConformerLayer(nn.Module):
    """One Conformer block (module docstring): ``forward(x (B, T, D), mask (B, 1|T, T), valid) -> (B, T, D)``."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, conv_kernel: int = 15, dropout: float = 0.1,
                 attention_dropout: float = 0.0, causal_conv: bool = False):
        super().__init__()

        def feed_forward() -> nn.Sequential:
            return nn.Sequential(nn.Linear(d_model, ffn_dim), nn.SiLU(), nn.Dropout(dropout),
                                 nn.Linear(ffn_dim, d_model))

        self.ffn1, self.ffn2 = feed_forward(), feed_forward()
        self.attn = RotarySelfAttention(d_model, num_heads, attention_dropout)
        self.conv = ConvolutionModule(d_model, conv_kernel, dropout, causal_conv)
        # A stream's chunk step: the convolution's cached inputs, and what a centred one would read ahead.
        self.conv_left_frames = self.conv.left_pad
        self.look_ahead = 0 if causal_conv else conv_kernel // 2
        self.norm_ffn1, self.norm_attn, self.norm_conv, self.norm_ffn2, self.norm_out = (
            nn.LayerNorm(d_model) for _ in range(5))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x (B, T, D), mask (B, 1|T, T) bool (True = may attend), valid (B, T, 1) the frames that are not padding
        (None: ``mask`` is a (B, 1, T) key mask and tells them)."""
        valid = mask.transpose(1, 2) if valid is None else valid
        x = x + 0.5 * self.dropout(self.ffn1(self.norm_ffn1(x)))
        x = x + self.dropout(self.attn(self.norm_attn(x), mask))
        x = x + self.conv(self.norm_conv(x), valid)
        x = x + 0.5 * self.dropout(self.ffn2(self.norm_ffn2(x)))
        return self.norm_out(x)

    def forward_chunk(self, x: torch.Tensor, key_valid: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      conv: torch.Tensor, positions: torch.Tensor
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` of one chunk x (B, c, D) of a stream (eval: no dropout; causal convolution only) at
        ``positions`` (B, c), with the cached left-context keys/values (B, H, L, Dh), key_valid (B, L + c) and
        convolution inputs ``conv`` (B, D, K-1) -> output, keys/values (B, H, L + c, Dh), new conv cache."""
        x = x + 0.5 * self.ffn1(self.norm_ffn1(x))
        a, keys, values = self.attn.forward_chunk(self.norm_attn(x), keys, values, key_valid, positions)
        x = x + a
        c, conv = self.conv.forward_chunk(self.norm_conv(x), conv)
        x = x + c
        x = x + 0.5 * self.ffn2(self.norm_ffn2(x))
        return self.norm_out(x), keys, values, conv
