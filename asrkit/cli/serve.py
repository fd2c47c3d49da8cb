"""Serve a trained model over the network: live streams over a WebSocket (partials after every chunk, a final per
endpoint), file uploads, a browser page, health and metrics (docs/serving.md).

  asrkit serve --model exp/demo [--decode-config conf/decode_ctc_prefix.yaml] [--port 8000]

then open http://127.0.0.1:8000/ or stream with 'asrkit stream-client'. Every live stream is one row of a single
batched inference loop. Binds 127.0.0.1 unless --host says otherwise; beyond loopback give a token (--token or,
kept out of the process list, the environment variable ASRKIT_SERVE_TOKEN): every request must then carry it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from asrkit.cli.decode_options import add_decode_options, decode_config_from_args
from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.config import ConfigError, ServeConfig
from asrkit.extras import require

TOKEN_ENV = "ASRKIT_SERVE_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_parser() -> argparse.ArgumentParser:
    d = ServeConfig()
    p = argparse.ArgumentParser(prog="asrkit serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train' (streaming needs it)")
    p.add_argument("--checkpoint", help="checkpoint file (default: MODEL/model.pt)")
    p.add_argument("--name", help="the model's name in /v1/info and the ready message (default: the dir's name)")
    add_device_option(p)
    add_decode_options(p)
    p.add_argument("--chunk-ms", type=int, metavar="MS",
                   help="milliseconds of audio per chunk, a multiple of the encoder frame (default: the model's "
                        "training chunk, else 640); decode.chunk_ms")
    s = p.add_argument_group("server")
    s.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}: this machine only)")
    s.add_argument("--port", type=int, default=d.port, help=f"default {d.port}")
    s.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                   help=f"require 'Authorization: Bearer TOKEN' (or ?token=) on every endpoint (default: ${TOKEN_ENV})")
    s.add_argument("--max-streams", type=int, default=d.max_streams,
                   help=f"live streams at once; the next is refused with close code 1013 (default {d.max_streams})")
    s.add_argument("--max-message-bytes", type=int, default=d.max_message_bytes,
                   help=f"largest WebSocket message (default {d.max_message_bytes})")
    s.add_argument("--max-stream-seconds", type=float, default=d.max_stream_seconds,
                   help=f"longest stream, in audio or wall seconds (default {d.max_stream_seconds:g})")
    s.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s,
                   help=f"seconds a stream may send nothing (default {d.idle_timeout_s:g})")
    s.add_argument("--max-upload-bytes", type=int, default=d.max_upload_bytes,
                   help=f"largest POST /v1/transcribe body (default {d.max_upload_bytes})")
    s.add_argument("--threads", type=int, default=d.threads,
                   help=f"torch intra-op threads (default {d.threads}: the loop's ops are small; more threads mostly "
                        f"wait on each other)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def serve_config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The ServeConfig the arguments describe; ConfigError names a bad value."""
    return ServeConfig(host=args.host, port=args.port, token=args.token, max_streams=args.max_streams,
                       max_message_bytes=args.max_message_bytes, max_stream_seconds=args.max_stream_seconds,
                       idle_timeout_s=args.idle_timeout, max_upload_bytes=args.max_upload_bytes, threads=args.threads)


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not os.path.isdir(args.model):
        p.error(f"--model {args.model}: not an experiment dir (streaming needs one; an exported model cannot stream)")
    try:
        device = resolve_device(args.device)
        cfg = serve_config_from_args(args)
        decode = decode_config_from_args(args)
    except (DeviceError, ConfigError) as exc:
        print(f"asrkit serve: {exc}", file=sys.stderr)
        return 2
    for package in ("starlette", "uvicorn"):  # before the model loads
        require(package, "asrkit serve")
    if cfg.token is None and cfg.host not in LOOPBACK:
        print(f"asrkit serve: warning: serving on {cfg.host} without a token: anyone who reaches the port can use "
              f"the model (give --token or ${TOKEN_ENV})", file=sys.stderr)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from asrkit.pipeline import Transcriber
    from asrkit.serve.app import build_app, run_server

    try:
        transcriber = Transcriber.from_dir(args.model, device=device, checkpoint=args.checkpoint, decode=decode)
        app = build_app(transcriber, cfg, name=args.name or os.path.basename(os.path.normpath(args.model)))
    except (FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError: a mode that cannot stream, ...
        print(f"asrkit serve: {exc}", file=sys.stderr)
        return 1
    run_server(app, cfg, args.log_level)
    return 0
