#!/usr/bin/env python3
"""One Markdown table of WERs over seeds: per method, the mean and the spread (min-max) of each decode.

usage: tools/seed_table.py [--sets "test test_unseen"] METHOD=EXP [METHOD=EXP ...]

Each EXP is an experiment dir of recipes/mini/run.sh after stage 7: EXP/decode_<set>/scoring.log (greedy)
and EXP/decode_<set>_lm/scoring.log (with the LM), whose first line is asrkit score's "%WER x [ ... ]".
Runs of one METHOD (several seeds) are pooled: a cell reads "mean (min-max, n)", or the value for one run.
The last column is the relative change of the first LM column's mean against the first METHOD's.
Exit status 1, naming the file, when a scoring.log is missing or its first line is not a WER line.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from statistics import mean
from typing import Dict, List, Sequence, Tuple

_WER_RE = re.compile(r"%WER (\S+) \[")


class TableError(Exception):
    """A missing or malformed scoring file."""


def read_wer(path: str) -> float:
    """The WER (percent) of an ``asrkit score`` report's first line."""
    if not os.path.isfile(path):
        raise TableError(f"{path}: no such file (was stage 7 of run.sh run for this experiment?)")
    with open(path, encoding="utf-8") as f:
        first = f.readline().strip()
    found = _WER_RE.match(first)
    if not found:
        raise TableError(f"{path}: line 1 is not a '%WER x [ ... ]' line: {first[:80]!r}")
    return float(found.group(1))


def cell(values: Sequence[float]) -> str:
    """'mean (min-max, n)' of several runs, the value itself for one."""
    if len(values) == 1:
        return f"{values[0]:.1f}%"
    return f"{mean(values):.1f}% ({min(values):.1f}-{max(values):.1f}, n={len(values)})"


def parse_runs(specs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """'METHOD=EXP' arguments -> [(method, [exp, ...])] in first-seen order."""
    runs: Dict[str, List[str]] = {}
    for spec in specs:
        method, sep, exp = spec.partition("=")
        if not sep or not method or not exp:
            raise TableError(f"argument {spec!r} is not METHOD=EXP")
        runs.setdefault(method, []).append(exp)
    return list(runs.items())


def table(runs: Sequence[Tuple[str, List[str]]], sets: Sequence[str]) -> str:
    """The Markdown table: a row per method, greedy and LM columns per eval set, and the change vs the first."""
    heads = [f"{s} {kind}" for s in sets for kind in ("greedy", "LM")]
    lines = ["| method | runs | " + " | ".join(heads) + " | LM vs first |", "| --- " * (len(heads) + 3) + "|"]
    base = None
    for method, exps in runs:
        cells, lm_mean = [], None
        for s in sets:
            for suffix in ("", "_lm"):
                values = [read_wer(os.path.join(e, f"decode_{s}{suffix}", "scoring.log")) for e in exps]
                cells.append(cell(values))
                if suffix and lm_mean is None:
                    lm_mean = mean(values)
        base = lm_mean if base is None else base
        change = "-" if base in (None, 0.0) or lm_mean is None else f"{100.0 * (lm_mean - base) / base:+.1f}%"
        lines.append(f"| {method} | {len(exps)} | " + " | ".join(cells) + f" | {change} |")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="test test_unseen", help="eval sets, space-separated (decode_<set> dirs)")
    ap.add_argument("runs", nargs="+", metavar="METHOD=EXP")
    args = ap.parse_args(list(argv) or None)
    try:
        print(table(parse_runs(args.runs), args.sets.split()))
    except TableError as e:
        print(f"seed_table: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
