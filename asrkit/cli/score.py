"""Score hypotheses against references: WER/CER, sclite-style alignments, per-speaker table.

Prints a Kaldi-style ``%WER 12.34 [ 5 / 40, 1 ins, 2 del, 2 sub ]`` line (``%CER`` with
--cer) and an sclite-like summary table; --out DIR also writes DIR/result.txt (the same
summary) and DIR/result.pra (per-utterance alignments).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from asrkit.data.table import TableError
from asrkit.score.wer import ScoreError, format_report, score_files, write_report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asrkit score", description=__doc__.strip().splitlines()[0])
    p.add_argument("--ref", required=True, help="reference Kaldi text file (uttid word ...)")
    p.add_argument("--hyp", required=True, help="hypothesis Kaldi text file (uttid word ...)")
    p.add_argument("--utt2spk", help="utt2spk file: adds a per-speaker table (default: totals only)")
    p.add_argument("--cer", action="store_true",
                   help="character error rate instead of WER; spaces are removed before aligning characters")
    p.add_argument("--upper", action="store_true", help="upper-case both sides before scoring")
    p.add_argument("--remove-punct", action="store_true",
                   help="replace Unicode punctuation (except apostrophes) by spaces on both sides")
    p.add_argument("--out", metavar="DIR", help="write DIR/result.txt and DIR/result.pra")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out}: exists and is not a directory")
    try:
        report = score_files(args.ref, args.hyp, utt2spk=args.utt2spk, cer=args.cer,
                             upper=args.upper, remove_punct=args.remove_punct)
    except (TableError, ScoreError) as exc:
        print(f"asrkit score: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(format_report(report))
    if args.out is not None:
        txt, pra = write_report(report, args.out)
        print(f"\nWrote {txt} and {pra}")
    return 0
