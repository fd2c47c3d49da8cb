"""The one inference loop of ``asrkit serve``: every live stream is a :class:`~asrkit.pipeline.streaming.Stream` of
the :class:`~asrkit.pipeline.streaming.StreamingRecognizer` of its chunk size and hotwords, and each tick advances
every stream with a ready chunk, the streams of one recognizer as one batch (``StreamingRecognizer.step``), so 32
clients cost about one batch, not 32 models. The server's chunk and hotword list are the default; a stream may ask
for another chunk (a positive multiple of the encoder frame), whose recognizer is built once from the same model
and search (the loaded LM shared) and kept while streams use it, and its own hotwords, which join its recognizer's
union of lists (:mod:`asrkit.pipeline.stream_hotwords`: streams of different lists in one batch); where a word LM
or lexicon bounds the words, a list needs a recognizer of its own (as a chunk size does). At most
:data:`MAX_RECOGNIZERS` recognizers are in use at once (each adds a batch to a tick), and at most
:data:`MAX_HOTWORD_LISTS` distinct own lists.

Connections hand audio to a :class:`Session` (:meth:`Engine.feed`); the loop wakes, takes what every session
received, and runs a tick in its one worker thread (the event loop never waits on the model): the audio is
accepted, the ready streams step once, and each advanced stream's partial, new finals and (when its input
ended) done message go to its connection's outbox. A stream with more audio than one chunk stays ready, so the
loop ticks again at once; under load the streams that become ready during a tick join the next one, so batches
grow with the load without a timer. The worker thread is the only one that touches streams: a stream is made
there too, and a closed session is dropped from the loop at once (a tick in flight finishes it and lets it go).
A stream whose audio or step fails gets an error and close 1011; the others go on.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple, Union

import numpy as np

from asrkit.pipeline.results import Result, Segment
from asrkit.config import ConfigError
from asrkit.pipeline.streaming import Partial, Stream, StreamingRecognizer, chunk_frames
from asrkit.serve.metrics import Metrics
from asrkit.serve.protocol import (CLOSE_INTERNAL, CLOSE_NORMAL, Hotwords, ProtocolError, done_message,
                                   error_message, final_message, partial_message)

log = logging.getLogger("asrkit.serve")

# distinct recognizers of the live streams (the server's among them): a tick steps one batch each; a recognizer per
# chunk_ms (its streams' hotword lists share it), or per (chunk_ms, hotwords) where a word LM or lexicon bounds the
# words (pipeline.stream_hotwords.unshared_reason)
MAX_RECOGNIZERS = 4
# distinct own hotword lists of the live streams (each at most protocol.MAX_HOTWORDS phrases): the lists held in a
# recognizer's hotword union, which also keeps lists no stream uses until they are half of it (then compacted)
MAX_HOTWORD_LISTS = 16
Key = Tuple[int, Optional[Hotwords]]  # a recognizer's chunk_ms and hotwords (None: the server's list, or shared)


@dataclass(frozen=True)
class Close:
    """An outbox item: close the connection with ``code`` (after the messages before it)."""

    code: int
    reason: str = ""


Outgoing = Union[Dict[str, Any], Close]


class StreamsFull(Exception):
    """The engine holds its most streams."""


@dataclass(eq=False)
class Session:
    """One connection's stream as the engine sees it. ``outbox``: the messages for its connection to send."""

    id: int
    name: str
    rate: int  # the rate of the audio the client sends (the stream resamples it)
    outbox: "asyncio.Queue[Outgoing]"
    chunk_ms: int
    hotwords: Optional[Hotwords] = None  # its own list; None: the server's
    # of its chunk size and hotwords; it and the stream made in the worker thread
    recognizer: Optional[StreamingRecognizer] = None
    stream: Optional[Stream] = None
    received: float = 0.0  # seconds of audio received
    inbox: List[np.ndarray] = field(default_factory=list)  # audio not yet given to the stream
    # (seconds received at the end of a piece, when it arrived): for each partial's latency
    arrivals: Deque[Tuple[float, float]] = field(default_factory=collections.deque)
    ending: bool = False  # the client sent its end message
    end_fed: bool = False  # ... and the stream was told
    backlog: bool = False  # after the last tick the stream still held a ready chunk
    closed: bool = False


@dataclass
class _Advanced:
    session: Session
    finals: List[Segment]
    partial: Partial
    result: Optional[Result]  # the stream's whole result once its input ended and was decoded


class Engine:
    """The loop over the streams of ``recognizer`` (the server's chunk and hotwords) and of ``make(chunk_ms,
    hotwords)`` (the same model and search with another chunk or the stream's own hotwords, made when a stream
    first asks for them); at most ``max_streams`` at once. Start
    it with :meth:`start` on the event loop that serves the connections (the app's lifespan does), stop it with
    :meth:`stop`."""

    def __init__(self, recognizer: StreamingRecognizer, metrics: Metrics, max_streams: int,
                 make: Optional[Callable[[int, Optional[Hotwords]], StreamingRecognizer]] = None):
        self.recognizer, self.metrics, self.max_streams, self._make = recognizer, metrics, max_streams, make
        self.frame_ms = round(recognizer.frame_shift * 1000, 6)  # a stream's chunk is a multiple of it
        self.chunk_ms = int(round(recognizer.chunk_frames * self.frame_ms))  # the default
        self._recognizers: Dict[Key, StreamingRecognizer] = {(self.chunk_ms, None): recognizer}  # the worker's alone
        # streams with their own lists share their chunk's recognizer (else one recognizer per list)
        self.shared_hotwords = recognizer.hotword_lists is not None
        self._sessions: Dict[int, Session] = {}
        self._next_id = 0
        self._executor: Optional[ThreadPoolExecutor] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._wake: Optional[asyncio.Event] = None

    @property
    def live(self) -> int:
        """Streams open now."""
        return len(self._sessions)

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asrkit-engine")
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="asrkit-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._task = self._executor = None

    async def run_in_worker(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in the worker thread, after the tick in flight."""
        if self._executor is None:
            raise RuntimeError("the engine is not running (start it on the serving event loop)")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- the connections' side -------------------------------------------------------------------------------
    async def open(self, name: Optional[str], rate: int, outbox: "asyncio.Queue[Outgoing]",
                   chunk_ms: Optional[int] = None, hotwords: Optional[Hotwords] = None) -> Session:
        """A new session decoding chunks of ``chunk_ms`` (None: the server's) with ``hotwords`` (None: the
        server's list); StreamsFull when ``max_streams`` are open, ProtocolError for a chunk size the model cannot
        use, hotwords it cannot spell, or one (chunk, hotwords) setting more than MAX_RECOGNIZERS."""
        chunk_ms = self.chunk_ms if chunk_ms is None else chunk_ms
        key = self._key(chunk_ms, hotwords)
        in_use = {(self.chunk_ms, None)} | {self._key(s.chunk_ms, s.hotwords) for s in self._sessions.values()}
        lists = {s.hotwords for s in self._sessions.values() if s.hotwords is not None}
        if hotwords is not None and hotwords not in lists and len(lists) >= MAX_HOTWORD_LISTS:
            raise ProtocolError(f"start message: the server holds at most {MAX_HOTWORD_LISTS} distinct hotword lists "
                                f"of live streams at once: give one of them, none, or try later")
        if key not in in_use:
            if chunk_ms not in {ms for ms, _ in in_use}:
                try:
                    chunk_frames(chunk_ms, self.frame_ms / 1000)  # as decode.chunk_ms (serve --chunk-ms) is checked
                except ConfigError as exc:
                    raise ProtocolError(f"start message: chunk_ms {chunk_ms} is not usable: {exc}") from None
            if self._make is None or len(in_use) >= MAX_RECOGNIZERS:
                chunks = ", ".join(f"{ms} ms" + ("" if hw is None else " with own hotwords")
                                   for ms, hw in sorted(in_use, key=lambda k: (k[0], k[1] is not None)))
                what = "chunk_ms" if self.shared_hotwords else "chunk_ms and hotwords"
                raise ProtocolError(f"start message: the server decodes at most {MAX_RECOGNIZERS if self._make else 1}"
                                    f" distinct {what} settings at once (in use: {chunks}): give one "
                                    "of them or try later")
        if len(self._sessions) >= self.max_streams:
            self.metrics.add(streams_refused=1)
            raise StreamsFull(f"the server holds its most streams ({self.max_streams}): try again later")
        self._next_id += 1
        session = Session(self._next_id, name or f"stream-{self._next_id}", rate, outbox, chunk_ms, hotwords)
        self._sessions[session.id] = session  # the slot is taken before the stream is made
        self.metrics.add(streams_total=1, streams_live=1)
        try:
            await self.run_in_worker(self._create_stream, session, in_use)
        except BaseException:
            self.close(session)
            raise
        return session

    def feed(self, session: Session, samples: np.ndarray) -> None:
        """Audio for ``session`` (float32 at its rate), decoded by the next tick."""
        if samples.size:
            session.inbox.append(samples)
            session.received += samples.size / session.rate
            session.arrivals.append((session.received, time.perf_counter()))
            self._kick()

    def end(self, session: Session) -> None:
        """The client's input ended: its last chunk is decoded, its finals and done message sent."""
        session.ending = True
        self._kick()

    def close(self, session: Session) -> None:
        """Forget ``session`` (its client is gone or it is done): its stream is let go."""
        if not session.closed:
            session.closed = True
            self._sessions.pop(session.id, None)
            self.metrics.add(streams_live=-1)

    def _key(self, chunk_ms: int, hotwords: Optional[Hotwords]) -> Key:
        """The recognizer of a stream: its chunk's, or its chunk's and list's where lists cannot share one."""
        return (chunk_ms, None if self.shared_hotwords else hotwords)

    def _create_stream(self, session: Session, in_use: Set[Key]) -> None:
        """In the worker thread: ``session``'s recognizer (made for a new chunk size, or a hotword list where
        lists cannot share one; the recognizers no stream uses are let go) and its stream (with its own list in
        its recognizer's union where they share)."""
        key = self._key(session.chunk_ms, session.hotwords)
        rec = self._recognizers.get(key)
        if rec is None:
            assert self._make is not None
            for old in set(self._recognizers) - in_use:
                del self._recognizers[old]
            try:
                rec = self._make(*key)
            except ConfigError as exc:  # e.g. no phrase the model's units can spell
                raise ProtocolError(f"start message: {exc}") from None
            self._recognizers[key] = rec
        own = list(session.hotwords) if self.shared_hotwords and session.hotwords is not None else None
        try:
            stream = rec.create_stream(session.name, hotwords=own)
        except ConfigError as exc:  # e.g. no phrase the model's units can spell
            raise ProtocolError(f"start message: {exc}") from None
        session.recognizer, session.stream = rec, stream

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop -----------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                work = self._take_work()
                if not work:
                    break
                try:
                    advanced, failed = await self.run_in_worker(self._tick, work)
                    self._dispatch(advanced, failed)
                except Exception as exc:  # a bug: the streams of this tick end, the loop and the others go on
                    log.exception("inference loop: a tick failed")
                    self._dispatch([], [(s, f"internal error: {exc}") for s, _, _ in work])

    def _take_work(self) -> List[Tuple[Session, Optional[np.ndarray], bool]]:
        """(session, its new audio or None, whether its input ends now) of each session with something to do."""
        work = []
        for s in self._sessions.values():
            if s.stream is None:
                continue
            audio = np.concatenate(s.inbox) if s.inbox else None
            s.inbox = []
            end = s.ending and not s.end_fed
            s.end_fed = s.end_fed or end
            if audio is not None or end or s.backlog:
                work.append((s, audio, end))
        return work

    def _tick(self, work: List[Tuple[Session, Optional[np.ndarray], bool]]
              ) -> Tuple[List[_Advanced], List[Tuple[Session, str]]]:
        """In the worker thread: the new audio accepted, one batched step of the ready streams."""
        t0 = time.perf_counter()
        failed, fed = [], 0.0
        for s, audio, end in work:
            try:
                if audio is not None:
                    s.stream.accept_waveform(audio, s.rate)
                    fed += audio.size / s.rate
                if end:
                    s.stream.input_finished()
            except Exception as exc:  # this stream's input alone is refused
                failed.append((s, f"stream {s.name}: {exc}"))
        bad = {id(s) for s, _ in failed}
        ready = [s for s, _, _ in work if id(s) not in bad and s.recognizer.is_ready(s.stream)]
        batches: Dict[int, List[Session]] = {}  # one batch per recognizer: per (chunk size, hotwords)
        for s in ready:
            batches.setdefault(id(s.recognizer), []).append(s)
        advanced = []
        for batch in batches.values():
            rec = batch[0].recognizer
            try:
                rec.step([s.stream for s in batch])
            except Exception as exc:
                log.exception("inference loop: a step of %d streams failed", len(batch))
                failed += [(s, f"internal error: {exc}") for s in batch]
                continue
            for s in batch:
                done = s.stream.done
                advanced.append(_Advanced(s, s.stream.pop_finals(), s.stream.partial_result,
                                          s.stream.result() if done else None))
                s.backlog = not done and rec.is_ready(s.stream)
        self.metrics.add(compute_seconds=time.perf_counter() - t0, audio_seconds=fed, ticks=bool(ready),
                         chunks=len(ready))
        return advanced, failed

    def _dispatch(self, advanced: List[_Advanced], failed: List[Tuple[Session, str]]) -> None:
        """On the event loop: each advanced stream's messages to its outbox."""
        now = time.perf_counter()
        for a in advanced:
            s = a.session
            if s.closed:
                continue
            for segment in a.finals:
                s.outbox.put_nowait(final_message(segment))
            s.outbox.put_nowait(partial_message(a.partial))
            if not s.end_fed:
                self._observe_latency(s, a.partial.end, now)
            if a.result is not None:
                s.outbox.put_nowait(done_message(a.result))
                s.outbox.put_nowait(Close(CLOSE_NORMAL))
                self.close(s)
        for s, message in failed:
            if not s.closed:
                self.metrics.add(errors=1)
                s.outbox.put_nowait(error_message(message))
                s.outbox.put_nowait(Close(CLOSE_INTERNAL, "internal error"))
                self.close(s)

    def _observe_latency(self, s: Session, heard: float, now: float) -> None:
        """The partial that heard ``heard`` seconds of the stream: from the arrival of the piece that held its last
        sample to now."""
        if heard <= 0:
            return
        while s.arrivals and s.arrivals[0][0] < heard - 1e-6:  # pieces wholly heard before
            s.arrivals.popleft()
        if s.arrivals:
            self.metrics.observe_latency(now - s.arrivals[0][1])
