"""Deja-vu feature re-presentation (Tjandra et al. 2020, "Deja-vu: double feature presentation ...", sec. 3.1).

At an intermediate encoder layer k the network looks at its input features again::

    Z0' = [LayerNorm(Z0 W1) ; E]            (S, d_c + d_e)   ";" = concatenation on the feature axis
    Zk' = [LayerNorm(Zk W2) ; E]            (S, d_c + d_e)
    O   = [Z0' , Zk']                       (2S, d_c + d_e)  concatenation on the time axis
    A   = Transformer(Q = Z0', K = O, V = O)   "split A"      (S, d_c + d_e)
    B   = Transformer(Q = Zk', K = O, V = O)   "split B"      (S, d_c + d_e)
    Z_{k+1} = LayerNorm(ReLU(combine(A, B) W3))               (S, d_model)

Z0 is the input at the encoder's frame rate (the encoder chooses which: the subsampling output or
filterbank frames stacked to that rate); the auxiliary CTC loss on Zk is the caller's business.

Choices where the paper leaves room (documented here because they change the model):
- One Transformer layer computes both splits: it is the self-attention layer over O, with only the
  query rows needed by ``combine`` computed. Each query row attends to all valid rows of O; the layer
  has the usual residual from its queries and a position-wise feed-forward block, with the encoder's
  pre-LN/post-LN choice and dropout.
- ``combine``: ``a`` (default) or ``b`` keeps one split (the paper's two variants); two extensions
  beyond the paper merge both: ``sum`` adds them frame by frame, ``concat`` joins them on the feature axis
  so W3 sees both ((2(d_c + d_e), d_model)). Frame s of A and frame s of B describe the same time step, so
  both merges keep the S-frame timing.
- E is the sinusoidal table of frame indices 0..S-1, the same for both halves, so a feature frame and
  the activation at the same time step carry the same position code. E is not scaled.
- Padding: with padded length S and valid length n, rows [0, n) and [S, S + n) of O are valid; the key
  mask is the padding mask repeated twice, so padded frames never reach valid ones (output on valid
  frames is independent of padding).
- No residual around the block: Z_{k+1} replaces Zk, as in the paper's equation.
- Chunk-wise attention (streaming; an extension): with the encoder's chunk mask, a row of either half at
  frame s attends to the rows of both halves at the frames frame s may attend to; E then holds the frames'
  positions in their stream, and :meth:`FeatureRepresentation.forward_chunk` runs one chunk with the left
  context's keys and values cached.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.positional import sinusoid_table, sinusoids

COMBINE = ("a", "b", "sum", "concat")


class FeatureRepresentation(nn.Module):
    """Re-present input features at an intermediate layer.

    ``forward(z0 (B, S, d0), zk (B, S, d_model), mask (B, S) bool) -> (B, S, d_model)``.
    ``feat_dim`` (d_c) 0 means d_model; ``pos_dim`` (d_e) 0 means d_model // 4.
    """

    def __init__(self, input_dim: int, d_model: int, num_heads: int, ffn_dim: int, feat_dim: int = 0,
                 pos_dim: int = 0, dropout: float = 0.1, attention_dropout: float = 0.0,
                 normalize_before: bool = True, combine: str = "a"):
        super().__init__()
        if combine not in COMBINE:
            raise ValueError(f"Deja-vu combine must be one of {COMBINE}, got '{combine}'")
        self.feat_dim = feat_dim or d_model  # d_c
        self.pos_dim = pos_dim or d_model // 4  # d_e
        width = self.feat_dim + self.pos_dim
        if width % num_heads:
            raise ValueError(f"Deja-vu width d_c + d_e = {self.feat_dim} + {self.pos_dim} = {width} "
                             f"is not divisible by num_heads {num_heads}")
        self.combine = combine
        self.input_proj, self.input_norm = nn.Linear(input_dim, self.feat_dim), nn.LayerNorm(self.feat_dim)  # W1
        self.layer_proj, self.layer_norm = nn.Linear(d_model, self.feat_dim), nn.LayerNorm(self.feat_dim)  # W2
        # The extra Transformer layer over O.
        self.attn = MultiHeadAttention(width, num_heads, attention_dropout)
        self.ffn = nn.Sequential(nn.Linear(width, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, width))
        self.attn_norm, self.ffn_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before
        merged = 2 * width if combine == "concat" else width
        self.out = nn.Sequential(nn.Linear(merged, d_model), nn.ReLU(), nn.LayerNorm(d_model))  # W3, ReLU, LN

    def _query_rows(self, s: int) -> Tuple[int, int]:
        """Rows of O whose outputs ``combine`` needs: [start, end)."""
        return {"a": (0, s), "b": (s, 2 * s)}.get(self.combine, (0, 2 * s))

    def _layer(self, o: torch.Tensor, start: int, end: int, kv_mask: torch.Tensor) -> torch.Tensor:
        """Transformer layer over O (B, 2S, W) with queries O[:, start:end]; kv_mask (B, 1|end - start, 2S)."""
        x = o[:, start:end]
        if self.normalize_before:
            h = self.attn_norm(o)
            x = x + self.dropout(self.attn(h[:, start:end], h, h, kv_mask))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attn_norm(x + self.dropout(self.attn(x, o, o, kv_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))

    def forward(self, z0: torch.Tensor, zk: torch.Tensor, mask: torch.Tensor,
                chunk: Optional[torch.Tensor] = None) -> torch.Tensor:
        """z0 (B, S, d0) input features at the encoder rate, zk (B, S, d_model), mask (B, S) True = valid;
        ``chunk`` (S, S): which frames each frame may attend to (the encoder's chunk mask), None = all."""
        if z0.shape[:2] != zk.shape[:2]:
            raise ValueError(f"Deja-vu inputs disagree on (batch, frames): {tuple(z0.shape[:2])} vs {tuple(zk.shape[:2])}")
        b, s, _ = zk.shape
        pos = sinusoid_table(s, self.pos_dim, device=zk.device, dtype=zk.dtype).expand(b, s, self.pos_dim)  # E
        z0p = torch.cat([self.input_norm(self.input_proj(z0)), pos], dim=-1)  # (B, S, W)
        zkp = torch.cat([self.layer_norm(self.layer_proj(zk)), pos], dim=-1)  # (B, S, W)
        o = torch.cat([z0p, zkp], dim=1)  # (B, 2S, W)
        kv_mask = torch.cat([mask, mask], dim=1).unsqueeze(1)  # (B, 1, 2S)
        start, end = self._query_rows(s)
        if chunk is not None:  # query row r of O is frame r % S, and sees both halves' rows of its frames
            kv_mask = kv_mask & chunk.repeat(2, 2)[start:end]  # (B, end - start, 2S)
        return self._merge(self._layer(o, start, end, kv_mask), s)

    def _merge(self, y: torch.Tensor, s: int) -> torch.Tensor:
        """The layer's query rows (B, S or 2S, W) -> Z_{k+1} (B, S, d_model) by ``combine``."""
        if self.combine == "concat":
            y = torch.cat([y[:, :s], y[:, s:]], dim=-1)  # (B, S, 2W)
        elif self.combine == "sum":
            y = y[:, :s] + y[:, s:]
        return self.out(y)  # (B, S, d_model)

    def forward_chunk(self, z0: torch.Tensor, zk: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, key_valid: torch.Tensor
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` of one chunk of a stream (eval: no dropout): z0 (B, c, d0), zk (B, c, d_model) at
        ``positions`` (B, c), with the left context's keys and values of both halves, (B, 2, H, L, Dh) (Z0' rows,
        Zk' rows), and key_valid (B, L + c) -> Z_{k+1} (B, c, d_model) and the keys and values (B, 2, H, L + c, Dh)."""
        c = zk.size(1)
        pos = sinusoids(positions, self.pos_dim).to(zk.dtype)  # E at the frames' stream positions
        o = torch.cat([torch.cat([self.input_norm(self.input_proj(z0)), pos], dim=-1),
                       torch.cat([self.layer_norm(self.layer_proj(zk)), pos], dim=-1)], dim=1)  # (B, 2c, W)
        h = self.attn_norm(o) if self.normalize_before else o
        k, v = self.attn.project_kv(h, h)  # (B, H, 2c, Dh)
        keys = torch.cat([keys, torch.stack([k[:, :, :c], k[:, :, c:]], dim=1)], dim=3)  # (B, 2, H, L + c, Dh)
        values = torch.cat([values, torch.stack([v[:, :, :c], v[:, :, c:]], dim=1)], dim=3)
        start, end = self._query_rows(c)
        valid = torch.cat([key_valid, key_valid], dim=1).unsqueeze(1)  # (B, 1, 2(L + c)): both halves' rows
        a = self.attn.forward_projected(h[:, start:end], keys.transpose(1, 2).flatten(2, 3),
                                        values.transpose(1, 2).flatten(2, 3), valid)
        x = o[:, start:end]
        if self.normalize_before:
            x = x + a
            y = x + self.ffn(self.ffn_norm(x))
        else:
            x = self.attn_norm(x + a)
            y = self.ffn_norm(x + self.ffn(x))
        return self._merge(y, c), keys, values
