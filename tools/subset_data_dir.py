#!/usr/bin/env python3
"""Copy a subset of a Kaldi data dir's utterances into a new data dir.

usage: tools/subset_data_dir.py (--first N | --last N | --random N [--seed S] | --utt-list FILE | --spk-list FILE) SRC OUT

--first/--last take utterances in sorted id order; --random draws N without
replacement (same --seed, same subset); --utt-list/--spk-list read the first
field of each line of FILE. All tables (and, with segments, the recordings
used) are restricted to the subset; spk2utt is rewritten.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import DataDirError, read_data_dir, subset_data_dir, write_data_dir  # noqa: E402
from asrkit.data.table import TableError, iter_table  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="subset_data_dir.py", description=__doc__.split("\n")[0])
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--first", type=int, metavar="N")
    how.add_argument("--last", type=int, metavar="N")
    how.add_argument("--random", type=int, metavar="N")
    how.add_argument("--utt-list", metavar="FILE")
    how.add_argument("--spk-list", metavar="FILE")
    ap.add_argument("--seed", type=int, default=0, help="for --random (default 0)")
    ap.add_argument("src")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    if os.path.realpath(args.src) == os.path.realpath(args.out):
        ap.error("OUT must differ from SRC")
    try:
        dd = read_data_dir(args.src)
        lists = {k: [key for key, _, _ in iter_table(f)] if f else None
                 for k, f in (("utt_list", args.utt_list), ("spk_list", args.spk_list))}
        sub = subset_data_dir(dd, first=args.first, last=args.last, random_n=args.random, seed=args.seed, **lists)
        write_data_dir(sub, args.out)
    except (DataDirError, TableError, OSError) as exc:
        print(f"subset_data_dir.py: {exc}", file=sys.stderr)
        return 1
    if args.utt_list:
        missing = len(set(lists["utt_list"]) - set(sub.audio_utts()))
        if missing:
            print(f"subset_data_dir.py: warning: {missing} ids of {args.utt_list} are not in {args.src}",
                  file=sys.stderr)
    print(f"{args.out}: {len(sub.audio_utts())} of {len(dd.audio_utts())} utterances from {args.src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
