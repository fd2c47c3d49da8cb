#!/usr/bin/env python3
"""Write DIR/utt2dur (utterance durations in seconds) from audio headers and segments.

usage: tools/compute_utt2dur.py [--nj N] DIR

A segment with an explicit end needs no audio (end - start); otherwise the
recording's header is read (a 'cmd |' entry has to be run, so use --nj for
those). Utterances whose audio cannot be read are listed and left out of
utt2dur (tools/fix_data_dir.py then drops them); the exit status is 1 if any.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import DataDirError, compute_utt2dur, format_seconds, read_data_dir  # noqa: E402
from asrkit.data.table import TableError, write_table  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="compute_utt2dur.py", description=__doc__.split("\n")[0])
    ap.add_argument("--nj", type=int, default=1, help="parallel header reads (threads)")
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    if args.nj < 1:
        ap.error("--nj must be >= 1")
    try:
        dd = read_data_dir(args.dir)
        durations, errors = compute_utt2dur(dd, jobs=args.nj)
        write_table(os.path.join(args.dir, "utt2dur"), {u: format_seconds(d) for u, d in durations.items()})
    except (DataDirError, TableError, OSError) as exc:
        print(f"compute_utt2dur.py: {exc}", file=sys.stderr)
        return 1
    for msg in errors.values():
        print(msg, file=sys.stderr)
    total = sum(durations.values())
    print(f"{os.path.join(args.dir, 'utt2dur')}: {len(durations)} utterances, {total / 3600:.2f} hours"
          + (f"; {len(errors)} unreadable, left out" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
