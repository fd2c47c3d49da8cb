"""Language models for decoding: back-off n-grams from ARPA files (scores in natural log).

* :func:`load_ngram` / :class:`NgramLM` — ARPA (plain or gzip) -> device tensors with batched back-off lookup.
* :class:`NgramScorer` — the LM's words are the tokenizer's tokens (``--units token``).
* :class:`WordNgramScorer` — a word LM applied at the word boundaries ("▁", "|" or " ") of char/BPE tokens.
* :func:`ngram_scorer` — pick and build one of the two from a path.
* :class:`LSTMLM` / :class:`TransformerLM` (``asrkit train-lm``), :func:`load_neural_lm` and :class:`NeuralLMScorer`.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import torch

from asrkit.lm.arpa import ArpaError, ArpaLM, read_arpa
from asrkit.lm.ngram import (DENSE_MAX_ENTRIES, LN10, NgramLM, NgramScorer, NgramState, NgramStates, UnitsError,
                             load_ngram)
from asrkit.lm.neural import (LSTMLM, NeuralLMScorer, NeuralLMState, TransformerLM, build_lm, load_neural_lm,
                              make_lm_batch, sentence_log_likelihood)
from asrkit.lm.word_ngram import BOUNDARY_MARKS, DEFAULT_UNK_OFFSET, WordNgramScorer, WordNgramState

__all__ = ["ArpaError", "ArpaLM", "read_arpa", "LN10", "NgramLM", "NgramScorer", "NgramState", "NgramStates",
           "UnitsError", "load_ngram", "BOUNDARY_MARKS", "DEFAULT_UNK_OFFSET", "WordNgramScorer", "WordNgramState", "ngram_scorer",
           "LSTMLM", "TransformerLM",
           "NeuralLMScorer", "NeuralLMState", "build_lm", "load_neural_lm", "make_lm_batch", "sentence_log_likelihood"]


def ngram_scorer(lm: Union[str, os.PathLike, NgramLM], token_list: Sequence[str], units: str = "token",
                 device: torch.device | str | None = None, lookahead: bool = True,
                 blank_id: int = 0, unk_id: Optional[int] = None, sos_eos_id: Optional[int] = None,
                 unk_offset: float = DEFAULT_UNK_OFFSET, dense: Optional[bool] = None,
                 dense_max_entries: int = DENSE_MAX_ENTRIES,
                 word_boundary: Optional[str] = None,
                 lexicon: Optional[Sequence[str]] = None) -> Union[NgramScorer, WordNgramScorer]:
    """Build the search scorer for an n-gram LM.

    ``units="token"``: the ARPA's words are the tokenizer's tokens; ``units="word"``: the ARPA is a
    word LM scored at word boundaries (``lookahead``, ``unk_offset``, ``word_boundary`` and ``lexicon``
    are WordNgramScorer's options; ``dense`` and ``dense_max_entries`` are NgramScorer's: dense tables or the
    lookup path). ``unk_id``/``sos_eos_id`` None: found by name in ``token_list`` (``<unk>``,
    ``<sos/eos>``); given ids are checked against it.
    """
    if not isinstance(lm, NgramLM):
        lm = load_ngram(lm, device=device)
    elif device is not None:
        lm.to(device)
    if units == "token":
        if lexicon is not None or word_boundary is not None:
            raise ValueError("lexicon and word_boundary need a word LM (units='word'); for a token LM fuse "
                             "asrkit.search.lexicon.LexiconScorer beside it")
        return NgramScorer(lm, token_list, blank_id=blank_id, sos_eos_id=sos_eos_id, dense=dense,
                           dense_max_entries=dense_max_entries)
    if units == "word":
        return WordNgramScorer(lm, token_list, lookahead=lookahead, blank_id=blank_id, unk_id=unk_id,
                               sos_eos_id=sos_eos_id, unk_offset=unk_offset, word_boundary=word_boundary,
                               lexicon=lexicon)
    raise ValueError(f"n-gram units must be 'token' or 'word', got '{units}'")
