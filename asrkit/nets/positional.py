"""Sinusoidal positional encoding (Vaswani et al. 2017)."""
from __future__ import annotations

import math
from typing import Union

import torch
from torch import nn


def sinusoid_table(length: int, dim: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """(length, dim) table: even dims sin, odd dims cos, wavelengths from 2*pi to 10000*2*pi."""
    return sinusoids(torch.arange(length, device=device), dim).to(dtype)


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """The rows of :func:`sinusoid_table` at integer ``positions`` (any shape S) -> (*S, dim) float32."""
    pos = positions.to(torch.float32).unsqueeze(-1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
                         * (-math.log(10000.0) / dim))
    table = torch.zeros(*positions.shape, dim, device=positions.device)
    table[..., 0::2] = torch.sin(pos * inv_freq)
    table[..., 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table


class PositionalEncoding(nn.Module):
    """Scales the input by sqrt(d_model) and adds sinusoidal positions (ESPnet/WeNet convention)."""

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 5000):
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: Union[int, torch.Tensor] = 0) -> torch.Tensor:  # (B, T, D)
        """``offset``: the position of frame 0, one for all rows or (B,) per row (streams at different positions)."""
        t = x.size(1)
        if isinstance(offset, torch.Tensor):
            positions = offset.unsqueeze(1) + torch.arange(t, device=x.device)  # (B, T)
            return self.dropout(x * self.scale + sinusoids(positions, self.d_model).to(x.dtype))
        if offset + t > self.table.size(0):
            self.table = sinusoid_table(offset + t, self.d_model, device=x.device)
        return self.dropout(x * self.scale + self.table[offset: offset + t].to(x.dtype))
