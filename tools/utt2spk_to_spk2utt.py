#!/usr/bin/env python3
"""Invert a Kaldi utt2spk file into spk2utt (one line per speaker: spk utt1 utt2 ...).

usage: tools/utt2spk_to_spk2utt.py UTT2SPK [SPK2UTT]

Writes to SPK2UTT, or to stdout if it is omitted or '-'. Speakers and each
speaker's utterances are sorted in C-locale byte order.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import utt2spk_to_spk2utt  # noqa: E402
from asrkit.data.table import TableError, read_table, write_table  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="utt2spk_to_spk2utt.py", description=__doc__.split("\n")[0])
    ap.add_argument("utt2spk")
    ap.add_argument("spk2utt", nargs="?", default="-")
    args = ap.parse_args(argv)
    try:
        spk2utt = {s: " ".join(u) for s, u in utt2spk_to_spk2utt(read_table(args.utt2spk,
                                                                           allow_empty_value=False)).items()}
        if args.spk2utt == "-":
            sys.stdout.writelines(f"{s} {u}\n" for s, u in sorted(spk2utt.items()))
        else:
            write_table(args.spk2utt, spk2utt)
    except (TableError, OSError) as exc:
        print(f"utt2spk_to_spk2utt.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
