"""The search options shared by ``asrkit decode`` and ``asrkit transcribe``."""
from __future__ import annotations

import argparse
from dataclasses import replace

from asrkit.config import DecodeConfig, load_decode_config


def add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search", "a conf/decode_*.yaml file, overridden by --set and the shortcuts below")
    g.add_argument("--decode-config", help="decoding YAML (default: greedy CTC)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a decoding setting, e.g. --set beam=20 (repeatable)")
    g.add_argument("--mode", help="greedy | ctc_prefix | attention | joint | rescore")
    g.add_argument("--beam", type=int)
    g.add_argument("--lm", help="ARPA file or neural LM dir (asrkit train-lm) for shallow fusion")
    g.add_argument("--lm-weight", type=float)
    g.add_argument("--hotwords", metavar="FILE",
                   help="bias the search toward these phrases: one a line, optionally a tab and a weight factor")
    g.add_argument("--hotword-weight", type=float, metavar="W", help="bonus per hotword token (default 1.5)")


def add_streaming_options(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("streaming", "decode each input as a live stream (chunk by chunk, endpoints ending "
                                          "utterances): greedy, ctc_prefix and rescore (two-pass) modes")
    s.add_argument("--streaming", action="store_true", help="feed the audio chunk by chunk, as if it arrived live")
    s.add_argument("--chunk-ms", type=int, metavar="MS",
                   help="milliseconds of audio per chunk, a multiple of the encoder frame (default: the model's "
                        "training chunk, else 640); decode.chunk_ms")


def decode_config_from_args(args: argparse.Namespace) -> DecodeConfig:
    """The DecodeConfig the arguments describe; raises ConfigError naming a bad key. The shortcut options (and
    ``--chunk-ms`` where the command has it) win over ``--set`` and keep the values argparse gave them: ``--lm null``
    is a file named null, not YAML's "no LM"."""
    cfg = load_decode_config(args.decode_config, args.overrides)
    keys = ("mode", "beam", "lm", "lm_weight", "hotwords", "hotword_weight", "chunk_ms")
    given = {key: getattr(args, key, None) for key in keys}
    return replace(cfg, **{key: value for key, value in given.items() if value is not None})
