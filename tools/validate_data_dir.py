#!/usr/bin/env python3
"""Check a Kaldi data dir and list every problem with its file and line.

usage: tools/validate_data_dir.py [--no-text] [--check-audio] DIR

Checks: wav.scp, utt2spk, spk2utt (and text unless --no-text) exist; keys are
sorted in C-locale byte order and unique; no empty lines; every utterance is in
text, utt2spk, utt2dur (if present) and wav.scp or segments; segments name
recordings in wav.scp and have 0 <= start < end (end -1 = to the end);
durations are positive; spk2utt agrees with utt2spk. --check-audio also opens
every recording's header. Exit status 1 if there is any problem.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import validate_data_dir  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="validate_data_dir.py", description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--no-text", action="store_true", help="the dir has no transcripts (e.g. for decoding)")
    ap.add_argument("--check-audio", action="store_true", help="open every recording's header too")
    args = ap.parse_args(argv)
    rep = validate_data_dir(args.dir, require_text=not args.no_text, check_audio=args.check_audio)
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for p in rep.problems:
        print(p, file=sys.stderr)
    if rep.problems:
        print(f"{args.dir}: {len(rep.problems)} problems (tools/fix_data_dir.py repairs most)", file=sys.stderr)
        return 1
    print(f"{args.dir}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
