"""Audio for the serving tests: tones a tone-detecting model hears as "C", and PCM bytes as clients send them."""
from __future__ import annotations

import numpy as np

from tests.pipeline.streaming_exp import tone_stream

SR = 16000
CHUNK_MS = 320


def tones(n: int = 2) -> np.ndarray:
    """``n`` tones (0.6 s) between quiet stretches (1.0 s): n utterances of "C", float32 at 16 kHz."""
    parts = [("quiet", 0.3)]
    for _ in range(n):
        parts += [("tone", 0.6), ("quiet", 1.0)]
    return tone_stream(parts)[0]


def s16le(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1 - 1 / 32768) * 32768).astype("<i2").tobytes()


def from_s16le(data: bytes) -> np.ndarray:
    """What the server hears of :func:`s16le` bytes."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
