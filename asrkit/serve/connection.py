"""One WebSocket stream of ``asrkit serve`` (``/v1/stream``, :mod:`asrkit.serve.protocol`): its messages read and
checked against the limits, its audio handed to the engine, the engine's messages sent back.

Two tasks per connection: the receiver reads (each read bounded by the idle timeout and the stream's wall-time
limit) and the sender is the only writer: it sends the outbox's messages in order and closes the socket at a
:class:`~asrkit.serve.engine.Close`. A broken rule queues an error and a close and stops the reading; a client
that goes away, at any point, has its session closed (its stream let go) at once.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

from asrkit.config import ServeConfig
from asrkit.serve.engine import Close, Engine, Outgoing, Session, StreamsFull
from asrkit.serve.protocol import (CLOSE_GOING_AWAY, CLOSE_TOO_BIG, CLOSE_TRY_AGAIN, END, PcmDecoder, ProtocolError,
                                   error_message, parse_message, parse_start, ready_message)

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

MAX_REASON_BYTES = 123  # a close frame's reason (RFC 6455 5.5: 125 bytes of payload, 2 of them the code)


@dataclass(frozen=True)
class StreamInfo:
    """What the ready message tells a client."""

    model: str
    sample_rate: int


class StreamConnection:
    def __init__(self, ws: "WebSocket", engine: Engine, cfg: ServeConfig, info: StreamInfo):
        self.ws, self.engine, self.cfg, self.info = ws, engine, cfg, info
        self.outbox: "asyncio.Queue[Outgoing]" = asyncio.Queue()
        self.session: Optional[Session] = None
        self.decoder: Optional[PcmDecoder] = None
        self.deadline = 0.0  # the event loop's time when the stream must end (set when it starts)

    async def run(self) -> None:
        """Serve the (accepted) socket until it closes."""
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + self.cfg.max_stream_seconds
        sender = asyncio.create_task(self._send_all())
        receiver = asyncio.create_task(self._receive_all())
        try:
            await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
            if receiver.done() and not receiver.cancelled() and receiver.result() and not sender.done():
                # the reading stopped with a close queued (an error, or the client's end): let it go out, in time
                await asyncio.wait([sender], timeout=max(0.0, self.deadline - loop.time()) + 1.0)
        finally:  # before any await: a cancelled connection (its server task cancelled) still lets its stream go
            if self.session is not None:
                self.engine.close(self.session)
            for task in (sender, receiver):
                task.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)

    # -- sending ------------------------------------------------------------------------------------------------
    async def _send_all(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, Close):
                reason = item.reason.encode("utf-8")[:MAX_REASON_BYTES].decode("utf-8", "ignore")
                await self.ws.close(item.code, reason)
                return
            await self.ws.send_text(json.dumps(item, ensure_ascii=False, allow_nan=False))

    def _fail(self, message: str, code: int) -> None:
        self.engine.metrics.add(errors=1)
        self.outbox.put_nowait(error_message(message))
        self.outbox.put_nowait(Close(code, message))

    # -- receiving ----------------------------------------------------------------------------------------------
    async def _receive_all(self) -> bool:
        """Read until the client leaves (False) or a close is queued (True)."""
        try:
            while True:
                msg = await self._receive()
                if msg is None:
                    return True
                if msg["type"] == "websocket.disconnect":
                    return False
                if not await self._handle(msg):
                    return True
        except ProtocolError as exc:
            self._fail(str(exc), exc.code)
            return True
        except StreamsFull as exc:
            self.outbox.put_nowait(error_message(str(exc)))
            self.outbox.put_nowait(Close(CLOSE_TRY_AGAIN, "server busy"))
            return True

    async def _receive(self) -> Optional[Dict[str, Any]]:
        """The next ASGI message, or None after queueing the close of a stream that was idle or lasted too long."""
        loop = asyncio.get_running_loop()
        left = self.deadline - loop.time()
        try:
            return await asyncio.wait_for(self.ws.receive(), timeout=min(self.cfg.idle_timeout_s, max(left, 0.0)))
        except asyncio.TimeoutError:
            if loop.time() >= self.deadline:
                self._fail(f"the stream passed its longest duration ({self.cfg.max_stream_seconds:g} s)",
                           CLOSE_GOING_AWAY)
            else:
                self._fail(f"no message for {self.cfg.idle_timeout_s:g} s (the idle timeout)", CLOSE_GOING_AWAY)
            return None

    async def _handle(self, msg: Dict[str, Any]) -> bool:
        """One received message; False once the client's end message came (nothing more is read)."""
        data, text = msg.get("bytes"), msg.get("text")
        size = len(data) if data is not None else len(text.encode("utf-8")) if text is not None else 0
        if size > self.cfg.max_message_bytes:
            raise ProtocolError(f"a message of {size} bytes is over the limit of {self.cfg.max_message_bytes}",
                                CLOSE_TOO_BIG)
        if data is not None:
            if self.session is None or self.decoder is None:
                raise ProtocolError('audio before the start message (send {"type": "start", ...} first)')
            self.engine.feed(self.session, self.decoder.decode(data))
            if self.session.received > self.cfg.max_stream_seconds:
                self._fail(f"the stream passed its longest duration ({self.cfg.max_stream_seconds:g} s of audio)",
                           CLOSE_GOING_AWAY)
                return False
            return True
        message = parse_message(text or "")
        if self.session is None:
            start = parse_start(message)
            self.decoder = PcmDecoder(start.format)
            self.session = await self.engine.open(start.name, start.sample_rate, self.outbox, start.chunk_ms,
                                                start.hotwords)
            self.outbox.put_nowait(ready_message(self.info.model, self.info.sample_rate, self.session.chunk_ms))
            return True
        if message["type"] == END:
            self.engine.end(self.session)
            return False
        raise ProtocolError(f'unexpected message type {message["type"]!r} after the start (audio frames or '
                            f'{{"type": "end"}})')
