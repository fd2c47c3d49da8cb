"""What transcription returns: words with times and confidence, segments, N-best, per input.

Times are seconds from the start of the whole input (a segment of a long recording keeps its offset).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds in the whole input
    end: float  # seconds, > start
    confidence: float  # in [0, 1]; see asrkit.pipeline.words for the formula


@dataclass(frozen=True)
class Alternative:
    """One hypothesis of a segment's N-best list."""

    text: str
    score: float  # the search's total score (log domain)
    ctc_score: float = 0.0  # log P_ctc of the tokens (0 where the model has no CTC head)


@dataclass
class Segment:
    """A stretch of the input decoded as one utterance (a voice-activity segment or a window)."""

    start: float
    end: float
    text: str
    words: List[Word] = field(default_factory=list)
    nbest: List[Alternative] = field(default_factory=list)  # best first; nbest[0].text == text


@dataclass
class Result:
    """The transcription of one input (a file, a wav.scp entry or a waveform).

    ``nbest``: the input's N-best list when it was decoded as one segment; for an input split into several
    segments each segment has its own (``segments[i].nbest``) and this holds the 1-best alone.
    ``error``: why the input could not be transcribed (then text is empty); None on success.
    """

    name: str
    text: str
    words: List[Word] = field(default_factory=list)
    segments: List[Segment] = field(default_factory=list)
    nbest: List[Alternative] = field(default_factory=list)
    duration: float = 0.0  # seconds of audio
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
