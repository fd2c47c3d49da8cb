"""Convolutional subsampling of filterbank frames (x4, x6, x8) followed by positional encoding."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from asrkit.nets.positional import PositionalEncoding

# factor -> (kernel, stride) of each conv2d layer (no padding); lengths follow L' = (L - k) // s + 1.
LAYOUTS = {
    4: [(3, 2), (3, 2)],
    6: [(3, 2), (5, 3)],
    8: [(3, 2), (3, 2), (3, 2)],
}
INPUT_LAYERS = {"conv2d": 4, "conv2d6": 6, "conv2d8": 8}


def conv_output_length(lengths: torch.Tensor, layout: List[Tuple[int, int]]) -> torch.Tensor:
    for k, s in layout:
        lengths = torch.div(lengths - k, s, rounding_mode="floor") + 1
    return lengths


class Conv2dSubsampling(nn.Module):
    """(B, T, F) features -> (B, T', d_model) with T' = frames after the convolutions.

    Each conv has ``channels`` (default ``d_model``) channels and ReLU; the flattened (channels x freq)
    output is projected to ``d_model``. Utterances shorter than the receptive
    field come out with length 0 (callers filter them before training).

    ``pos_enc``: scale by sqrt(d_model) and add sinusoid positions (Transformer layers); False: neither
    (recurrent encoders know order and take the projection as it is), unless ``scaled``: then the output is
    still scaled by sqrt(d_model) but gets no absolute positions (layers whose attention carries relative
    position itself, as rotary attention, yet expect the Transformer's input magnitude).
    """

    def __init__(self, in_dim: int, d_model: int, factor: int = 4, dropout: float = 0.0, pos_enc: bool = True,
                 channels: int = 0, *, scaled: bool = False):
        super().__init__()
        if factor not in LAYOUTS:
            raise ValueError(f"subsampling factor must be one of {sorted(LAYOUTS)}, got {factor}")
        self.factor = factor
        self.layout = LAYOUTS[factor]
        layers: List[nn.Module] = []
        # The second conv dominates the cost of small models on CPU; fewer channels make it cheap.
        conv_channels = channels or d_model
        channels, freq = 1, in_dim
        for k, s in self.layout:
            # In-place ReLU: a convolution's backward needs its input, not its output, so nothing is lost.
            layers += [nn.Conv2d(channels, conv_channels, k, s), nn.ReLU(inplace=True)]
            channels, freq = conv_channels, (freq - k) // s + 1
        if freq < 1:
            raise ValueError(f"feature dim {in_dim} too small for x{factor} subsampling")
        # Channels-last kernels: oneDNN then runs the convolutions (and their backward) in NHWC, about 30%
        # faster on one CPU thread at d_model 144 (the second convolution is most of a small model's step).
        # Only the parameters' strides change: values, state dicts and checkpoints are the same.
        self.conv = nn.Sequential(*layers).to(memory_format=torch.channels_last)
        self.out = nn.Linear(conv_channels * freq, d_model)
        self.pos: nn.Module = (PositionalEncoding(d_model, dropout) if pos_enc
                               else ScaledDropout(d_model, dropout) if scaled else nn.Dropout(dropout))
        # Frames of input needed before the first output frame exists (the receptive field of one output frame).
        self.min_input_length = int(self.input_length_for(torch.tensor([1])))
        # Output frame t reads input frames [t * factor, t * factor + min_input_length): a stream holds back the
        # min_input_length - factor frames that the next output frame shares with this one.
        self.right_context = self.min_input_length - factor

    def input_length_for(self, out_len: torch.Tensor) -> torch.Tensor:
        for k, s in reversed(self.layout):
            out_len = (out_len - 1) * s + k
        return out_len

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return conv_output_length(lengths, self.layout).clamp(min=0)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, offset: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F), (B,) -> (B, T', d_model), (B,). ``offset`` (B,): the stream position of output frame 0 for
        absolute positions (a chunk of a stream whose input starts at frame ``offset * factor``)."""
        x = self.conv(x.unsqueeze(1))  # (B, C, T', F'), in memory (B, T', F', C): channels last
        b, c, t, f = x.shape
        # Each frame is flattened in memory order (F', C), a view; the projection's weight, whose input
        # order is (C, F') in the state dict, is permuted instead (d_model x C x F' values, not B x T' x C x F').
        # The gradient then reaches the ReLU in its own layout: a mixed-layout backward ran 3x slower.
        weight = self.out.weight.view(-1, c, f).transpose(1, 2).reshape(-1, f * c)
        x = nn.functional.linear(x.permute(0, 2, 3, 1).reshape(b, t, f * c), weight, self.out.bias)
        return self.pos(x) if offset is None else self.pos(x, offset), self.output_lengths(lengths)


class ScaledDropout(nn.Module):
    """dropout(x * sqrt(d_model)): :class:`PositionalEncoding` without the sinusoids. (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``offset`` is taken for :class:`PositionalEncoding`'s interface; no position is added here."""
        return self.dropout(x * self.scale)
