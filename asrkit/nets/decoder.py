"""Transformer attention decoder: causal self-attention over the prefix, attention over the encoder output.

Training runs all positions at once (:meth:`TransformerDecoder.forward`); search calls
:meth:`TransformerDecoder.decode_step` once per output token with a batch of N prefixes.

Incremental state (:class:`DecoderState`): a causal layer's output at position i depends only on
positions <= i, so it never changes once computed; ``layers`` holds one (N, L, D) tensor per layer,
that layer's outputs for the prefix so far. A step with prefixes of length L+1 runs each layer for the
newest position only (its query) against the full layer input (keys/values), then appends the new row.
The encoder memory does not change during a search either, so the first step (state None) projects it
through every layer's source-attention key/value projections once and ``memory_kv`` carries the result:
later steps project only the new query (re-projecting the (N, T, D) memory at every step was about two
thirds of a step's time). Every tensor of the state has the N prefixes on dim 0, so the search reorders
it with ``index_select`` along dim 0 like any other state (``asrkit.search.scorers.index_rows``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import nn

from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.mask import causal_mask, lengths_to_mask
from asrkit.nets.positional import PositionalEncoding
from asrkit.nets.transformer import FeedForward


class DecoderState(NamedTuple):
    """State of :meth:`TransformerDecoder.decode_step` for N prefixes of length L (rows on dim 0)."""

    layers: Tuple[torch.Tensor, ...]  # per layer: (N, L, D) its outputs for the prefix
    memory_kv: Tuple[Tuple[torch.Tensor, torch.Tensor], ...]  # per layer: source-attention keys, values (N, H, T, Dh)


class TransformerDecoderLayer(nn.Module):
    """Self-attention (causal), source attention over the encoder memory, feed-forward; pre- or post-LN."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, normalize_before: bool = True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.src_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before

    def forward(self, x: torch.Tensor, self_mask: Optional[torch.Tensor], memory: torch.Tensor,
                memory_mask: torch.Tensor, prefix: Optional[torch.Tensor] = None,
                memory_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """x (B, Lq, D) queries; prefix (B, L, D) self-attention keys/values (None: x itself);
        self_mask broadcastable to (B, Lq, L) or None; memory (B, T, D); memory_mask (B, 1, T);
        memory_kv: ``self.src_attn.project_kv(memory, memory)`` if already computed (then memory is unused)."""
        kv = x if prefix is None else prefix
        if self.normalize_before:
            h = self.norm1(x)
            hk = h if prefix is None else self.norm1(kv)
            x = x + self.dropout(self.self_attn(h, hk, hk, self_mask))
            h = self.norm2(x)
            x = x + self.dropout(self._source_attention(h, memory, memory_mask, memory_kv))
            return x + self.dropout(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, kv, kv, self_mask)))
        x = self.norm2(x + self.dropout(self._source_attention(x, memory, memory_mask, memory_kv)))
        return self.norm3(x + self.dropout(self.ffn(x)))

    def _source_attention(self, h: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor,
                          memory_kv: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if memory_kv is None:  # training, and cross_attention_weights' hook, go through src_attn's forward
            return self.src_attn(h, memory, memory, memory_mask)
        return self.src_attn.forward_projected(h, memory_kv[0], memory_kv[1], memory_mask)


class TransformerDecoder(nn.Module):
    """Token prefixes (B, L) + encoder memory (B, T, D) -> next-token logits (B, L, V).

    ``tie_embeddings`` makes the output projection use the input embedding matrix (one Parameter).
    Embeddings start at N(0, 1/d_model): the positional encoding scales them by sqrt(d_model) to unit
    size, and tied output logits start at unit scale instead of sqrt(d_model).
    """

    def __init__(self, vocab_size: int, d_model: int = 256, num_heads: int = 4, ffn_dim: int = 2048,
                 num_layers: int = 6, dropout: float = 0.1, attention_dropout: float = 0.0,
                 normalize_before: bool = True, tie_embeddings: bool = False):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, 0.0, d_model ** -0.5)
        self.pos = PositionalEncoding(d_model, dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout, normalize_before)
            for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(d_model) if normalize_before else nn.Identity()
        self.output = nn.Linear(d_model, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embed.weight

    def forward(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                memory_lens: torch.Tensor) -> torch.Tensor:
        """ys_in (B, L) ids (valid ids also on padding), ys_lens (B,), memory (B, T, D), memory_lens (B,)
        -> logits (B, L, V). Position i sees ys_in[:, :i+1] and the valid memory frames only."""
        length = ys_in.size(1)
        self_mask = lengths_to_mask(ys_lens, length).unsqueeze(1) & causal_mask(length, ys_in.device)  # (B, L, L)
        memory_mask = lengths_to_mask(memory_lens, memory.size(1)).unsqueeze(1)  # (B, 1, T)
        x = self.pos(self.embed(ys_in))  # (B, L, D)
        for layer in self.layers:
            x = layer(x, self_mask, memory, memory_mask)
        return self.output(self.final_norm(x))

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Optional[DecoderState] = None) -> Tuple[torch.Tensor, DecoderState]:
        """Log-probabilities of the token after each prefix.

        ys (N, L) prefixes (starting with <sos>, no padding); memory (N, T, D); memory_lens (N,);
        state: the state returned for ys[:, :-1] with this memory (or None to compute from scratch; then
        the memory's keys/values are projected and carried in the returned state).
        Returns log_probs (N, V) float32 and the :class:`DecoderState` for ys. Call in eval mode.
        """
        length = ys.size(1)
        if state is None:
            # contiguous: the search copies these rows at every step, and a transposed view copies slower
            memory_kv = tuple(tuple(t.contiguous() for t in layer.src_attn.project_kv(memory, memory))
                              for layer in self.layers)
        else:  # shape checks only: no host sync
            if not isinstance(state, DecoderState):
                raise TypeError(f"decoder state must be a DecoderState, got {type(state).__name__}")
            covered = state.layers[0].size(1)
            if covered != length - 1:
                raise ValueError(f"decoder state covers {covered} tokens, expected {length - 1}")
            frames = state.memory_kv[0][0].size(2)
            if frames != memory.size(1):
                raise ValueError(f"decoder state holds memory keys for {frames} frames, memory has {memory.size(1)}")
            memory_kv = state.memory_kv
        memory_mask = lengths_to_mask(memory_lens, memory.size(1)).unsqueeze(1)  # (N, 1, T)
        x = self.pos(self.embed(ys))  # (N, L, D)
        new_layers = []
        for i, layer in enumerate(self.layers):
            if state is None:
                x = layer(x, causal_mask(length, ys.device).unsqueeze(0), memory, memory_mask, memory_kv=memory_kv[i])
            else:  # newest position only; it may attend to the whole prefix
                last = layer(x[:, -1:], None, memory, memory_mask, prefix=x, memory_kv=memory_kv[i])  # (N, 1, D)
                x = torch.cat([state.layers[i], last], dim=1)
            new_layers.append(x)
        logits = self.output(self.final_norm(x[:, -1]))  # (N, V)
        return logits.float().log_softmax(dim=-1), DecoderState(tuple(new_layers), memory_kv)

    @torch.no_grad()
    def cross_attention_weights(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                                memory_lens: torch.Tensor) -> torch.Tensor:
        """(B, H, L, T) source-attention weights of the last layer, for plots."""
        src_attn = self.layers[-1].src_attn
        seen = {}  # the query the last source attention receives in an ordinary forward pass
        handle = src_attn.register_forward_pre_hook(lambda module, args: seen.update(query=args[0]))
        try:
            self.forward(ys_in, ys_lens, memory, memory_lens)
        finally:
            handle.remove()
        memory_mask = lengths_to_mask(memory_lens, memory.size(1)).unsqueeze(1)  # (B, 1, T)
        return src_attn.attention_weights(seen["query"], memory, memory_mask)
