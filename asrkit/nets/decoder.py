"""Transformer attention decoder: causal self-attention over the prefix, attention over the encoder output.

Training runs all positions at once (:meth:`TransformerDecoder.forward`); search calls
:meth:`TransformerDecoder.decode_step` once per output token with a batch of N prefixes.

Incremental state (:class:`DecoderState`): a causal layer's output at position i depends only on
positions <= i, so neither it nor the self-attention keys/values projected from that layer's input at
position i ever change once computed. ``self_kv`` holds, per layer, those projected keys and values for
the prefix so far, (N, H, L, Dh) each: of ``norm1(layer input)`` for pre-LN, of the layer input for
post-LN. A step with prefixes of length L+1 embeds only the newest token (at position L), runs each layer
for that position only, projects its key/value once and appends them: a step costs O(1) projections.
(Re-normalising and re-projecting the whole prefix in every layer cost 6, 16, 41 ms a step at L = 2, 30,
100 for the tiny model with 160 prefixes on one CPU thread; now 6, 9, 16 ms, what still grows with L
being the copy of the cache and the attention over it.)
The encoder memory does not change during a search either, so the first step (state None) projects it
through every layer's source-attention key/value projections once and ``memory_kv`` carries the result:
later steps project only the new query. The first step computes its whole prefix at once and fills both
caches. Every tensor of the state has the N prefixes on dim 0, so the search reorders it with
``index_select`` along dim 0 like any other state (``asrkit.search.scorers.index_rows``).
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

    self_kv: Tuple[Tuple[torch.Tensor, torch.Tensor], ...]  # per layer: self-attention keys, values (N, H, L, Dh)
    memory_kv: Tuple[Tuple[torch.Tensor, torch.Tensor], ...]  # per layer: source-attention keys, values (N, H, T, Dh)

    # Fields computed from the encoder memory alone: a search whose rows never leave their utterance
    # need not reorder them (asrkit.search.scorers.index_rows, keep_memory_fields).
    memory_fields = ("memory_kv",)


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
                memory_mask: torch.Tensor) -> torch.Tensor:
        """x (B, L, D); self_mask broadcastable to (B, L, L) or None; memory (B, T, D); memory_mask (B, 1, T)."""
        h = self.norm1(x) if self.normalize_before else x
        return self._after_self_attention(x, self.self_attn(h, h, h, self_mask), memory, memory_mask, None)

    def forward_step(self, x: torch.Tensor, self_mask: Optional[torch.Tensor], memory_mask: torch.Tensor,
                     memory_kv: Tuple[torch.Tensor, torch.Tensor],
                     past_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                     ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Incremental :meth:`forward` for the positions after ``past_kv``'s.

        x (N, Lq, D) the layer input at the new positions; past_kv: the self-attention keys, values
        (N, H, Lp, Dh) of the earlier positions, as this method returned them (None: Lp = 0);
        self_mask broadcastable to (N, Lq, Lp + Lq) or None; memory_mask (N, 1, T);
        memory_kv: ``self.src_attn.project_kv(memory, memory)``.
        Returns the output (N, Lq, D) and the self-attention keys, values of all Lp + Lq positions.
        """
        h = self.norm1(x) if self.normalize_before else x  # what forward's self-attention keys come from
        k, v = self.self_attn.project_kv(h, h)  # (N, H, Lq, Dh): only the new positions are projected
        if past_kv is None:  # contiguous: the search copies these rows at every step
            k, v = k.contiguous(), v.contiguous()
        else:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        a = self.self_attn.forward_projected(h, k, v, self_mask)
        return self._after_self_attention(x, a, None, memory_mask, memory_kv), (k, v)

    def _after_self_attention(self, x: torch.Tensor, a: torch.Tensor, memory: Optional[torch.Tensor],
                              memory_mask: torch.Tensor,
                              memory_kv: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The rest of the layer, given its input x and the self-attention output a (B, Lq, D)."""
        if self.normalize_before:
            x = x + self.dropout(a)
            h = self.norm2(x)
            x = x + self.dropout(self._source_attention(h, memory, memory_mask, memory_kv))
            return x + self.dropout(self.ffn(self.norm3(x)))
        x = self.norm1(x + self.dropout(a))
        x = self.norm2(x + self.dropout(self._source_attention(x, memory, memory_mask, memory_kv)))
        return self.norm3(x + self.dropout(self.ffn(x)))

    def _source_attention(self, h: torch.Tensor, memory: Optional[torch.Tensor], memory_mask: torch.Tensor,
                          memory_kv: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if memory_kv is None:  # training, and attention_weights' hook, go through src_attn's forward
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
        state: the state returned for ys[:, :-1] with this memory (or None to compute from scratch: then the
        whole prefix runs at once, and the memory's and the prefix's keys/values fill the returned state).
        Returns log_probs (N, V) float32 and the :class:`DecoderState` for ys. Call in eval mode.
        """
        length = ys.size(1)
        if state is None:
            # contiguous: the search copies these rows at every step, and a transposed view copies slower
            memory_kv = tuple(tuple(t.contiguous() for t in layer.src_attn.project_kv(memory, memory))
                              for layer in self.layers)
            past_kv = (None,) * len(self.layers)
            x = self.pos(self.embed(ys))  # (N, L, D): the whole prefix at once
            self_mask: Optional[torch.Tensor] = causal_mask(length, ys.device).unsqueeze(0)  # (1, L, L)
        else:  # shape checks only: no host sync
            if not isinstance(state, DecoderState):
                raise TypeError(f"decoder state must be a DecoderState, got {type(state).__name__}")
            covered = state.self_kv[0][0].size(2)
            if covered != length - 1:
                raise ValueError(f"decoder state covers {covered} tokens, expected {length - 1}")
            frames = state.memory_kv[0][0].size(2)
            if frames != memory.size(1):
                raise ValueError(f"decoder state holds memory keys for {frames} frames, memory has {memory.size(1)}")
            memory_kv, past_kv = state.memory_kv, state.self_kv
            x = self.pos(self.embed(ys[:, -1:]), offset=length - 1)  # (N, 1, D): the newest token only
            self_mask = None  # it may attend to the whole prefix
        memory_mask = lengths_to_mask(memory_lens, memory.size(1)).unsqueeze(1)  # (N, 1, T)
        self_kv = []
        for layer, layer_memory_kv, layer_past_kv in zip(self.layers, memory_kv, past_kv):
            x, kv = layer.forward_step(x, self_mask, memory_mask, layer_memory_kv, layer_past_kv)
            self_kv.append(kv)
        logits = self.output(self.final_norm(x[:, -1]))  # (N, V)
        return logits.float().log_softmax(dim=-1), DecoderState(tuple(self_kv), memory_kv)

    @torch.no_grad()
    def attention_weights(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                          memory_lens: torch.Tensor) -> torch.Tensor:
        """(B, L, T) source-attention weights of the last layer, averaged over heads, for plots."""
        src_attn = self.layers[-1].src_attn
        seen = {}  # the query the last source attention receives in an ordinary forward pass
        handle = src_attn.register_forward_pre_hook(lambda module, args: seen.update(query=args[0]))
        try:
            self.forward(ys_in, ys_lens, memory, memory_lens)
        finally:
            handle.remove()
        memory_mask = lengths_to_mask(memory_lens, memory.size(1)).unsqueeze(1)  # (B, 1, T)
        return src_attn.attention_weights(seen["query"], memory, memory_mask).mean(dim=1)
