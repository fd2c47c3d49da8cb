"""Stacked bidirectional LSTM encoder over packed sequences, with optional conv / pyramidal subsampling.

Layout: ``[Conv2dSubsampling (x4/x6/x8, no positional encoding)] -> BLSTM_1 -> ... -> BLSTM_N``.
After each layer listed in ``pyramid_layers`` (1-based, must be below ``num_layers``) consecutive
frame pairs are concatenated (Chan et al. 2016, "Listen, Attend and Spell"), halving the frame
rate and doubling the feature size seen by the next layer.

Odd lengths: a pyramidal step pads one zero frame at the end, so a length ``L`` becomes
``ceil(L / 2) = (L + 1) // 2`` and the last frame of an odd-length utterance is paired with zeros.
Because packed LSTMs leave exact zeros in padding positions, an utterance gives the same
encodings alone or inside a padded batch.
"""
from __future__ import annotations

from typing import List, NoReturn, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from asrkit.nets.subsampling import INPUT_LAYERS, Conv2dSubsampling


def pyramid_halve(x: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) -> (B, ceil(T/2), 2D) by concatenating frames 2t and 2t+1; lengths -> (lengths + 1) // 2.

    Padding frames of ``x`` must be zero (as ``pad_packed_sequence`` leaves them) so an odd-length
    utterance is paired with zeros whether or not it is padded in a batch.
    """
    b, t, d = x.shape
    if t % 2:
        x = F.pad(x, (0, 0, 0, 1))  # one zero frame at the end
    return x.reshape(b, (t + 1) // 2, 2 * d), torch.div(lengths + 1, 2, rounding_mode="floor")


class BLSTMEncoder(nn.Module):
    """(B, T, F) features, (B,) lengths -> (B, T', 2 * hidden_size) encodings, (B,) lengths.

    ``input_layer``: ``conv2d`` | ``conv2d6`` | ``conv2d8`` (Conv2dSubsampling with ``hidden_size``
    channels) or ``none`` (LSTMs read the features directly). ``subsampling_factor`` is the
    nominal number of feature frames per output frame (conv factor x 2 per pyramid layer).
    """

    def __init__(self, in_dim: int, hidden_size: int = 320, num_layers: int = 4, dropout: float = 0.2,
                 input_layer: str = "conv2d", pyramid_layers: Sequence[int] = ()):
        super().__init__()
        if input_layer != "none" and input_layer not in INPUT_LAYERS:
            raise ValueError(f"unknown input_layer '{input_layer}' (choose from {sorted(INPUT_LAYERS) + ['none']})")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        bad = [k for k in pyramid_layers if not 1 <= k < num_layers]
        if bad or len(set(pyramid_layers)) != len(pyramid_layers):
            raise ValueError(f"pyramid_layers {tuple(pyramid_layers)} must be distinct layer numbers in "
                             f"1..{num_layers - 1} (a pyramid step feeds the next layer)")
        factor = 1 if input_layer == "none" else INPUT_LAYERS[input_layer]
        self.subsampling = (None if input_layer == "none" else
                            Conv2dSubsampling(in_dim, hidden_size, factor, dropout=0.0, pos_enc=False))
        self.pyramid_layers = frozenset(pyramid_layers)
        self.subsampling_factor = factor * 2 ** len(self.pyramid_layers)
        self.output_dim = 2 * hidden_size
        self.intermediate_layers: Tuple[int, ...] = ()  # no intermediate CTC on a BiLSTM stack
        layers = []
        d = hidden_size if self.subsampling is not None else in_dim
        for i in range(1, num_layers + 1):
            layers.append(nn.LSTM(d, hidden_size, batch_first=True, bidirectional=True))
            d = 2 * hidden_size * (2 if i in self.pyramid_layers else 1)
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(dropout)

    def output_lengths(self, feat_lens: torch.Tensor) -> torch.Tensor:
        """(B,) feature frames -> (B,) encoder frames."""
        lens = feat_lens if self.subsampling is None else self.subsampling.output_lengths(feat_lens)
        for _ in self.pyramid_layers:
            lens = torch.div(lens + 1, 2, rounding_mode="floor")
        return lens

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, ctc_logits: object = None
                ) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
        """-> encodings (B, T', 2H), lengths (B,), and no intermediate layers (``[]``); ``ctc_logits`` is
        accepted for the encoder protocol and unused (a BiLSTM has no self-conditioning)."""
        min_len = 1 if self.subsampling is None else self.subsampling.min_input_length
        if feats.size(1) < min_len:  # every utterance shorter than the receptive field: nothing to run
            return feats.new_zeros(feats.size(0), 0, self.output_dim), self.output_lengths(feat_lens), []
        if self.subsampling is not None:
            x, lens = self.subsampling(feats, feat_lens)  # (B, T', H)
        else:
            x, lens = feats, feat_lens
        # Packing needs lengths on the host (one copy, kept in step with pyramids) and > 0; utterances
        # shorter than the conv's receptive field keep their true length 0, so downstream masks them out.
        host_lens = lens.clamp(min=1).cpu()
        for i, lstm in enumerate(self.layers, start=1):
            packed = pack_padded_sequence(x, host_lens, batch_first=True, enforce_sorted=False)
            out, _ = lstm(packed)
            x, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # (B, T, 2H), zero padded
            if i in self.pyramid_layers:
                x, lens = pyramid_halve(x, lens)
                host_lens = torch.div(host_lens + 1, 2, rounding_mode="floor")
            if i < len(self.layers):
                x = self.dropout(x)
        return x, lens, []

    def init_stream(self, batch: int, device: torch.device, chunk_frames: Optional[int] = None,
                    left_chunks: Optional[int] = None) -> NoReturn:
        """A bidirectional LSTM cannot stream: refused (the encoder chunk step's interface)."""
        raise ValueError("model.encoder.kind blstm cannot stream: its backward LSTMs read every utterance from its "
                         "end (use kind conformer or transformer with model.encoder.streaming)")
