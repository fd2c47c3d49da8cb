"""The ASGI app of ``asrkit serve`` (starlette): live streams over a WebSocket, file uploads, the browser page,
health, information and metrics. See docs/serving.md.

* ``GET /`` the page (``asrkit/serve/static/index.html``), ``GET /static/<file>`` its files;
* ``GET /healthz`` ``{"status": "ok"}``; ``GET /v1/info`` the model's name, rate and chunk, the formats, the RTF;
* ``GET /metrics`` Prometheus text (:mod:`asrkit.serve.metrics`);
* ``POST /v1/transcribe?format=json|srt|vtt``: the body is an audio file's bytes (any format ``transcribe``
  reads), read in memory, never a path; json is the object ``transcribe --format jsonl`` writes;
* ``WS /v1/stream``: live audio (:mod:`asrkit.serve.protocol`, :mod:`asrkit.serve.connection`), every stream a
  row of the engine's one batch (:mod:`asrkit.serve.engine`).

With a token (:class:`~asrkit.config.ServeConfig`) every endpoint needs it: ``Authorization: Bearer <token>``, or
``?token=<token>`` (a browser sets no header on a WebSocket), or the cookie that ``GET /?token=`` sets so that
the page's own files and socket need nothing more.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from asrkit.config import ServeConfig
from asrkit.extras import require
from asrkit.pipeline.formats import format_result, result_to_dict
from asrkit.pipeline.inputs import AudioInput
from asrkit.pipeline.results import Result
from asrkit.pipeline.transcriber import Transcriber
from asrkit.serve.connection import StreamConnection, StreamInfo
from asrkit.serve.engine import MAX_HOTWORD_LISTS, MAX_RECOGNIZERS, Engine
from asrkit.serve.metrics import CONTENT_TYPE, Metrics
from asrkit.serve.protocol import CLOSE_POLICY, SAMPLE_FORMATS, UPLOAD_FORMATS, error_message

if TYPE_CHECKING:
    from starlette.applications import Starlette

log = logging.getLogger("asrkit.serve")

STATIC_DIR = Path(__file__).resolve().parent / "static"
TOKEN_COOKIE = "asrkit_token"
UPLOAD_MEDIA_TYPES = {"json": "application/json", "srt": "application/x-subrip", "vtt": "text/vtt"}


def build_app(transcriber: Transcriber, cfg: Optional[ServeConfig] = None, *, name: str = "asrkit") -> "Starlette":
    """The app serving ``transcriber``'s model (an experiment dir's: streaming needs its encoder) as ``name``.
    Its lifespan starts and stops the inference loop: run it under uvicorn, or ``with TestClient(app)``."""
    require("starlette", "asrkit serve")
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Mount, Route, WebSocketRoute
    from starlette.staticfiles import StaticFiles
    from starlette.websockets import WebSocket

    cfg = cfg or ServeConfig()
    recognizer = transcriber.streaming_recognizer()
    info = StreamInfo(name, recognizer.sample_rate)
    metrics = Metrics()
    # a stream's own chunk size: a recognizer of the same model and search (the loaded LM is shared); its own
    # hotwords join its recognizer's union, or (a word LM or lexicon) get a recognizer of their own
    # (Searcher.with_hotwords: only the hotword scorer and the lexicon are built anew)
    engine = Engine(recognizer, metrics, cfg.max_streams,
                    lambda ms, hotwords: transcriber.streaming_recognizer(chunk_ms=ms) if hotwords is None
                    else transcriber.streaming_recognizer(chunk_ms=ms, hotwords=list(hotwords)))
    uploads: dict = {}  # the upload worker, made by the lifespan

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        uploads["executor"] = ThreadPoolExecutor(1, thread_name_prefix="asrkit-upload")
        try:
            yield
        finally:
            await engine.stop()
            uploads.pop("executor").shutdown(wait=False, cancel_futures=True)

    def error(message: str, status: int) -> Response:
        return JSONResponse(error_message(message), status)

    async def page(request: Request) -> Response:
        index = STATIC_DIR / "index.html"
        if not index.is_file():
            return PlainTextResponse(f"the browser page is not installed ({index})", 404)
        response = FileResponse(index)
        given = request.query_params.get("token")
        if cfg.token is not None and given is not None:  # the middleware checked it: keep it for the page's requests
            response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
        return response

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def v1_info(request: Request) -> Response:
        return JSONResponse({"model": name, "sample_rate": info.sample_rate, "chunk_ms": engine.chunk_ms,
                             "chunk_ms_multiple_of": engine.frame_ms, "max_recognizers": MAX_RECOGNIZERS,
                             "max_hotword_lists": MAX_HOTWORD_LISTS,
                             "hotword_lists_share_batches": engine.shared_hotwords,
                             "streaming": True,
                             "formats": list(UPLOAD_FORMATS), "sample_formats": list(SAMPLE_FORMATS),
                             "max_message_bytes": cfg.max_message_bytes, "rtf": metrics.rtf})

    async def v1_metrics(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def v1_transcribe(request: Request) -> Response:
        fmt = request.query_params.get("format", "json")
        if fmt not in UPLOAD_FORMATS:
            return error(f"format {fmt!r} is unknown (choose from {', '.join(UPLOAD_FORMATS)})", 400)
        too_big = f"the body is over the upload limit of {cfg.max_upload_bytes} bytes"
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cfg.max_upload_bytes:
            return error(too_big, 413)
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > cfg.max_upload_bytes:
                return error(too_big, 413)
        if not body:
            return error("the body is empty: POST the bytes of an audio file", 400)
        loop = asyncio.get_running_loop()
        try:
            result: Result = await loop.run_in_executor(uploads["executor"], transcriber.transcribe,
                                                        AudioInput("upload", data=bytes(body)))
        except Exception as exc:  # the model failed on it: that request alone
            log.exception("upload failed")
            metrics.add(errors=1)
            return error(f"internal error: {exc}", 500)
        if not result.ok:
            metrics.add(errors=1)
            return error(str(result.error), 400)
        metrics.add(uploads=1, upload_audio_seconds=result.duration)
        if fmt == "json":
            return JSONResponse(result_to_dict(result))
        return Response(format_result(result, fmt), media_type=UPLOAD_MEDIA_TYPES[fmt])

    async def v1_stream(ws: WebSocket) -> None:
        await ws.accept()
        await StreamConnection(ws, engine, cfg, info).run()

    routes = [
        Route("/", page), Route("/healthz", healthz), Route("/v1/info", v1_info), Route("/metrics", v1_metrics),
        Route("/v1/transcribe", v1_transcribe, methods=["POST"]), WebSocketRoute("/v1/stream", v1_stream),
        Mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static"),
    ]
    middleware = [Middleware(TokenAuth, token=cfg.token)] if cfg.token is not None else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.recognizer = engine, metrics, recognizer
    return app


def run_server(app: "Starlette", cfg: ServeConfig, log_level: str = "info") -> None:
    """Serve ``app`` on ``cfg.host:cfg.port`` with uvicorn until interrupted (one process: one inference loop), torch
    running ``cfg.threads`` intra-op threads."""
    uvicorn = require("uvicorn", "asrkit serve")
    import torch

    torch.set_num_threads(cfg.threads)
    # uvicorn's own message limit above the app's, so that the app answers a large message with its reason
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=log_level, ws="websockets-sansio",
                ws_max_size=2 * cfg.max_message_bytes, timeout_graceful_shutdown=5)


class TokenAuth:
    """ASGI middleware: a request without the token gets HTTP 401; a WebSocket is accepted, told why and closed
    with 1008 (a refused handshake would tell a browser nothing)."""

    def __init__(self, app: Any, token: str):
        self.app, self.token = app, token.encode("utf-8")

    def _given(self, scope: dict) -> Optional[str]:
        from starlette.requests import HTTPConnection

        conn = HTTPConnection(scope)
        scheme, _, credentials = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credentials:
            return credentials.strip()
        return conn.query_params.get("token") or conn.cookies.get(TOKEN_COOKIE)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = self._given(scope)
        if given is not None and hmac.compare_digest(given.encode("utf-8"), self.token):
            return await self.app(scope, receive, send)
        message = "a token is required: Authorization: Bearer <token> (or ?token=<token>)" if given is None else \
            "the token is wrong"
        if scope["type"] == "http":
            from starlette.responses import JSONResponse

            response = JSONResponse(error_message(message), 401, headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps(error_message(message))})
        await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": message})
