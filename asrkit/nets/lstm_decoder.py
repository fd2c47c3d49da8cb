"""LSTM decoder with location-aware attention: the "attention-based recurrent sequence generator" of
Chorowski et al. 2015, with input feeding.

One step, for output i (y_0 = <sos>, s_0 = 0, c_0 = 0, alpha_0 uniform over valid frames):

    s_i           = LSTM([Emb(y_{i-1}); c_{i-1}], s_{i-1})       # Recurrency(s, g, y) of the paper
    c_i, alpha_i  = LocationAwareAttention(s_i, h, alpha_{i-1})  # glimpse g_i and alignment
    P(y_i | ...)  = softmax(Out([s_i; c_i]))                     # Generate(s, g)

(Index shift against the paper: our ``s_i`` is the state that has read y_{i-1}, the paper's ``s_{i-1}``.)
Teacher-forced ``forward`` and the search's ``decode_step`` run the same :meth:`step`, so they agree.

The attention's sharpening, smoothing and windowing (the paper's section 2.3) are keyword options, off by
default; see :class:`LocationAwareAttention`. The window can also be switched on for decoding only, with
:meth:`LSTMAttentionDecoder.set_decoding_window`: the paper's remedy for long utterances.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import nn

from asrkit.nets.attention import LocationAwareAttention
from asrkit.nets.mask import lengths_to_mask


class LSTMDecoderState(NamedTuple):
    """Incremental state; every field has the hypotheses on dim 0 so a search can index rows."""
    h: torch.Tensor  # (N, num_layers, H) LSTM hidden states
    c: torch.Tensor  # (N, num_layers, H) LSTM cell states
    att_weights: torch.Tensor  # (N, T) previous alignment alpha_{i-1}
    context: torch.Tensor  # (N, D_mem) previous context c_{i-1} (input feeding)
    keys: torch.Tensor  # (N, T, A) projected memory V h + b, cached so a step does not recompute it

    memory_fields = ("keys",)  # computed from the memory alone (see asrkit.search.scorers.index_rows)


class LSTMAttentionDecoder(nn.Module):
    """Autoregressive LSTM decoder over encoder memory (B, T, D_mem); ids 2 = <sos>/<eos> by default.

    ``sharpening`` (beta), ``smoothing`` and ``window`` (half-width w, 0 = off) go to the attention
    unchanged; the defaults are the plain softmax over every valid frame.
    """

    def __init__(self, vocab_size: int, memory_dim: int, embed_dim: int = 128, hidden_size: int = 320,
                 num_layers: int = 1, attention_dim: int = 320, conv_channels: int = 10, conv_kernel: int = 31,
                 dropout: float = 0.2, sos_id: int = 2, *, sharpening: float = 1.0, smoothing: bool = False,
                 window: int = 0):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"decoder num_layers must be >= 1, got {num_layers}")
        self.vocab_size, self.sos_id = vocab_size, sos_id
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.cells = nn.ModuleList(
            nn.LSTMCell(embed_dim + memory_dim if i == 0 else hidden_size, hidden_size) for i in range(num_layers))
        self.attention = LocationAwareAttention(memory_dim, hidden_size, attention_dim, conv_channels, conv_kernel,
                                                sharpening=sharpening, smoothing=smoothing, window=window)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden_size + memory_dim, vocab_size)

    def set_decoding_window(self, window: int) -> None:
        """Attend only within ``[m - window, m + window - 1]`` around the median m of the previous alignment
        from now on (0 = everywhere), whatever the model was trained with: windowing keeps the decoding of
        an utterance much longer than the training ones from jumping to a similar fragment far away.
        It holds for ``forward`` and ``decode_step`` alike (and so for training, if training goes on) until
        set again; it is not saved with the weights. The first step is never windowed (see
        :class:`LocationAwareAttention`)."""
        self.attention.window = LocationAwareAttention.check_window(window)

    def init_state(self, memory: torch.Tensor, memory_lens: torch.Tensor) -> LSTMDecoderState:
        """State before <sos>: zero LSTM state and context, uniform alignment over the valid frames."""
        n = memory.size(0)
        zeros = memory.new_zeros(n, self.num_layers, self.hidden_size)
        mask = lengths_to_mask(memory_lens, memory.size(1))
        return LSTMDecoderState(zeros, zeros.clone(), LocationAwareAttention.initial_weights(mask),
                                memory.new_zeros(n, memory.size(2)), self.attention.project_memory(memory))

    def step(self, tokens: torch.Tensor, state: LSTMDecoderState, memory: torch.Tensor,
             mask: torch.Tensor) -> Tuple[torch.Tensor, LSTMDecoderState]:
        """Read tokens y_{i-1} (N,) -> logits for y_i (N, V) and the new state. mask: (N, T) bool."""
        x = torch.cat([self.dropout(self.embed(tokens)), state.context], dim=-1)  # (N, E + D_mem)
        hs, cs = [], []
        for layer, cell in enumerate(self.cells):
            h, c = cell(x, (state.h[:, layer], state.c[:, layer]))
            hs.append(h)
            cs.append(c)
            x = self.dropout(h)
        context, weights = self.attention(h, memory, mask, state.att_weights, keys=state.keys)
        logits = self.output(self.dropout(torch.cat([h, context], dim=-1)))  # (N, V)
        new = LSTMDecoderState(torch.stack(hs, 1), torch.stack(cs, 1), weights, context, state.keys)
        return logits, new

    def _teacher_forced(self, ys_in: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
        """logits (B, L, V) and attention weights (B, L, T) (step i attends for output i)."""
        state = self.init_state(memory, memory_lens)
        mask = lengths_to_mask(memory_lens, memory.size(1))
        logits, weights = [], []
        for i in range(ys_in.size(1)):
            out, state = self.step(ys_in[:, i], state, memory, mask)
            logits.append(out)
            weights.append(state.att_weights)
        return torch.stack(logits, 1), torch.stack(weights, 1)

    def forward(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                memory_lens: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ys_in (B, L) = <sos> + tokens (valid ids on padding too; positions past ys_lens
        are computed and ignored by the loss), memory (B, T, D_mem), memory_lens (B,) -> logits (B, L, V)."""
        return self._teacher_forced(ys_in, memory, memory_lens)[0]

    @torch.no_grad()
    def attention_weights(self, ys_in: torch.Tensor, ys_lens: torch.Tensor, memory: torch.Tensor,
                          memory_lens: torch.Tensor) -> torch.Tensor:
        """(B, L, T) alignments of the teacher-forced decoder, for plots."""
        return self._teacher_forced(ys_in, memory, memory_lens)[1]

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Optional[LSTMDecoderState] = None) -> Tuple[torch.Tensor, LSTMDecoderState]:
        """Next-token log-probs for prefixes ys (N, L) (starting with <sos>) -> (log_probs (N, V), state).

        With ``state`` from the previous call only the last token ``ys[:, -1]`` is read; with
        ``state=None`` the whole prefix is run from the start. No host synchronisation happens here.
        """
        if ys.size(1) == 0:
            raise ValueError("decode_step needs prefixes of at least one token (<sos>)")
        mask = lengths_to_mask(memory_lens, memory.size(1))
        if state is None:
            state = self.init_state(memory, memory_lens)
            tokens = ys.unbind(1)
        else:
            tokens = (ys[:, -1],)
        for tok in tokens:
            logits, state = self.step(tok, state, memory, mask)
        return logits.float().log_softmax(dim=-1), state
