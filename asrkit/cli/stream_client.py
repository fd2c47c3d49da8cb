"""Send recordings to an ``asrkit serve`` server as live streams and print what comes back, as JSON lines.

Each FILE (any format transcribe reads) is read at --sample-rate and sent over the WebSocket --url in --frame-ms
frames, each when it would have been recorded (--rate 1, real time), --rate times faster, or as fast as possible
(--rate 0); then the end message. Printed, one JSON object a line, as they arrive: the server's partial and final
messages with the file's "name" added, and a last {"type": "done", "name", "result"} per file whose result is the
object 'transcribe --format jsonl' writes. A file the server refused (or a lost connection) is named on stderr and
the rest are sent; the exit status is then 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Dict, List, Optional

from asrkit.serve.client import DEFAULT_FRAME_MS, FORMATS, read_audio, stream_audio

TOKEN_ENV = "ASRKIT_SERVE_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asrkit stream-client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="recordings to send, one stream each, in turn")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/stream", help="the server's stream endpoint "
                                                                          "(default ws://127.0.0.1:8000/v1/stream)")
    p.add_argument("--rate", type=float, default=1.0,
                   help="speed: 1 real time (default), N times faster, 0 as fast as possible")
    p.add_argument("--token", help=f"bearer token of a server started with --token (default: ${TOKEN_ENV})")
    p.add_argument("--format", choices=FORMATS, default="s16le", help="sample format sent (default s16le)")
    p.add_argument("--sample-rate", type=int, default=16000, help="rate the audio is read and sent at (default 16000)")
    p.add_argument("--frame-ms", type=int, default=DEFAULT_FRAME_MS,
                   help=f"audio per WebSocket frame (default {DEFAULT_FRAME_MS})")
    p.add_argument("--no-partials", action="store_true", help="print finals and results only")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait to connect, for the server's ready and for the result after the end")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rate < 0 or args.frame_ms <= 0 or args.sample_rate <= 0:
        print("asrkit stream-client: --rate must be >= 0, --frame-ms and --sample-rate > 0", file=sys.stderr)
        return 2
    token = args.token or os.environ.get(TOKEN_ENV) or None
    failed = 0
    for path in args.files:
        def show(msg: Dict[str, Any], name: str = path) -> None:
            if msg.get("type") == "final" or (msg.get("type") == "partial" and not args.no_partials):
                print(json.dumps({"name": name, **msg}, ensure_ascii=False), flush=True)

        try:
            samples = read_audio(path, args.sample_rate)
        except (OSError, RuntimeError) as exc:
            print(f"asrkit stream-client: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        out = asyncio.run(stream_audio(args.url, samples, sample_rate=args.sample_rate, rate=args.rate,
                                       frame_ms=args.frame_ms, fmt=args.format, token=token, name=path,
                                       on_message=show, timeout=args.timeout))
        if out.result is None:
            code = f" (close code {out.close_code})" if out.close_code else ""
            print(f"asrkit stream-client: {path}: {out.error or 'no result'}{code}", file=sys.stderr)
            failed += 1
            continue
        print(json.dumps({"type": "done", "name": path, "result": out.result}, ensure_ascii=False), flush=True)
    return 1 if failed else 0
