"""Transcribe audio files (wav/flac/ogg) with a trained model; prints `file<TAB>text` lines."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from asrkit.audio.io import AudioError
from asrkit.cli.decode_options import add_decode_options, decode_config_from_args


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit transcribe", description=__doc__)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train'")
    p.add_argument("audio", nargs="*", help="audio files")
    p.add_argument("--list", help="file with one audio path per line (in addition to positional files)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per file with token timestamps (and the N-best with decode nbest > 1)")
    add_decode_options(p)
    args = p.parse_args(argv)
    paths = list(args.audio)
    if args.list:
        with open(args.list, encoding="utf-8") as fh:
            paths += [line.strip() for line in fh if line.strip()]
    if not paths:
        p.error("no audio files given")
    from asrkit import load_model

    try:
        transcriber = load_model(args.model, device=args.device, decode=decode_config_from_args(args))
    except (FileNotFoundError, ValueError) as exc:  # ConfigError is a ValueError
        print(f"asrkit transcribe: {exc}", file=sys.stderr)
        return 1
    status = 0
    for i in range(0, len(paths), args.batch_size):
        batch = paths[i: i + args.batch_size]
        wavs, ok = [], []
        for path in batch:
            try:
                wavs.append(transcriber.load(path))
                ok.append(path)
            except AudioError as exc:
                print(f"asrkit transcribe: {exc}", file=sys.stderr)
                status = 1
        for path, alternatives in zip(ok, transcriber.transcribe_nbest(wavs)):
            tr = alternatives[0]
            if args.json:
                obj = {"file": path, "text": tr.text, "tokens": transcriber.tokenizer.pieces(tr.tokens),
                       "token_times": tr.token_times, "score": tr.score}
                if len(alternatives) > 1:
                    obj["nbest"] = [{"text": a.text, "score": a.score, "ctc_score": a.ctc_score}
                                    for a in alternatives]
                print(json.dumps(obj, ensure_ascii=False))
            else:
                print(f"{path}\t{tr.text}")
    return status
