"""Word times and confidences from a CTC forced alignment of a hypothesis.

The hypothesis' tokens are aligned to the CTC posteriors of its segment with torchaudio's ``forced_align``
(the best CTC path that emits exactly these tokens; for greedy search that is the greedy path itself) and
merged into token spans (``merge_tokens``). Tokens are grouped into words at word-boundary pieces (a
piece that starts with ``▁``: the char tokenizer's space token, or sentencepiece's word-initial pieces);
the boundary token of the char tokenizer belongs to no word.

* ``start``: the first frame of the word's first token; ``end``: the end of its last token's span
  (exclusive frame). Frames become seconds as ``offset + frame * frame_shift``, ``frame_shift`` being
  the seconds per encoder frame (feature hop x subsampling), ``offset`` the segment's start in the input.
* ``confidence``: token confidence ``c_t`` = mean over the frames of its span of ``P_ctc(token | frame)``;
  word confidence = the geometric mean of its tokens' ``c_t``, ``exp(mean_t log c_t)``, in [0, 1].
  A word is as sure as its tokens together, without the product's bias against long words.

CTC emits a token on one or two frames somewhere inside its sound, typically late at a word's start and early
at its end (by up to a few frames of 40 ms). :func:`snap_to_speech` widens each word to the speech around it,
as the voice-activity detector sees it: the end moves on to where the speech stops, the start back to where
it starts, but never past the middle of the gap to the neighbouring word (so words never overlap) and never
inward. On words separated by silence this puts both ends within a frame or two of the sound's own
boundaries (tested to 0.1 s); inside connected speech a boundary settles in the middle between the words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, List, Sequence

import numpy as np
import torch
from torchaudio.functional import forced_align, merge_tokens

from asrkit.pipeline.results import Word
from asrkit.text.tokenizer import WORD_MARK


@dataclass(frozen=True)
class TokenTime:
    """A token of a hypothesis with its span in the input (seconds) and its confidence ``c_t``."""

    token: int
    start: float
    end: float
    confidence: float


def align_tokens(log_probs: torch.Tensor, tokens: Sequence[int], frame_shift: float, offset: float = 0.0,
                 blank: int = 0) -> List[TokenTime]:
    """Spans of ``tokens`` in ``log_probs`` (T, V) by CTC forced alignment (times in seconds).

    Raises ValueError when the tokens cannot be aligned (more tokens than the frames allow) or name an id
    outside the vocabulary or the blank.
    """
    if not tokens:
        return []
    num_frames, vocab = log_probs.shape
    bad = [t for t in tokens if not 0 <= t < vocab or t == blank]
    if bad:
        raise ValueError(f"token ids {bad[:5]} are not emittable ids of a {vocab}-token CTC output (blank {blank})")
    repeats = sum(a == b for a, b in zip(tokens, tokens[1:]))
    if len(tokens) + repeats > num_frames:
        raise ValueError(f"{len(tokens)} tokens ({repeats} repeats) cannot be aligned to {num_frames} frames")
    target = torch.tensor([list(tokens)], dtype=torch.int32)
    path, scores = forced_align(log_probs.detach().float().cpu()[None], target, blank=blank)
    spans = merge_tokens(path[0], scores[0].exp(), blank=blank)  # span.score: mean P over the span's frames
    return [TokenTime(t, offset + s.start * frame_shift, offset + s.end * frame_shift, float(s.score))
            for t, s in zip(tokens, spans)]


def group_words(token_times: Sequence[TokenTime], pieces: Sequence[str],
                decode: Callable[[List[int]], str]) -> List[Word]:
    """Tokens -> words at word-boundary pieces (see the module docstring), with times and confidences."""
    words: List[Word] = []
    group: List[TokenTime] = []

    def close() -> None:
        text = decode([t.token for t in group]) if group else ""
        if text:
            logc = sum(math.log(max(t.confidence, 1e-30)) for t in group) / len(group)
            words.append(Word(text, round(group[0].start, 3), round(group[-1].end, 3), round(math.exp(logc), 4)))
        group.clear()

    for t in token_times:
        piece = pieces[t.token]
        if piece.startswith(WORD_MARK):
            close()
            if piece == WORD_MARK:  # a bare boundary token belongs to no word
                continue
        group.append(t)
    close()
    return words


def align_words(log_probs: torch.Tensor, tokens: Sequence[int], pieces: Sequence[str],
                decode: Callable[[List[int]], str], frame_shift: float, offset: float = 0.0,
                blank: int = 0) -> List[Word]:
    """Words of ``tokens`` with times (seconds) and confidences, aligned to ``log_probs`` (T, V).

    ``pieces``: the tokenizer's piece of every token id (``tokenizer.token_list``); ``decode``: token ids
    -> text (the tokenizer's). Returns [] for an empty hypothesis.
    """
    if len(pieces) != log_probs.shape[-1]:
        raise ValueError(f"{len(pieces)} token pieces for {log_probs.shape[-1]} CTC outputs")
    return group_words(align_tokens(log_probs, tokens, frame_shift, offset, blank), pieces, decode)


def snap_to_speech(words: Sequence[Word], speech: np.ndarray, hop: float, offset: float = 0.0,
                   bridge: float = 0.1) -> List[Word]:
    """Widen each word to the speech around it (see the module docstring).

    ``speech``: (N,) booleans, one per ``hop`` seconds from ``offset`` (the segment's voice-activity frames);
    word times are seconds in the whole input, sorted and not overlapping. Quiet stretches shorter than
    ``bridge`` seconds inside the speech (the closure before a final stop, as in "white") are crossed.
    """
    n = len(speech)
    gap = max(1, int(round(bridge / hop)))
    # speech[i] or speech again within ``gap`` frames on both sides: short closures filled
    filled = speech.copy()
    idx = np.flatnonzero(speech)
    if len(idx):
        jumps = np.flatnonzero((np.diff(idx) > 1) & (np.diff(idx) <= gap + 1))
        for j in jumps:
            filled[idx[j]: idx[j + 1]] = True
    speech = filled
    end_of_audio = offset + n * hop
    out: List[Word] = []
    for k, w in enumerate(words):
        lo = offset if k == 0 else (words[k - 1].end + w.start) / 2
        hi = end_of_audio if k + 1 == len(words) else (w.end + words[k + 1].start) / 2
        first = int(math.floor((w.start - offset) / hop))  # the frame holding the start
        while 0 < first <= n and speech[first - 1]:
            first -= 1
        last = int(math.ceil((w.end - offset) / hop))  # the first frame after the word
        while 0 <= last < n and speech[last]:
            last += 1
        start = max(lo, min(w.start, offset + first * hop))
        end = min(hi, max(w.end, offset + last * hop))
        out.append(replace(w, start=round(start, 3), end=round(end, 3)))
    return out
