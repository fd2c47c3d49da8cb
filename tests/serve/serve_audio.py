"""Audio for the serving tests: tones a tone-detecting model hears as "C", PCM bytes as clients send them, and a
comparison of results to rounding, a wait for closed streams to be let go, and the WebSocket steps the per-stream
option tests share (start, finish, the stream API's result to compare with)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from starlette.websockets import WebSocketDisconnect

from tests.pipeline.streaming_exp import tone_stream

SR = 16000
CHUNK_MS = 320


def wait_no_streams(client, timeout: float = 10.0) -> None:
    """Wait until the server holds no stream (a closed socket's session is let go on the server's loop, after the
    client returned)."""
    deadline = time.monotonic() + timeout
    while "asrkit_streams_live 0\n" not in client.get("/metrics").text:
        assert time.monotonic() < deadline, "the closed streams were not let go"
        time.sleep(0.01)


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


def same_json(a, b, tol: float = 1e-4) -> bool:
    """JSON values equal but for floats, which may differ by ``tol`` (a stream batched with others: its scores to
    rounding, as a batch pads its rows)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_json(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


def reference(model, audio: np.ndarray, **options) -> dict:
    """What the stream API gives for ``audio`` with the stream options (``chunk_ms``, ``hotwords``)."""
    from asrkit.pipeline.formats import result_to_dict

    s = model.stream("mic", **options)
    s.accept_waveform(audio)
    return result_to_dict(s.finish())


def start(ws, **keys) -> dict:
    """Send a start message (the stream named "mic") and return the server's answer."""
    ws.send_json({"type": "start", "sample_rate": SR, "name": "mic", **keys})
    return ws.receive_json()


def finish(ws) -> list:
    """Send the end message; the messages up to the done message."""
    ws.send_json({"type": "end"})
    messages = []
    while not messages or messages[-1]["type"] != "done":
        messages.append(ws.receive_json())
    return messages


def refused(ws, **keys) -> tuple:
    """A start message the server refuses: (its error message, the close code)."""
    ws.send_json({"type": "start", "sample_rate": SR, **keys})
    message = ws.receive_json()
    with pytest.raises(WebSocketDisconnect) as exc:
        ws.receive_json()
    return message, exc.value.code
