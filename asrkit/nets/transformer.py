"""Transformer encoder: conv subsampling, then pre-LN (default) or post-LN self-attention layers."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.mask import lengths_to_mask
from asrkit.nets.subsampling import INPUT_LAYERS, Conv2dSubsampling


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (B, T, D); mask: (B, 1, T) bool key mask, True = valid."""
        if self.normalize_before:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class TransformerEncoder(nn.Module):
    """(B, T, F) features -> (B, T', d_model) encodings and (B,) lengths."""

    def __init__(self, in_dim: int, d_model: int = 256, num_heads: int = 4, ffn_dim: int = 1024,
                 num_layers: int = 12, dropout: float = 0.1, attention_dropout: float = 0.0,
                 normalize_before: bool = True, input_layer: str = "conv2d"):
        super().__init__()
        if input_layer not in INPUT_LAYERS:
            raise ValueError(f"unknown input_layer '{input_layer}' (choose from {sorted(INPUT_LAYERS)})")
        self.d_model = d_model
        self.subsampling = Conv2dSubsampling(in_dim, d_model, INPUT_LAYERS[input_layer], dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout, normalize_before)
            for _ in range(num_layers))
        # Pre-LN stacks leave the residual stream unnormalised: normalise once at the end.
        self.final_norm = nn.LayerNorm(d_model) if normalize_before else nn.Identity()

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x, lens = self.subsampling(feats, feat_lens)
        mask = lengths_to_mask(lens, x.size(1)).unsqueeze(1)  # (B, 1, T)
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x), lens
