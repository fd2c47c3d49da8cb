"""The WebSocket protocol of ``asrkit serve`` (``/v1/stream``): the messages, checked and built; no I/O.

1. client text ``{"type": "start", "sample_rate": 16000, "format": "s16le" | "f32le"}`` (optional ``chunk_ms``,
   the stream's chunk (default: the server's; the engine checks it against the model), ``name``, and
   ``hotwords``, the stream's own phrases (strings or [phrase, weight] pairs) beside the server's list);
2. server text ``{"type": "ready", "model", "sample_rate", "chunk_ms"}``;
3. client binary frames: raw little-endian PCM, mono, in the announced format and rate, of any size up to the
   server's message limit (a frame may end inside a sample: its bytes wait for the next frame);
4. server text ``{"type": "partial", "text", "start", "end"}`` after each chunk the stream's audio completes
   (``end``: seconds of the stream's audio it heard) and ``{"type": "final", "text", "start", "end", "words",
   "nbest"}`` at each endpoint (words and N-best as ``transcribe --format jsonl`` writes them);
5. client text ``{"type": "end"}``: the server sends the last finals, ``{"type": "done", "result": {...}}`` (the
   JSONL object of the whole stream) and closes with 1000.

A broken rule gets ``{"type": "error", "message"}`` and a close code: :data:`CLOSE_POLICY` (bad JSON, audio
before start, a bad rate or format, authentication), :data:`CLOSE_TOO_BIG`, :data:`CLOSE_TRY_AGAIN` (the server
holds its most streams), :data:`CLOSE_GOING_AWAY` (the stream's longest duration or idle time passed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from asrkit.pipeline.formats import result_to_dict
from asrkit.pipeline.results import Result, Segment
from asrkit.pipeline.streaming import Partial

# message types
START, READY, PARTIAL, FINAL, END, DONE, ERROR = "start", "ready", "partial", "final", "end", "done", "error"
SAMPLE_FORMATS = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
UPLOAD_FORMATS = ("json", "srt", "vtt")  # POST /v1/transcribe?format=
# WebSocket close codes (RFC 6455 section 7.4.1; 1013 from the IANA registry)
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_INTERNAL, CLOSE_TRY_AGAIN = (
    1000, 1001, 1008, 1009, 1011, 1013)
# rates a stream may announce (resampled to the model's); outside them a client has most likely sent a wrong number
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 192000
MAX_NAME_CHARS = 200
MAX_HOTWORDS, MAX_HOTWORD_CHARS = 1000, 100  # a stream's own list: its phrases, each phrase's characters
START_KEYS = ("type", "sample_rate", "format", "chunk_ms", "hotwords", "name")


class ProtocolError(ValueError):
    """A message that breaks the protocol; ``code`` is the WebSocket close code that answers it."""

    def __init__(self, message: str, code: int = CLOSE_POLICY):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class StartMessage:
    sample_rate: int
    format: str  # a key of SAMPLE_FORMATS
    name: Optional[str] = None
    chunk_ms: Optional[int] = None  # None: the server's chunk
    hotwords: Optional["Hotwords"] = None  # None: the server's list


# a stream's hotwords, normalized (spaces collapsed) so that streams of the same list share one recognizer
Hotwords = Tuple[Union[str, Tuple[str, float]], ...]


def parse_message(text: str) -> Dict[str, Any]:
    """A client's text message -> its JSON object, which has a string ``type``; else ProtocolError."""
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"malformed JSON in a text message: {exc.msg} at character {exc.pos}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError('a text message must be a JSON object with a "type" ("start" or "end")')
    return msg


def parse_start(msg: Mapping[str, Any]) -> StartMessage:
    """The start message's settings, checked (whether the model can use a ``chunk_ms`` the engine checks).
    Raises ProtocolError naming the key."""
    if msg.get("type") != START:
        raise ProtocolError(f'the first message must be {{"type": "start", ...}}, got type {msg.get("type")!r}')
    unknown = sorted(set(msg) - set(START_KEYS))
    if unknown:
        raise ProtocolError(f"start message: unknown key {unknown[0]!r} (known: {', '.join(START_KEYS[1:])})")
    rate = msg.get("sample_rate")
    if rate is None:
        raise ProtocolError("start message: sample_rate is missing (the rate of the audio to come, e.g. 16000)")
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise ProtocolError(f"start message: sample_rate must be an integer from {MIN_SAMPLE_RATE} to "
                            f"{MAX_SAMPLE_RATE}, got {rate!r}")
    fmt = msg.get("format", "s16le")
    if fmt not in SAMPLE_FORMATS:
        raise ProtocolError(f"start message: format {fmt!r} is unknown (choose from {', '.join(SAMPLE_FORMATS)})")
    chunk_ms = msg.get("chunk_ms")
    if chunk_ms is not None and (isinstance(chunk_ms, bool) or not isinstance(chunk_ms, int)):
        raise ProtocolError(f"start message: chunk_ms must be an integer number of milliseconds, got {chunk_ms!r}")
    hotwords = parse_hotwords(msg.get("hotwords"))
    name = msg.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
        raise ProtocolError(f"start message: name must be a string of at most {MAX_NAME_CHARS} characters")
    return StartMessage(rate, fmt, name, chunk_ms, hotwords)


def parse_hotwords(value: Any) -> Optional[Hotwords]:
    """A start message's ``hotwords`` (a list of phrases or [phrase, weight] pairs; null or [] for the server's
    list), checked and normalized; whether the model can spell them the engine checks. ProtocolError names the
    item."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ProtocolError(f"start message: hotwords must be a list of phrases, got {type(value).__name__}")
    if len(value) > MAX_HOTWORDS:
        raise ProtocolError(f"start message: hotwords lists {len(value)} phrases, over the limit of {MAX_HOTWORDS}")
    items = []
    for n, item in enumerate(value):
        weight = None
        if isinstance(item, list) and len(item) == 2:
            item, weight = item
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
                raise ProtocolError(f"start message: hotwords[{n}]: the weight must be a number > 0, got {weight!r}")
        if not isinstance(item, str):
            raise ProtocolError(f"start message: hotwords[{n}]: a phrase is a string or a [phrase, weight] pair")
        text = " ".join(item.split())
        if not text or len(text) > MAX_HOTWORD_CHARS:
            raise ProtocolError(f"start message: hotwords[{n}]: a phrase must be a non-empty string of at most "
                                f"{MAX_HOTWORD_CHARS} characters")
        items.append(text if weight is None else (text, float(weight)))
    return tuple(items)


class PcmDecoder:
    """Binary frames of little-endian PCM -> float32 samples in [-1, 1]; a frame's trailing bytes that do not
    make a whole sample are kept and lead the next frame."""

    def __init__(self, fmt: str):
        self.dtype = SAMPLE_FORMATS[fmt]
        self._rest = b""

    def decode(self, data: bytes) -> np.ndarray:
        """The whole samples of the kept bytes + ``data`` (float32, (n,)); ProtocolError on non-finite floats."""
        data = self._rest + data
        whole = len(data) - len(data) % self.dtype.itemsize
        self._rest = data[whole:]
        samples = np.frombuffer(data[:whole], dtype=self.dtype)
        if self.dtype.kind == "i":
            return samples.astype(np.float32) / 32768.0
        if not np.isfinite(samples).all():
            raise ProtocolError("f32le audio holds NaN or infinite samples")
        return samples.astype(np.float32)


def ready_message(model: str, sample_rate: int, chunk_ms: int) -> Dict[str, Any]:
    return {"type": READY, "model": model, "sample_rate": sample_rate, "chunk_ms": chunk_ms}


def partial_message(partial: Partial) -> Dict[str, Any]:
    return {"type": PARTIAL, "text": partial.text, "start": partial.start, "end": partial.end}


def final_message(segment: Segment) -> Dict[str, Any]:
    """One endpoint's segment, its words and N-best as :func:`~asrkit.pipeline.formats.result_to_dict` writes them."""
    d = result_to_dict(Result("", segment.text, segment.words, [segment], segment.nbest))
    times = d["segments"][0]  # type: ignore[index]
    return {"type": FINAL, "text": segment.text, "start": times["start"], "end": times["end"], "words": d["words"],
            "nbest": d["nbest"]}


def done_message(result: Result) -> Dict[str, Any]:
    return {"type": DONE, "result": result_to_dict(result)}


def error_message(message: str) -> Dict[str, Any]:
    return {"type": ERROR, "message": message}
