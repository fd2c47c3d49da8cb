"""Multi-head attention through ``torch.nn.functional.scaled_dot_product_attention``."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head attention; ``mask`` is bool, True = may attend, broadcastable to (B, Tq, Tk)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, Dh)
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.forward_projected(query, *self.project_kv(key, value), mask)

    def project_kv(self, key: torch.Tensor, value: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """key, value (B, Tk, D) -> the projected keys and values that :meth:`forward` attends to, each
        (B, H, Tk, Dh). A caller that attends to the same keys at many steps (an incremental decoder over
        the encoder memory) projects them once and passes them to :meth:`forward_projected`."""
        return self._split(self.k_proj(key)), self._split(self.v_proj(value))

    def forward_projected(self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """:meth:`forward` with keys/values from :meth:`project_kv`: query (B, Tq, D), k and v (B, H, Tk, Dh),
        mask as in :meth:`forward` -> (B, Tq, D)."""
        q = self._split(self.q_proj(query))
        attn_mask = None if mask is None else no_empty_rows(mask).unsqueeze(1)  # (B, 1, Tq|1, Tk) over heads
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))

    @torch.no_grad()
    def attention_weights(self, query: torch.Tensor, key: torch.Tensor,
                          mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, H, Tq, Tk) softmax weights, computed explicitly (SDPA does not return them); for plots."""
        q, k = self._split(self.q_proj(query)), self._split(self.k_proj(key))
        scores = (q @ k.transpose(-1, -2)).float() / self.head_dim ** 0.5  # (B, H, Tq, Tk)
        if mask is not None:
            scores = scores.masked_fill(~no_empty_rows(mask).unsqueeze(1), float("-inf"))
        return scores.softmax(dim=-1)


def no_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    """A query row with no valid key (a zero-length utterance) would make SDPA return NaN, and a NaN
    in one utterance poisons the whole batch's gradient: let such rows attend everywhere instead.
    Their outputs are garbage but finite, and belong to frames nothing downstream reads."""
    return mask | ~mask.any(dim=-1, keepdim=True)


class LocationAwareAttention(nn.Module):
    """Additive attention with location features (Chorowski et al. 2015, "Attention-Based Models for Speech
    Recognition"): ``e_ij = w^T tanh(W s_{i-1} + V h_j + U f_ij + b)`` with ``f_i = F * alpha_{i-1}``.

    ``F`` is a 1-channel -> ``conv_channels`` Conv1d of odd width ``conv_kernel`` over the previous
    alignment, zero-padded ("same" length). Like every torch conv it is a cross-correlation:
    ``f_ij[k] = sum_r F[k, r] * alpha_{i-1}[j + r - conv_kernel // 2]`` (zeros outside the utterance).
    Padding frames get exactly zero weight: their energies are replaced by the most negative float
    before the softmax, so ``exp`` underflows to 0.

    The paper's three refinements of the normalisation (its section 2.3); the defaults give the plain
    softmax over every valid frame, so models trained before they existed are unchanged:

    - sharpening, ``sharpening`` = beta > 0: ``alpha_ij = exp(beta e_ij) / sum_j exp(beta e_ij)``.
      beta > 1 makes the alignment peakier (less noise from irrelevant frames in the glimpse of a long
      utterance), beta < 1 flatter, beta = 1 is the plain softmax.
    - smoothing, ``smoothing=True``: ``alpha_ij = sigmoid(e_ij) / sum_j sigmoid(e_ij)``; the bounded sigmoid
      in place of the unbounded exp keeps one frame from taking all the weight. Computed as
      ``softmax(log sigmoid(e))``, the same ratio without sigmoid underflowing to 0 (and the sum to 0/0)
      for very negative energies. With both options beta scales e inside the sigmoid.
    - windowing, ``window`` = w > 0: only the frames ``m - w <= j <= m + w - 1`` are scored (the paper's
      ``h_{p-w}, ..., h_{p+w-1}``: 2w frames, w before the median and w from it on), where the median m of
      alpha_{i-1} is the first frame at which its cumulative sum reaches 0.5 (:meth:`alignment_median`).
      Frames outside the window get weight exactly 0 and the normalisation (either one above) runs over
      the window's valid frames. The window always holds frame m, which is a valid frame for any
      alignment that sums to 1 over the valid frames, so no row is left with nothing to attend to.
      Rows whose alpha_{i-1} is the uniform alpha_0 of :meth:`initial_weights` (the first step) are not
      windowed: the median of a uniform alignment is the middle of the utterance, not a place the decoder
      has reached, and a window there would hide the start of a long utterance from the first output.
      All energies are still computed (the paper skips those outside the window); the window only masks.
      ``window`` is a plain attribute, not in the state dict: a decoder may set it for decoding only.
    """

    def __init__(self, memory_dim: int, query_dim: int, attention_dim: int, conv_channels: int = 10,
                 conv_kernel: int = 31, *, sharpening: float = 1.0, smoothing: bool = False, window: int = 0):
        super().__init__()
        if conv_kernel < 1 or conv_kernel % 2 == 0:
            raise ValueError(f"location conv_kernel must be odd and positive, got {conv_kernel}")
        if not sharpening > 0:  # `not >` also rejects NaN
            raise ValueError(f"attention sharpening (inverse temperature beta) must be > 0, got {sharpening}")
        self.memory_proj = nn.Linear(memory_dim, attention_dim)  # V h_j + b
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)  # W s_{i-1}
        self.location_conv = nn.Conv1d(1, conv_channels, conv_kernel, padding=conv_kernel // 2, bias=False)  # F
        self.location_proj = nn.Linear(conv_channels, attention_dim, bias=False)  # U
        self.score_proj = nn.Linear(attention_dim, 1, bias=False)  # w (a bias would cancel in the softmax)
        self.sharpening, self.smoothing = float(sharpening), bool(smoothing)
        self.window = self.check_window(window)

    @staticmethod
    def check_window(window: int) -> int:
        """The window half-width w, checked: an int >= 0 (0 = no window)."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"attention window must be an int >= 0 (0 = off), got {window!r}")
        return window

    @staticmethod
    def initial_weights(mask: torch.Tensor) -> torch.Tensor:
        """alpha_0: uniform over the valid frames, zero on padding. mask (B, T) bool -> (B, T) float.

        Uniform rather than all-zero so that the location filters see where the utterance starts
        and ends from the first step on (the conv over a flat alignment responds at its edges).
        """
        w = mask.float()
        return w / w.sum(dim=-1, keepdim=True).clamp(min=1.0)

    @staticmethod
    def alignment_median(weights: torch.Tensor) -> torch.Tensor:
        """(B, T) alignment -> (B,) int64: the first frame j where ``sum_{k<=j} alpha_k >= 0.5``.

        Counted as the number of frames whose cumulative sum is still below 0.5 (the cumulative sum of
        nonnegative weights never decreases): tensor ops only, no host sync. The sum runs in float32, so
        an alignment whose cumulative sum hits 0.5 exactly (a uniform one over an even number of frames)
        may land on either side of the tie by rounding. A row of zeros gives T.
        """
        return (weights.float().cumsum(dim=-1) < 0.5).sum(dim=-1)

    def window_mask(self, prev_weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) bool, True = inside the window ``[m - w, m + w - 1]`` around the median m of prev_weights
        alpha_{i-1} (B, T); all True for rows whose alpha_{i-1} is the uniform alpha_0 of ``mask`` (B, T).
        Needs ``window`` > 0; padding is not removed here (the caller ands with ``mask``)."""
        w = self.window
        m = self.alignment_median(prev_weights).unsqueeze(-1)  # (B, 1)
        j = torch.arange(prev_weights.size(-1), device=prev_weights.device)  # (T,)
        inside = (j >= m - w) & (j < m + w)  # (B, T)
        # Exact equality: the decoder state holds the very tensor initial_weights made (or rows of it),
        # and a learned alignment is never exactly uniform.
        first = (prev_weights == self.initial_weights(mask)).all(dim=-1, keepdim=True)  # (B, 1)
        return inside | first

    def project_memory(self, memory: torch.Tensor) -> torch.Tensor:
        """(B, T, D_mem) -> (B, T, A) = V h_j + b; computed once per utterance, reused by every step."""
        return self.memory_proj(memory)

    def energies(self, query: torch.Tensor, keys: torch.Tensor, prev_weights: torch.Tensor) -> torch.Tensor:
        """Unmasked energies e_ij: query s_{i-1} (B, D_q), keys (B, T, A), prev_weights alpha_{i-1} (B, T) -> (B, T)."""
        loc = self.location_conv(prev_weights.to(keys.dtype).unsqueeze(1)).transpose(1, 2)  # (B, T, K)
        hidden = torch.tanh(keys + self.query_proj(query).unsqueeze(1) + self.location_proj(loc))  # (B, T, A)
        return self.score_proj(hidden).squeeze(-1)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor, prev_weights: torch.Tensor,
                keys: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One attention step.

        query (B, D_q), memory (B, T, D_mem), mask (B, T) bool (True = valid frame), prev_weights (B, T),
        keys: ``project_memory(memory)`` if already computed. Returns context (B, D_mem) and
        weights alpha_i (B, T) in float32 (sum 1 over the valid frames in the window, exactly 0 elsewhere).
        """
        keys = self.project_memory(memory) if keys is None else keys
        e = self.energies(query, keys, prev_weights).float()  # softmax in float32 under AMP too
        if self.sharpening != 1.0:  # skipped at beta = 1 so the default stays bit-identical to the plain softmax
            e = e * self.sharpening  # beta e_ij
        if self.smoothing:
            e = F.logsigmoid(e)  # softmax(log sigmoid(e)) = sigmoid(e) / sum_j sigmoid(e)
        allowed = mask if self.window == 0 else mask & self.window_mask(prev_weights, mask)  # (B, T)
        # x allowed: a zero-length utterance (all frames masked) gets all-zero weights instead of uniform ones.
        weights = e.masked_fill(~allowed, torch.finfo(e.dtype).min).softmax(dim=-1) * allowed  # (B, T)
        context = torch.bmm(weights.to(memory.dtype).unsqueeze(1), memory).squeeze(1)  # (B, D_mem)
        return context, weights
