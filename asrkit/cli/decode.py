"""Decode a Kaldi data dir with a trained model into a Kaldi text file (greedy CTC, beam searches, LM fusion)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from asrkit.cli.decode_options import add_decode_options, decode_config_from_args


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit decode", description=__doc__)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train'")
    p.add_argument("--data", required=True, help="Kaldi data dir to decode")
    p.add_argument("--out", required=True, help="output dir; hypotheses go to OUT/text, settings to OUT/decode.yaml")
    p.add_argument("--checkpoint", help="checkpoint file (default: MODEL/model.pt)")
    p.add_argument("--batch-size", type=int, help="utterances per batch (default: the config's batch_size)")
    p.add_argument("--device", default="cpu")
    add_decode_options(p)
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    for path, what in ((args.model, "--model"), (args.data, "--data")):
        if not os.path.isdir(path):
            p.error(f"{what} {path}: no such directory")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from asrkit.pipeline import Transcriber

    try:
        decode = decode_config_from_args(args)
        transcriber = Transcriber.from_dir(args.model, device=args.device, checkpoint=args.checkpoint, decode=decode)
    except (FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError
        print(f"asrkit decode: {exc}", file=sys.stderr)
        return 1
    transcriber.decode_data_dir(args.data, args.out, batch_size=args.batch_size)
    return 0

