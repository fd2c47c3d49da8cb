#!/usr/bin/env python3
"""Combine Kaldi data dirs into one.

usage: tools/combine_data.py OUT DIR1 DIR2 [DIR...]

An utterance id present in two input dirs is an error naming both. If only some
inputs have segments, the others get whole-recording segments. text, utt2spk
and utt2dur are written only if every input has them (a note says which are
left out); spk2utt is rewritten.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import DataDirError, combine_data_dirs, read_data_dir, write_data_dir  # noqa: E402
from asrkit.data.table import TableError  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="combine_data.py", description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("dirs", nargs="+", metavar="DIR")
    args = ap.parse_args(argv)
    if os.path.realpath(args.out) in {os.path.realpath(d) for d in args.dirs}:
        ap.error("OUT must not be one of the input dirs")
    try:
        combined, notes = combine_data_dirs([(d, read_data_dir(d)) for d in args.dirs])
        write_data_dir(combined, args.out)
    except (DataDirError, TableError, OSError) as exc:
        print(f"combine_data.py: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"combine_data.py: warning: {note}", file=sys.stderr)
    print(f"{args.out}: {len(combined.audio_utts())} utterances from {len(args.dirs)} dirs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
