"""Scorers that meet :class:`asrkit.search.interfaces.BatchScorer`: the length bonus, the word bonus and the
attention-decoder adapter. (The CTC prefix score lives in :mod:`asrkit.search.ctc_prefix_score`;
LM scorers live in :mod:`asrkit.lm`.)
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Protocol, Tuple

import torch

from asrkit.search.interfaces import BLANK_ID, SOS_EOS_ID, GainBound


class LengthBonus:
    """Score 1 per emitted token: weighted by ``beta`` in the search's weights dict, the ``beta * (#tokens)``
    term of shallow fusion. The blank always scores 0. The bonus does not depend on history, so the state is
    just an (N,) zero vector (it gives ``final_score`` its shape)."""

    def max_gain(self) -> GainBound:
        """1 per token and 1 for an <eos> token; never negative."""
        return 1.0, 1.0, True

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch * beam, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens != BLANK_ID).to(torch.get_default_dtype())

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # Shapes are static, so this branch reads no tensor value (no host sync).
        return state if index.shape[0] == state.shape[0] else state.new_zeros(index.shape[0])

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        return state


class WordCount:
    """Score 1 per word, counted as a word LM closes it: weighted by ``beta``, the ``beta * |W|`` word bonus of
    shallow fusion with a word LM (Deep Speech's ``beta * word_count``, ESPnet's and pyctcdecode's bonus).

    ``closes`` (V,) bool: appending the token closes the partial word (a word-boundary token, or <eos>);
    ``opens`` (V,) int: whether a word is being spelled after the token: 1 (a letter, or a boundary with
    letters after the mark, "▁THE"), 0 (a lone boundary "▁"), -1 unchanged (the blank, <eos>, empty
    pieces). :meth:`asrkit.lm.word_ngram.WordNgramScorer.word_marks` gives both, so words are counted exactly
    where that LM scores them. A closing scores 1 only while a word is open, so a leading, trailing or doubled
    boundary scores 0, and ``final_score`` counts the last word: a finished hypothesis has scored its number of
    words. The state is (N,) 1.0 while a word is open, else 0.0.
    """

    def __init__(self, closes: torch.Tensor, opens: torch.Tensor) -> None:
        if closes.dim() != 1 or opens.shape != closes.shape:
            raise ValueError(f"WordCount: closes {tuple(closes.shape)} and opens {tuple(opens.shape)} must be (V,) "
                             f"masks of one vocabulary")
        if not bool(((opens >= -1) & (opens <= 1)).all()):
            raise ValueError(f"WordCount: opens must hold -1, 0 or 1, got {sorted(set(opens.tolist()))}")
        self.closes = closes.to(torch.bool).clone()
        self.opens = opens.to(torch.long).clone()

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        self.closes, self.opens = self.closes.to(device), self.opens.to(device)
        return torch.zeros(batch * beam, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C): 1.0 where the token closes an open word."""
        return self.closes.take(tokens.clamp(min=0)) * state[:, None]  # bool x float: the state's dtype

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); -1 (prefix unchanged) keeps the row's state."""
        old = state.index_select(0, index)
        after = self.opens.take(tokens.clamp(min=0))
        return torch.where((tokens < 0) | (after < 0), old, after)  # the float state's dtype

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        """(N,) 1.0 for the open word the end closes."""
        return state

    def max_gain(self) -> GainBound:
        """At most one word per token and one more that the end closes; never negative."""
        return 1.0, 1.0, True

    def native_form(self) -> Tuple[str, Dict[str, torch.Tensor]]:
        """The tables the native CPU search reads (asrkit.search.interfaces.NativeScorer): kind "word_count"."""
        return "word_count", dict(closes=self.closes, opens=self.opens)


class StepDecoder(Protocol):
    """What :class:`DecoderScorer` needs: an AsrModel with a decoder and the decoders themselves have it."""

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Any = None) -> Tuple[torch.Tensor, Any]:
        """ys (N, L) prefixes starting with <sos>; memory (N, T, D); memory_lens (N,); state for ys[:, :-1]
        (None: from scratch) -> ((N, V) log P(next token | ys), state for ys)."""
        ...


class DecoderScorerState(NamedTuple):
    """Rows are hypotheses (row n = b*beam + k)."""

    ys: torch.Tensor  # (N, L) prefixes: <sos> y_1 .. y_{L-1}
    dec: Any  # the decoder's own incremental state (tensors / tuples / NamedTuples, N on dim 0)
    log_probs: torch.Tensor  # (N, V) log P(next token | ys): score() is a gather
    memory: torch.Tensor  # (N, T, D) encoder output, expanded once; rows never move between utterances
    memory_lens: torch.Tensor  # (N,)


MEMORY_FIELDS = "memory_fields"  # a decoder-state NamedTuple's class attribute naming its memory-only fields


def index_rows(tree: Any, index: torch.Tensor, keep_memory_fields: bool = False) -> Any:
    """Select rows ``index`` (M,) on dim 0 of every tensor of a pytree (tuple, NamedTuple, list, dict).

    ``keep_memory_fields``: leave alone the fields that a NamedTuple lists in its ``memory_fields``
    class attribute (values computed from the encoder memory alone, e.g. its projected keys). That is
    only right when every selected row stays within its utterance and M equals the old row count, as in
    a label-synchronous beam search, where it saves copying (N, T, ...) tensors at every step.
    """
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, index)
    if tree is None:
        return None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        keep = getattr(tree, MEMORY_FIELDS, ()) if keep_memory_fields else ()
        return type(tree)(*(x if name in keep else index_rows(x, index, keep_memory_fields)
                            for name, x in zip(tree._fields, tree)))
    if isinstance(tree, (tuple, list)):
        return type(tree)(index_rows(x, index, keep_memory_fields) for x in tree)
    if isinstance(tree, dict):
        return {k: index_rows(v, index, keep_memory_fields) for k, v in tree.items()}
    raise TypeError(f"decoder state: cannot index a {type(tree).__name__}")


class DecoderScorer:
    """An autoregressive attention decoder as a full scorer of a label-synchronous search.

    decoder: any :class:`StepDecoder`; memory (B, T, D), memory_lens (B,): encoder output.
    ``init_state`` expands the memory to N = B*beam rows and runs the <sos> step; every state
    caches the (N, V) next-token log-probabilities, so ``score`` is a gather and ``select_state``
    runs one ``decode_step`` for the new tokens. The appended token of every row is real
    (label-synchronous search): this scorer does not suit the frame-synchronous CTC search, whose
    ``-1`` ("prefix unchanged") it cannot express. ``final_score`` is log P(<eos> | prefix).
    ``select_state`` must keep each row within its utterance (``index // beam == row // beam``,
    as :func:`asrkit.search.beam_search.beam_search` does): the expanded memory is not re-indexed.
    ``vocab_size`` is known after ``init_state``. Call under ``torch.no_grad()`` in eval mode.
    """

    def __init__(self, decoder: StepDecoder, memory: torch.Tensor, memory_lens: torch.Tensor,
                 sos_id: int = SOS_EOS_ID, eos_id: int = SOS_EOS_ID) -> None:
        if memory.dim() != 3 or memory_lens.shape != memory.shape[:1]:
            raise ValueError(f"memory must be (B, T, D) with lengths (B,), got {tuple(memory.shape)} "
                             f"and {tuple(memory_lens.shape)}")
        self.decoder, self.memory, self.memory_lens = decoder, memory, memory_lens
        self.sos_id, self.eos_id = sos_id, eos_id
        self.vocab_size: Optional[int] = None

    def init_state(self, batch: int, beam: int, device: torch.device) -> DecoderScorerState:
        if batch != self.memory.shape[0]:
            raise ValueError(f"DecoderScorer holds {self.memory.shape[0]} utterances, the search has {batch}")
        memory = self.memory.to(device).repeat_interleave(beam, 0)  # (N, T, D)
        lens = self.memory_lens.to(device).repeat_interleave(beam, 0)
        ys = torch.full((batch * beam, 1), self.sos_id, dtype=torch.long, device=device)
        log_probs, dec = self.decoder.decode_step(ys, memory, lens, None)
        self.vocab_size = log_probs.shape[-1]
        return DecoderScorerState(ys, dec, log_probs, memory, lens)

    def score(self, state: DecoderScorerState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) log P(token | prefix)."""
        return state.log_probs.gather(1, tokens.clamp(min=0))

    def select_state(self, state: DecoderScorerState, index: torch.Tensor,
                     tokens: torch.Tensor) -> DecoderScorerState:
        """Rows ``index`` (M,) extended by ``tokens`` (M,): one decoder step."""
        ys = torch.cat([state.ys.index_select(0, index), tokens.clamp(min=0)[:, None]], dim=1)  # (M, L+1)
        log_probs, dec = self.decoder.decode_step(ys, state.memory, state.memory_lens,
                                                  index_rows(state.dec, index, keep_memory_fields=True))
        return DecoderScorerState(ys, dec, log_probs, state.memory, state.memory_lens)

    def final_score(self, state: DecoderScorerState) -> torch.Tensor:
        """(N,) log P(<eos> | prefix)."""
        return state.log_probs[:, self.eos_id]

    def max_gain(self) -> GainBound:
        """Log-probabilities: nothing to gain."""
        return 0.0, 0.0, False
