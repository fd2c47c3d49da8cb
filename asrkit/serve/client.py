"""A client of ``asrkit serve``: a recording sent over ``WS /v1/stream`` as if it were live (at real time, or
``rate`` times faster), the partials and finals collected with their latencies; and an upload to
``POST /v1/transcribe``. Used by ``asrkit stream-client``, the tests and the load test (tools/bench/bench_serve.py).

Latency, as a user would feel it: a **partial**'s is the time from sending the WebSocket frame that held the last
sample its chunks needed (the partial's ``end``, seconds of the stream) to receiving it; a **final**'s the time
from sending the frame that held its utterance's last sample (its ``end``), or from the end message for the
finals the end of the input closes, to receiving it.
"""
from __future__ import annotations

import asyncio
import bisect
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from asrkit.extras import require

FORMATS = ("s16le", "f32le")
DEFAULT_FRAME_MS = 100  # audio per WebSocket frame: a browser's worklet sends pieces about this size
Message = Dict[str, Any]


@dataclass
class StreamOutcome:
    """What one stream got back. ``partials`` / ``finals``: the server's messages in order; ``*_latency``:
    seconds, one per partial (whose ``end`` names its audio) and per final; ``result``: the ``done`` message's
    result (``transcribe --format jsonl``'s object), None when the stream did not end normally; ``error``: the
    server's error message or the connection's close reason; ``close_code``: the WebSocket close code."""

    name: str
    model: str = ""
    chunk_ms: int = 0
    audio_seconds: float = 0.0  # audio sent
    partials: List[Message] = field(default_factory=list)
    finals: List[Message] = field(default_factory=list)
    partial_latency: List[float] = field(default_factory=list)
    final_latency: List[float] = field(default_factory=list)
    result: Optional[Message] = None
    error: Optional[str] = None
    close_code: Optional[int] = None

    @property
    def text(self) -> str:
        """The final transcript (empty without a result)."""
        return str(self.result.get("text", "")) if self.result else ""


def to_pcm(samples: np.ndarray, fmt: str = "s16le") -> bytes:
    """Float samples in [-1, 1] -> little-endian PCM bytes: ``s16le`` (x 32768, rounded, clipped) or ``f32le``."""
    x = np.asarray(samples, dtype=np.float32)
    if fmt == "f32le":
        return x.astype("<f4").tobytes()
    if fmt == "s16le":
        return np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2").tobytes()
    raise ValueError(f"sample format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def read_audio(path: str, sample_rate: int = 16000) -> np.ndarray:
    """A recording (any format ``transcribe`` reads) as mono float32 samples at ``sample_rate``."""
    from asrkit.audio.io import load_audio  # torch and soundfile: only when a file is read
    return load_audio(path, sample_rate, name=path, pipe=False).numpy()


class _Timeline:
    """When each sent frame left (its cumulative end in samples), to find the frame that held a given sample."""

    def __init__(self, sample_rate: int):
        self.rate = sample_rate
        self.ends: List[int] = []
        self.times: List[float] = []
        self.end_message: Optional[float] = None

    def sent(self, end: int, t: float) -> None:
        self.ends.append(end)
        self.times.append(t)

    def latency(self, seconds: float, received: float) -> Optional[float]:
        """``received`` minus the send time of the frame holding the sample at ``seconds`` (the server may round
        times to the millisecond: half a millisecond is allowed), or of the end message past the last frame."""
        target = seconds * self.rate - 0.0005 * self.rate
        i = bisect.bisect_left(self.ends, target)
        if i < len(self.ends):
            return received - self.times[i]
        return None if self.end_message is None else received - self.end_message


def _close_info(ws: Any) -> tuple:
    return ws.close_code, (ws.close_reason or None)


async def stream_audio(url: str, samples: np.ndarray, *, sample_rate: int = 16000, rate: float = 1.0,
                       frame_ms: int = DEFAULT_FRAME_MS, fmt: str = "s16le", token: Optional[str] = None,
                       name: Optional[str] = None, chunk_ms: Optional[int] = None,
                       hotwords: Optional[Sequence[str]] = None, stop_after: Optional[float] = None,
                       abort: bool = False, on_message: Optional[Callable[[Message], None]] = None,
                       sent: Optional[asyncio.Event] = None, timeout: float = 60.0) -> StreamOutcome:
    """Send ``samples`` (mono float32 at ``sample_rate``) as one stream to ``url`` (``ws://host:port/v1/stream``)
    in ``frame_ms`` frames, each sent when it would have been recorded divided by ``rate`` (0: as fast as
    possible), then the end message; collect what comes back until ``done`` and the close.
    ``stop_after``: seconds of audio after which the client leaves without an end message (closing the
    connection, or with ``abort`` dropping it unclosed); ``on_message``: called with each server message;
    ``sent``: set once the audio and the end message are sent, or the stream failed (a load generator starts its
    next stream then); ``timeout``: seconds to wait for the connection, for ``ready`` and for ``done`` after the
    end message."""
    require("websockets", "the stream client (asrkit.serve.client)")
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    if rate < 0:
        raise ValueError(f"rate must be >= 0 (0: as fast as possible), got {rate}")
    if frame_ms <= 0:
        raise ValueError(f"frame_ms must be > 0, got {frame_ms}")
    pcm = to_pcm(samples, fmt)
    width = 2 if fmt == "s16le" else 4
    frame = max(1, int(round(sample_rate * frame_ms / 1000.0)))
    total = len(samples) if stop_after is None else min(len(samples), int(round(stop_after * sample_rate)))
    out = StreamOutcome(name or "stream")
    timeline = _Timeline(sample_rate)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    start: Message = {"type": "start", "sample_rate": sample_rate, "format": fmt}
    for key, value in (("chunk_ms", chunk_ms), ("name", name), ("hotwords", list(hotwords or []) or None)):
        if value is not None:
            start[key] = value

    def handle(msg: Message, received: float) -> None:
        kind = msg.get("type")
        if kind == "partial":
            out.partials.append(msg)
            if "end" in msg:
                lat = timeline.latency(float(msg["end"]), received)
                if lat is not None:
                    out.partial_latency.append(lat)
        elif kind == "final":
            out.finals.append(msg)
            closes_input = timeline.end_message is not None and float(msg.get("end", 0.0)) >= out.audio_seconds - 1e-3
            lat = (received - timeline.end_message if closes_input and timeline.end_message is not None
                   else timeline.latency(float(msg.get("end", 0.0)), received))
            if lat is not None:
                out.final_latency.append(lat)
        elif kind == "done":
            out.result = msg.get("result")
        elif kind == "error":
            out.error = str(msg.get("message", ""))
        if on_message is not None:
            on_message(msg)

    async def receive(ws: Any) -> None:
        try:
            async for raw in ws:
                if isinstance(raw, str):
                    handle(json.loads(raw), time.perf_counter())
        except ConnectionClosed:  # closed with an error code: the caller reads it
            pass

    async def send(ws: Any) -> None:
        t0 = time.perf_counter()
        for i, begin in enumerate(range(0, total, frame)):
            end = min(total, begin + frame)
            if rate > 0:
                delay = t0 + end / sample_rate / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await ws.send(pcm[begin * width: end * width])
            timeline.sent(end, time.perf_counter())
            out.audio_seconds = end / sample_rate
            if rate == 0 and i % 16 == 15:
                await asyncio.sleep(0)  # let the receiver take what came back

    try:
        async with connect(url, additional_headers=headers, open_timeout=timeout, max_size=None,
                           close_timeout=5) as ws:
            try:
                await ws.send(json.dumps(start))
            except ConnectionClosed:  # refused at once (a wrong token): the server's message is read below
                pass
            try:
                ready = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            except ConnectionClosed:
                ready = {}
            if ready.get("type") != "ready":
                if ready:
                    handle(ready, time.perf_counter())
                await asyncio.wait_for(receive(ws), timeout)
                out.close_code, reason = _close_info(ws)
                out.error = out.error or reason or f"no ready message (got {ready.get('type')!r})"
                return out
            out.model, out.chunk_ms = str(ready.get("model", "")), int(ready.get("chunk_ms", 0))
            if on_message is not None:
                on_message(ready)
            receiver = asyncio.create_task(receive(ws))
            try:
                await send(ws)
                if stop_after is not None:  # leave mid-utterance
                    if abort:
                        ws.transport.abort()
                    else:
                        await ws.close()
                    receiver.cancel()
                    return out
                await ws.send(json.dumps({"type": "end"}))
                timeline.end_message = time.perf_counter()
                if sent is not None:
                    sent.set()
                await asyncio.wait_for(receiver, timeout)
            except ConnectionClosed:
                await asyncio.gather(receiver, return_exceptions=True)
            finally:
                if not receiver.done():
                    receiver.cancel()
            out.close_code, reason = _close_info(ws)
            if out.close_code not in (None, 1000) and out.error is None:
                out.error = reason or f"closed with code {out.close_code}"
    except (OSError, asyncio.TimeoutError, ConnectionClosed) as exc:
        out.error = out.error or f"{type(exc).__name__}: {exc}"
    finally:
        if sent is not None:
            sent.set()
    return out


def stream_file(url: str, path: str, *, sample_rate: int = 16000, **kwargs: Any) -> StreamOutcome:
    """:func:`stream_audio` of a recording read at ``sample_rate`` (named by its path unless ``name`` is given)."""
    kwargs.setdefault("name", path)
    return asyncio.run(stream_audio(url, read_audio(path, sample_rate), sample_rate=sample_rate, **kwargs))


def transcribe_file(url: str, path: str, *, fmt: str = "json", token: Optional[str] = None,
                    timeout: float = 600.0) -> Message | str:
    """Upload a recording to ``url`` (``http://host:port/v1/transcribe``): the result as a dict (``json``) or the
    ``srt`` / ``vtt`` text. An HTTP error raises RuntimeError with the server's message."""
    with open(path, "rb") as fh:
        body = fh.read()
    query = urllib.parse.urlencode({"format": fmt})
    request = urllib.request.Request(f"{url}{'&' if '?' in url else '?'}{query}", data=body, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the user's URL)
            text = response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{url}: HTTP {exc.code}: {exc.read().decode('utf-8', 'replace').strip()}") from None
    return json.loads(text) if fmt == "json" else text
