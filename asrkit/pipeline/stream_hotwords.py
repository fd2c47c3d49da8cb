"""The hotword lists of a recognizer's live streams: streams with different lists in one batch.

Every stream of a :class:`~asrkit.pipeline.streaming.StreamingRecognizer` is searched by the same
:class:`~asrkit.search.streaming.StreamingCtcSearch`, whose hotword scorer is a
:class:`~asrkit.search.hotwords.HotwordUnion`: the lists in use as one automaton, each stream started in its own
list's states (list 0: none; the server's list, ``decode.hotwords`` and ``load_model(hotwords=...)``, is the default).
A stream's own list (``create_stream(hotwords=...)``) is ``decode.hotwords``'s phrases and its own, compiled once
per content; a new list is appended to the union (the live streams go on). When a list joins and the lists no
live stream uses hold more than half the union's states, the union is compacted to the lists in use (the torch
loop's live states are moved to their lists' new ids; a native stream keeps the tables it was made with).

A search whose words are bounded (a word LM or ``decode.lexicon``) adds each list's words outside them to its
lexicon, which one shared search cannot do per stream: there :func:`unshared_reason` says why, and a stream's own
list needs a recognizer of its own (``streaming_recognizer(hotwords=...)``).
"""
from __future__ import annotations

from typing import Collection, Dict, Optional, Sequence, Tuple

import torch

from asrkit.pipeline.searcher import Searcher, load_hotwords
from asrkit.search.hotwords import HOTWORDS, HotwordUnion, PhraseSpec

# A compaction runs when the lists no live stream uses hold more than this share of the union's states.
DEAD_SHARE = 0.5


def unshared_reason(searcher: Searcher) -> Optional[str]:
    """Why the streams of ``searcher``'s recognizer cannot each carry a list in one batch (None: they can)."""
    if searcher.cfg.mode == "greedy":
        return "hotwords bias a beam search, but decode.mode is greedy"
    if searcher.cfg.hotword_weight == 0:
        return "decode.hotword_weight is 0 (hotwords off)"
    if searcher.bounds_words:
        return ("a word LM or decode.lexicon bounds the words (a list's words outside them join the lexicon, once per "
                "search): give the stream a recognizer of its own, streaming_recognizer(hotwords=...)")
    return None


class StreamHotwords:
    """The union of the lists of one recognizer's streams (see the module docstring)."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.union = HotwordUnion(len(searcher.tokenizer.token_list))
        self.default = 0 if searcher.hotwords is None else self.union.add(searcher.hotwords)
        self._lists: Dict[Tuple[object, ...], int] = {}  # a stream's phrases -> their list (cached by content)

    def fusion(self) -> tuple:
        """The searcher's scorers and weights with the union as the hotword scorer."""
        scorers, weights = self.searcher.fusion()
        scorers[HOTWORDS], weights[HOTWORDS] = self.union.scorer, self.searcher.cfg.hotword_weight
        return scorers, weights

    def list_of(self, phrases: Sequence[PhraseSpec]) -> int:
        """The list index of a stream's own ``phrases`` (beside ``decode.hotwords``'s), added if new; ConfigError
        for a list the model's units cannot spell."""
        key = tuple(phrases)
        index = self._lists.get(key)
        if index is None:
            scorer = load_hotwords(self.searcher.cfg, self.searcher.tokenizer, list(phrases))
            assert scorer is not None
            index = self._lists[key] = self.union.add(scorer)
        return index

    def compact_if_sparse(self, in_use: Collection[int]) -> Optional[Tuple[Dict[int, int], torch.Tensor]]:
        """Compact the union to the lists ``in_use`` (and the default) when the others hold more than
        :data:`DEAD_SHARE` of its states; returns (old -> new list index, old -> new state id) as
        :meth:`HotwordUnion.compact`, or None when nothing was done."""
        keep = set(in_use) | {0, self.default}
        if self.union.states_outside(keep) <= DEAD_SHARE * self.union.states:
            return None
        moved, state_map = self.union.compact(keep)
        self.default = moved[self.default]
        self._lists = {k: moved[i] for k, i in self._lists.items() if i in moved}
        return moved, state_map
