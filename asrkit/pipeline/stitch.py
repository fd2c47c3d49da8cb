"""Put the words of separately decoded windows of one recording back together, each word once.

:func:`stitch` takes the windows planned by :func:`asrkit.audio.vad.plan_segments` and the words decoded
in each (times already absolute: seconds from the start of the recording) and keeps a word of window ``i``
when its midpoint lies in that window's ownership interval ``[keep_start, keep_end)``.

Guarantees: the ``keep`` intervals of overlapping windows meet exactly (no gap, no overlap), so each
word is taken from one window only; a word no longer than the overlap whose midpoint is in window ``i``'s
interval lies entirely inside window ``i`` (the seam is the middle of the overlap), so the window that owns
it heard all of it. A word that both windows of a seam recognise with the same text is kept exactly once
even when the two alignments put its midpoint on different sides of the seam: a word is also kept when the
adjacent window has the same word over more than half of its time, and then identical words from different
windows overlapping by more than half of the shorter one are kept once (the more confident copy). The outer
edges of a chain of adjacent windows (the start of a recording, a voice-activity segment boundary) are open:
a word aligned slightly outside its window there is still kept.

Failure cases, which no rule on times alone can settle:

* a word that the owning window misses (or recognises only as a fragment) while the other window got it
  right is lost;
* the two windows may split the audio near a seam differently ("some thing" vs "something"); each piece is
  kept when its midpoint is on its own window's side, so both readings can end up in the output.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from asrkit.audio.vad import Window
from asrkit.pipeline.results import Word

_LOOKBACK = 10.0  # seconds: longer than any word


def _adjacent(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-9)


def _owned(word: Word, i: int, windows: Sequence[Window]) -> bool:
    """Whether window ``i`` owns ``word``: midpoint in ``[keep_start, keep_end)``, where an edge that no
    other window continues is open (nobody else could own a word beyond it)."""
    w = windows[i]
    mid = (word.start + word.end) / 2
    opens_left = i == 0 or not _adjacent(windows[i - 1].keep_end, w.keep_start)
    opens_right = i + 1 == len(windows) or not _adjacent(windows[i + 1].keep_start, w.keep_end)
    return (opens_left or mid >= w.keep_start) and (opens_right or mid < w.keep_end)


def _overlap_fraction(a: Word, b: Word) -> float:
    """Overlap of the two words' times as a fraction of the shorter one's duration."""
    shorter = min(a.end - a.start, b.end - b.start)
    inter = min(a.end, b.end) - max(a.start, b.start)
    if shorter <= 0:
        return 1.0 if inter >= 0 else 0.0  # a zero-length word inside the other
    return inter / shorter


def _same_word(a: Word, b: Word) -> bool:
    """The same word aligned twice: identical text over more than half of the shorter one's time."""
    return a.text == b.text and _overlap_fraction(a, b) > 0.5


def _matched_next_door(word: Word, i: int, windows: Sequence[Window],
                       words_per_window: Sequence[Sequence[Word]]) -> bool:
    """Whether an adjacent window (sharing a seam with window ``i``) recognised the same word: then one
    copy is kept even if neither alignment puts the midpoint on its own side (the duplicate is dropped)."""
    for j in (i - 1, i + 1):
        if not 0 <= j < len(windows):
            continue
        seam = windows[i].keep_start if j < i else windows[i].keep_end
        if not _adjacent(seam, windows[j].keep_end if j < i else windows[j].keep_start):
            continue
        if word.end > windows[j].start and word.start < windows[j].end and \
                any(_same_word(word, other) for other in words_per_window[j]):
            return True
    return False


def stitch(windows: Sequence[Window], words_per_window: Sequence[Sequence[Word]]) -> List[Word]:
    """The words of all windows, each owned by exactly one window, sorted by time (see the module docs).

    ``windows`` in time order (as :func:`~asrkit.audio.vad.plan_segments` returns them); ``words_per_window[i]``
    are the words decoded in ``windows[i]`` with absolute times.
    """
    if len(windows) != len(words_per_window):
        raise ValueError(f"stitch: {len(windows)} windows but {len(words_per_window)} word lists")
    for i in range(1, len(windows)):
        if windows[i].keep_start < windows[i - 1].keep_end - 1e-9:
            raise ValueError(f"stitch: windows {i - 1} and {i} are not in time order or own overlapping "
                             f"intervals: {windows[i - 1]} / {windows[i]}")
    kept: List[Tuple[Word, int]] = [(word, i) for i, words in enumerate(words_per_window)
                                    for word in words if _owned(word, i, windows)
                                    or _matched_next_door(word, i, windows, words_per_window)]
    kept.sort(key=lambda item: (item[0].start, item[0].end))
    out: List[Tuple[Word, int]] = []
    for word, i in kept:
        # A copy starts at most _LOOKBACK seconds earlier: a short look back over the kept words.
        k = len(out) - 1
        duplicate = False
        while k >= 0 and out[k][0].start > word.start - _LOOKBACK:
            other, j = out[k]
            if j != i and _same_word(other, word):
                duplicate = True
                if word.confidence > other.confidence:
                    out[k] = (word, i)
                break
            k -= 1
        if not duplicate:
            out.append((word, i))
    out.sort(key=lambda item: (item[0].start, item[0].end))  # a more confident copy may start earlier
    return [word for word, _ in out]
