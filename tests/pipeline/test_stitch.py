"""asrkit.pipeline.stitch: words decoded in overlapping windows come back each exactly once, in time order.

The windows "recognise" a known word sequence the way a decoder would: every word entirely inside the
window's span, with its own small timing jitter, plus the cut-off fragments of the words crossing its edges.
"""
from __future__ import annotations

import numpy as np
import pytest

from asrkit.audio.vad import VadConfig, Window, fixed_windows, speech_segments
from asrkit.pipeline.results import Word
from asrkit.pipeline.stitch import stitch

JITTER = 0.03  # seconds: the same word aligned in two windows differs by up to this much


def truth_words(duration: float, seed: int, max_len: float):
    """Words of 0.1..max_len s separated by 0..0.3 s, named by their index."""
    rng = np.random.default_rng(seed)
    words, t = [], float(rng.uniform(0, 0.3))
    while True:
        d = float(rng.uniform(0.1, max_len))
        if t + d > duration:
            return words
        words.append(Word(f"w{len(words)}", t, t + d, 0.9))
        t += d + float(rng.uniform(0.0, 0.3))


def recognise(windows, words, seed: int):
    """What each window decodes: the words entirely inside its span (jittered inside it) and a fragment,
    clipped to the span, of each word crossing its edges."""
    rng = np.random.default_rng(seed)
    out = []
    for w in windows:
        got = []
        for word in words:
            if word.start >= w.start and word.end <= w.end:
                j = rng.uniform(-JITTER, JITTER, 2)
                s = min(max(w.start, word.start + j[0]), word.end - 0.05)
                e = max(min(w.end, word.end + j[1]), s + 0.05)
                got.append(Word(word.text, s, e, float(rng.uniform(0.5, 1.0))))
            elif word.start < w.end and word.end > w.start:  # cut by the window edge
                got.append(Word(word.text + "-", max(w.start, word.start), min(w.end, word.end), 0.3))
        rng.shuffle(got)  # stitch sorts; the decoder's order is not relied on
        out.append(got)
    return out


def check_each_word_once(windows, words, seed):
    got = stitch(windows, recognise(windows, words, seed))
    assert [w.text for w in got] == [w.text for w in words]
    for g, t in zip(got, words):
        assert abs(g.start - t.start) <= JITTER + 1e-9 and abs(g.end - t.end) <= JITTER + 1e-9
    assert all(a.start <= b.start for a, b in zip(got, got[1:]))


@pytest.mark.parametrize("seed", range(5))
def test_words_across_fixed_window_seams_are_neither_lost_nor_doubled(seed):
    overlap = 2.0
    windows = fixed_windows(61.3, 10.0, overlap)
    # Words up to the overlap long: one centred on a seam still lies inside the window that owns it;
    # ownership by start time instead of midpoint would lose the long ones.
    # (less a margin for the jitter)
    words = truth_words(61.3, seed, max_len=overlap - 4 * JITTER)
    assert len(words) > 40
    check_each_word_once(windows, words, seed)


def test_words_across_a_plan_that_mixes_cuts_and_windows():
    # Frame energies of one 60 s region: loud, with short pauses (cut points) only in its first 15 s.
    hop = 0.01
    energies = np.full(6200, -20.0)
    energies[:100] = energies[-100:] = -90.0
    for pause in (3.0, 7.0, 11.0):
        energies[int(pause / hop):int((pause + 0.15) / hop)] = -90.0
    windows = speech_segments(energies, hop, VadConfig(max_segment=10.0, min_silence=0.3))
    assert any(w.fixed for w in windows) and any(not w.fixed for w in windows)
    # the cuts lie in the pauses: no word is said across them
    words = [w for w in truth_words(62.0, 7, max_len=1.8) if w.start >= windows[0].start and w.end <= windows[-1].end
             and not any(w.start < p + 0.15 and w.end > p for p in (3.0, 7.0, 11.0))]
    check_each_word_once(windows, words, 7)


def test_identical_words_overlapping_across_a_seam_are_kept_once():
    a, b = Window(0.0, 10.0, 0.0, 9.0), Window(8.0, 18.0, 9.0, 18.0)
    # The same word aligned a little differently on either side of the seam at 9.0: midpoints 8.95 and 9.05.
    left = [Word("seam", 8.7, 9.2, 0.6), Word("left", 5.0, 5.4, 0.9)]
    right = [Word("seam", 8.8, 9.3, 0.8), Word("right", 12.0, 12.5, 0.9)]
    got = stitch([a, b], [left, right])
    assert [w.text for w in got] == ["left", "seam", "right"]
    assert got[1] == right[0]  # the more confident copy
    # Aligned so that neither copy's midpoint is on its own window's side (9.02 in a, 8.98 in b): kept once.
    crossed = stitch([a, b], [[Word("seam", 8.77, 9.27, 0.6)], [Word("seam", 8.73, 9.23, 0.7)]])
    assert crossed == [Word("seam", 8.73, 9.23, 0.7)]
    # A word really said twice ("that that") overlaps its neighbour by less than half: both kept.
    twice = stitch([a, b], [[Word("that", 8.5, 8.95, 0.9)], [Word("that", 8.9, 9.4, 0.9)]])
    assert [w.text for w in twice] == ["that", "that"]
    # The documented failure: split differently on the two sides, both pieces are kept.
    split = stitch([a, b], [[Word("some", 8.6, 8.95, 0.9)], [Word("something", 8.7, 9.5, 0.9)]])
    assert [w.text for w in split] == ["some", "something"]


def test_voice_activity_segments_keep_words_at_their_open_edges():
    # Two separate segments (a silence between them): nobody else can own a word aligned a little
    # outside a segment, so it is kept; between adjacent windows the boundary decides.
    windows = [Window(1.0, 4.0, 1.0, 4.0), Window(6.0, 9.0, 6.0, 9.0)]
    words = [[Word("b", 2.0, 3.0, 0.9), Word("a", 0.9, 1.05, 0.9), Word("c", 3.98, 4.1, 0.9)],
             [Word("d", 6.0, 6.4, 0.9), Word("e", 8.9, 9.2, 0.9)]]
    assert [w.text for w in stitch(windows, words)] == ["a", "b", "c", "d", "e"]
    adjacent = [Window(1.0, 4.0, 1.0, 4.0), Window(4.0, 7.0, 4.0, 7.0)]
    got = stitch(adjacent, [[Word("x", 3.9, 4.3, 0.9), Word("w", 3.5, 3.9, 0.9)],
                            [Word("y", 3.9, 4.3, 0.8), Word("z", 3.5, 4.1, 0.9)]])
    assert [w.text for w in got] == ["w", "y"]  # midpoints 4.1 (x, y) belong to the second, 3.8 (z) to the first


def test_no_windows_and_mismatched_inputs():
    assert stitch([], []) == []
    with pytest.raises(ValueError, match="2 windows but 1 word lists"):
        stitch(fixed_windows(30.0, 20.0, 2.0), [[]])
    with pytest.raises(ValueError, match="time order"):
        stitch(list(reversed(fixed_windows(30.0, 20.0, 2.0))), [[], []])
