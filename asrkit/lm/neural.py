"""Neural language models over tokenizer ids (LSTM, Transformer) and their batched search scorer.

A sentence is modelled as ``<sos> y1 .. yn <eos>`` over the tokenizer's ids (``<sos/eos>`` = 2 for
both ends; the CTC blank, id 0, is never a target). ``logits(ys_in)`` scores all positions at once:
``ys_in`` (B, L) = ``<sos> y1 .. y(L-1)`` -> logits (B, L, V), position i predicting token i+1 from
``ys_in[:, :i+1]`` only (padding at the end of a row changes nothing before it).

Training: ``forward(batch)`` takes the batch dict of :func:`make_lm_batch`'s tensors, ``ys_in`` and
``ys_out`` (B, L), and returns ``{"loss": ...}``, the mean cross-entropy per target token (``y1..yn
<eos>``, padding excluded), like the ASR models' ``forward(batch)``, so one trainer drives both
(asrkit.train); the trainer weighs a batch by its target token count (``num_tokens``).

Incremental use: ``zero_state(n, device)`` then ``step(tokens (N,), state, active (N,))`` consumes one
token per prefix and returns the logits of the next one. Rows with ``active`` False keep their state
exactly (the search's "prefix unchanged"); their logits are computed but meaningless. Every state is
a tuple of batch-first tensors, so a search reorders it with ``index_select`` along dim 0:

* LSTM: ``(h, c)``, each (N, layers, H).
* Transformer: ``(kv, valid, pos)``: keys/values of every layer for every slot, (N, layers, 2, S, D);
  ``valid`` (N, S) bool, which slots hold a consumed token; ``pos`` (N,) tokens consumed. Every step
  appends one slot to every row (rows that do not advance get an invalid one), so all rows share S and
  a step needs no per-row scatter and no host sync; S grows with the number of steps.
"""
from __future__ import annotations

import os
from typing import Dict, NamedTuple, Optional, Protocol, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from asrkit.checkpoint import load_checkpoint, load_weights
from asrkit.config import ConfigError, LMModelConfig, load_lm_config
from asrkit.nets.attention import MultiHeadAttention
from asrkit.nets.mask import causal_mask
from asrkit.nets.positional import PositionalEncoding
from asrkit.nets.transformer import FeedForward
from asrkit.text.tokenizer import BLANK_ID, SOS_EOS_ID, Tokenizer, load_tokenizer

LM_NAMES = ("lstm", "transformer")
IGNORE_ID = -1  # ys_out padding: not a target
LMState = Tuple[torch.Tensor, ...]


class IncrementalLM(Protocol):
    """What :class:`NeuralLMScorer` needs from an LM (both LMs here meet it)."""

    vocab_size: int

    def logits(self, ys_in: torch.Tensor) -> torch.Tensor: ...
    def zero_state(self, n: int, device: torch.device) -> LMState: ...
    def step(self, tokens: torch.Tensor, state: LMState, active: torch.Tensor) -> Tuple[torch.Tensor, LMState]: ...


def lm_loss(logits: torch.Tensor, ys_out: torch.Tensor) -> Dict[str, torch.Tensor]:
    """logits (B, L, V), ys_out (B, L) padded with IGNORE_ID -> ``{"loss"}``: the mean cross-entropy per
    target token, computed in float32 even under bf16/fp16 autocast (the softmax normaliser sums over the
    whole vocabulary, which half precision rounds badly)."""
    return {"loss": F.cross_entropy(logits.float().flatten(0, 1), ys_out.flatten(), ignore_index=IGNORE_ID)}


class LSTMLM(nn.Module):
    """Embedding -> stacked LSTM -> Linear. ``tie_embeddings`` needs ``hidden_size == embed_dim``."""

    def __init__(self, vocab_size: int, embed_dim: int = 256, hidden_size: int = 512, num_layers: int = 2,
                 dropout: float = 0.1, tie_embeddings: bool = False):
        super().__init__()
        self.vocab_size, self.num_layers, self.hidden_size = vocab_size, num_layers, hidden_size
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.output = nn.Linear(hidden_size, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embed.weight

    def logits(self, ys_in: torch.Tensor) -> torch.Tensor:
        """ys_in (B, L) -> logits (B, L, V)."""
        out, _ = self.lstm(self.dropout(self.embed(ys_in)))  # (B, L, H)
        return self.output(self.dropout(out))

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``ys_in``, ``ys_out`` (B, L) -> ``{"loss"}`` (see the module docstring)."""
        return lm_loss(self.logits(batch["ys_in"]), batch["ys_out"])

    def zero_state(self, n: int, device: torch.device) -> LMState:
        dtype = self.output.weight.dtype
        zeros = torch.zeros(n, self.num_layers, self.hidden_size, dtype=dtype, device=device)
        return zeros, zeros.clone()

    def step(self, tokens: torch.Tensor, state: LMState, active: torch.Tensor) -> Tuple[torch.Tensor, LMState]:
        """tokens (N,), state (h, c) each (N, layers, H), active (N,) bool -> logits (N, V), new state."""
        h0, c0 = (s.transpose(0, 1).contiguous() for s in state)  # nn.LSTM wants (layers, N, H)
        out, (h, c) = self.lstm(self.dropout(self.embed(tokens)).unsqueeze(1), (h0, c0))
        keep = active[:, None, None]
        new = (torch.where(keep, h.transpose(0, 1), state[0]), torch.where(keep, c.transpose(0, 1), state[1]))
        return self.output(self.dropout(out[:, 0])), new


class _LMLayer(nn.Module):
    """Pre-LN Transformer layer with causal self-attention only; ``step`` attends from one new position."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, L, D), mask (1, L, L) bool causal -> (B, L, D)."""
        h = self.norm1(x)
        x = x + self.dropout(self.attn(h, h, h, mask))
        return x + self.dropout(self.ffn(self.norm2(x)))

    def step(self, x: torch.Tensor, cache: torch.Tensor, valid: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """x (N, D) the new position; cache (N, 2, S, D) keys/values of earlier slots; valid (N, S+1) bool
        (the last slot, the new position itself, True) -> output (N, D) and the new key/value (N, 2, D)."""
        a = self.attn
        n, d = x.shape
        h = self.norm1(x)
        q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)  # (N, D) each
        keys = torch.cat([cache[:, 0], k[:, None]], dim=1)  # (N, S+1, D)
        values = torch.cat([cache[:, 1], v[:, None]], dim=1)
        out = F.scaled_dot_product_attention(a._split(q[:, None]), a._split(keys), a._split(values),
                                             attn_mask=valid[:, None, None, :])  # (N, H, 1, Dh)
        x = x + self.dropout(a.out_proj(out.reshape(n, d)))
        x = x + self.dropout(self.ffn(self.norm2(x)))
        return x, torch.stack([k, v], dim=1)


class TransformerLM(nn.Module):
    """Embedding + sinusoidal positions -> pre-LN causal Transformer layers -> LayerNorm -> Linear.

    Embeddings start at N(0, 1/d_model) and are scaled by sqrt(d_model) (as in the ASR decoder).
    """

    def __init__(self, vocab_size: int, d_model: int = 256, num_heads: int = 4, ffn_dim: int = 1024,
                 num_layers: int = 4, dropout: float = 0.1, tie_embeddings: bool = False):
        super().__init__()
        self.vocab_size, self.d_model, self.num_layers = vocab_size, d_model, num_layers
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, 0.0, d_model ** -0.5)
        self.pos = PositionalEncoding(d_model, dropout)
        self.layers = nn.ModuleList(_LMLayer(d_model, num_heads, ffn_dim, dropout) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embed.weight

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """``ys_in``, ``ys_out`` (B, L) -> ``{"loss"}`` (see the module docstring)."""
        return lm_loss(self.logits(batch["ys_in"]), batch["ys_out"])

    def logits(self, ys_in: torch.Tensor) -> torch.Tensor:
        """ys_in (B, L) -> logits (B, L, V)."""
        mask = causal_mask(ys_in.size(1), ys_in.device).unsqueeze(0)  # (1, L, L)
        x = self.pos(self.embed(ys_in))
        for layer in self.layers:
            x = layer(x, mask)
        return self.output(self.final_norm(x))

    def zero_state(self, n: int, device: torch.device) -> LMState:
        dtype = self.output.weight.dtype
        kv = torch.zeros(n, self.num_layers, 2, 0, self.d_model, dtype=dtype, device=device)
        return kv, torch.zeros(n, 0, dtype=torch.bool, device=device), torch.zeros(n, dtype=torch.long, device=device)

    def step(self, tokens: torch.Tensor, state: LMState, active: torch.Tensor) -> Tuple[torch.Tensor, LMState]:
        """tokens (N,), state (kv, valid, pos), active (N,) bool -> logits (N, V), new state (one more slot)."""
        kv, valid, pos = state
        table = self.pos.table
        # Positions past the table (5000 tokens) reuse its last row: the forward pass would extend it, but
        # a step cannot without reading pos on the host.
        x = self.pos.dropout(self.embed(tokens) * self.pos.scale + table[pos.clamp(max=table.size(0) - 1)].to(kv.dtype))
        attend = torch.cat([valid, active.new_ones(active.shape[0], 1)], dim=1)  # the new slot always sees itself
        new_kv = []
        for i, layer in enumerate(self.layers):
            x, kv_i = layer.step(x, kv[:, i], attend)
            new_kv.append(kv_i)
        kv = torch.cat([kv, torch.stack(new_kv, dim=1).unsqueeze(3)], dim=3)  # (N, layers, 2, S+1, D)
        state = (kv, torch.cat([valid, active[:, None]], dim=1), pos + active.long())
        return self.output(self.final_norm(x)), state


def check_lm_model_config(cfg: LMModelConfig) -> None:
    """Raise a ConfigError naming the ``model.*`` key that cannot build an LM."""
    if cfg.name not in LM_NAMES:
        raise ConfigError(f"model.name '{cfg.name}' is not a neural LM (choose from: {', '.join(LM_NAMES)})")
    if min(cfg.embed_dim, cfg.num_layers) < 1 or not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError("model.embed_dim and model.num_layers must be >= 1 and model.dropout in [0, 1)")
    if cfg.name == "lstm" and cfg.hidden_size < 1:
        raise ConfigError(f"model.hidden_size must be >= 1, got {cfg.hidden_size}")
    if cfg.name == "lstm" and cfg.tie_embeddings and cfg.hidden_size != cfg.embed_dim:
        raise ConfigError(f"model.tie_embeddings needs model.hidden_size == model.embed_dim for an LSTM LM "
                          f"(got {cfg.hidden_size} and {cfg.embed_dim})")
    if cfg.name == "transformer" and (cfg.num_heads < 1 or cfg.ffn_dim < 1 or cfg.embed_dim % cfg.num_heads):
        raise ConfigError(f"model.embed_dim {cfg.embed_dim} is not divisible by model.num_heads {cfg.num_heads} "
                          f"(or model.num_heads/model.ffn_dim < 1)")


def build_lm(cfg: LMModelConfig, vocab_size: int) -> nn.Module:
    """The LM named by ``cfg.name``; a bad setting is a ConfigError naming the ``model.*`` key."""
    check_lm_model_config(cfg)
    if cfg.name == "lstm":
        return LSTMLM(vocab_size, cfg.embed_dim, cfg.hidden_size, cfg.num_layers, cfg.dropout, cfg.tie_embeddings)
    return TransformerLM(vocab_size, cfg.embed_dim, cfg.num_heads, cfg.ffn_dim, cfg.num_layers, cfg.dropout,
                         cfg.tie_embeddings)


def make_lm_batch(sentences: Sequence[Sequence[int]], sos_eos_id: int = SOS_EOS_ID,
                  device: Optional[torch.device] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> ys_in (B, L) ``<sos> y1..yn`` (padded with <sos/eos>) and ys_out (B, L)
    ``y1..yn <eos>`` (padded with IGNORE_ID), L = longest sentence + 1."""
    length = max((len(s) for s in sentences), default=0) + 1
    ys_in = torch.full((len(sentences), length), sos_eos_id, dtype=torch.long)
    ys_out = torch.full((len(sentences), length), IGNORE_ID, dtype=torch.long)
    for b, s in enumerate(sentences):
        ys_in[b, 1:len(s) + 1] = torch.as_tensor(list(s), dtype=torch.long)
        ys_out[b, :len(s)] = ys_in[b, 1:len(s) + 1]
        ys_out[b, len(s)] = sos_eos_id
    return ys_in.to(device), ys_out.to(device)


def sentence_log_likelihood(lm: nn.Module, ys_in: torch.Tensor, ys_out: torch.Tensor) -> torch.Tensor:
    """(B,) sum of ln P(target) over the non-padding targets of ``make_lm_batch`` tensors (float32)."""
    logp = lm.logits(ys_in).float().log_softmax(dim=-1)  # (B, L, V)
    picked = logp.gather(2, ys_out.clamp(min=0).unsqueeze(2)).squeeze(2)  # (B, L)
    return picked.masked_fill(ys_out == IGNORE_ID, 0.0).sum(dim=1)


class NeuralLMState(NamedTuple):
    """Per-hypothesis scorer state (leading dim N)."""

    logp: torch.Tensor  # (N, V) float32 ln P(next token | prefix), cached so score() is a gather
    lm: LMState  # the LM's incremental state after the prefix


class NeuralLMScorer:
    """A neural LM as a batched search scorer (the BatchScorer protocol of asrkit.search, structurally).

    ``score`` is a gather from the cached next-token log-probs; ``select_state`` runs one LM step for
    the M selected rows. Token -1 ("prefix unchanged"), the blank and ``<sos/eos>`` leave a row's
    state exactly as it was (torch.where, not a Python branch: nothing reads tensor values on the host).
    The blank scores 0; ``<sos/eos>`` scores ln P(<eos> | prefix), as does ``final_score``.
    """

    def __init__(self, lm: nn.Module, blank_id: int = BLANK_ID, sos_eos_id: int = SOS_EOS_ID) -> None:
        self.lm = lm.eval()  # dropout off: scores must be deterministic
        self.blank_id, self.sos_eos_id = blank_id, sos_eos_id

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @torch.no_grad()
    def init_state(self, batch: int, beam: int, device: torch.device) -> NeuralLMState:
        """State of N = batch*beam prefixes holding just ``<sos>``."""
        device = torch.device(device)
        if self.device != device:
            self.lm.to(device)
        n = batch * beam
        sos = torch.full((n,), self.sos_eos_id, dtype=torch.long, device=device)
        logits, state = self.lm.step(sos, self.lm.zero_state(n, device), torch.ones(n, dtype=torch.bool, device=device))
        return NeuralLMState(logits.float().log_softmax(dim=-1), state)

    def score(self, state: NeuralLMState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) float32 ln P(token | prefix); 0 for the blank."""
        lp = state.logp.gather(1, tokens.clamp(min=0))
        return torch.where(tokens == self.blank_id, 0.0, lp)

    @torch.no_grad()
    def select_state(self, state: NeuralLMState, index: torch.Tensor, tokens: torch.Tensor) -> NeuralLMState:
        """index (M,) rows of the old state, tokens (M,) appended to them (-1: unchanged) -> state of M rows."""
        logp = state.logp.index_select(0, index)
        rows = tuple(t.index_select(0, index) for t in state.lm)
        grow = (tokens >= 0) & (tokens != self.blank_id) & (tokens != self.sos_eos_id)  # (M,)
        logits, new = self.lm.step(tokens.clamp(min=0), rows, grow)
        return NeuralLMState(torch.where(grow[:, None], logits.float().log_softmax(dim=-1), logp), new)

    def final_score(self, state: NeuralLMState) -> torch.Tensor:
        """(N,) ln P(<eos> | prefix)."""
        return state.logp[:, self.sos_eos_id]

    def max_gain(self) -> Tuple[float, float, bool]:
        """Log-probabilities: nothing to gain (asrkit.search.interfaces.BoundedScorer)."""
        return 0.0, 0.0, False


def load_neural_lm(lm_dir: str | os.PathLike, device: torch.device | str | None = None
                   ) -> Tuple[nn.Module, Tokenizer]:
    """The LM (eval mode, on ``device``, default cpu) and tokenizer of a dir written by ``asrkit train-lm``:
    ``config.yaml``, ``tokenizer.json`` and ``model.pt`` are all it reads."""
    lm_dir = os.fspath(lm_dir)
    cfg_path, weights = os.path.join(lm_dir, "config.yaml"), os.path.join(lm_dir, "model.pt")
    for path in (cfg_path, weights):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found: {lm_dir} is not a trained LM dir ('asrkit train-lm')")
    cfg = load_lm_config(cfg_path)
    tokenizer = load_tokenizer(os.path.join(lm_dir, cfg.tokenizer.path))
    lm = build_lm(cfg.model, tokenizer.vocab_size)
    ckpt = load_checkpoint(weights)  # weights_only, format version checked
    load_weights(lm, ckpt, weights)  # weights of another config: one line naming the file and what differs
    return lm.to(device or "cpu").eval(), tokenizer
