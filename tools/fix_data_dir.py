#!/usr/bin/env python3
"""Repair a Kaldi data dir in place; the original files are kept in DIR/.backup/.

usage: tools/fix_data_dir.py DIR

Sorts every table (C-locale byte order), drops empty, duplicate and malformed
lines, keeps only the utterances present in every table (text, utt2spk,
utt2dur, wav.scp or segments) with a valid segment and a positive duration,
drops recordings no segment uses and rewrites spk2utt from utt2spk. Prints how
many utterances were dropped, which, and why.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import DataDirError, fix_data_dir  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="fix_data_dir.py", description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    try:
        report = fix_data_dir(args.dir)
    except (DataDirError, OSError) as exc:
        print(f"fix_data_dir.py: {exc}", file=sys.stderr)
        return 1
    print(f"{args.dir}: {report.summary()}")
    print(f"{args.dir}: original files saved in {Path(args.dir) / '.backup'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
