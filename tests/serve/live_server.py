"""A real ``asrkit serve`` app on uvicorn in a thread of the test process, on a free loopback port."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator, Optional

from asrkit.config import ServeConfig
from asrkit.pipeline import Transcriber
from asrkit.serve import build_app


@contextlib.contextmanager
def serving(transcriber: Transcriber, cfg: Optional[ServeConfig] = None, name: str = "tiny") -> Iterator[str]:
    """``build_app(transcriber, cfg)`` served until the block ends; yields its base URL (``127.0.0.1:PORT``)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(transcriber, cfg, name=name), log_level="warning",
                                           ws="websockets-sansio", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
