#!/usr/bin/env python3
"""Print one SHA-256 fingerprint of what shaped a recipe step's outputs, for idempotent stages.

Usage: python tools/fingerprint.py WORD|FILE|DIR ...

Each argument counts as: a file up to 64 MB by its content; a larger file by name, size and modification
time; a directory by the relative path, size and modification time of every file under it (sorted; `.done`
folders left out); anything else (options, numbers) as the word itself. Recipes keep the value in
DIR/.done/NAME and skip a step while it is unchanged.
"""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Iterator, List

BIG = 64 * 1024 * 1024


def _records(arg: str) -> Iterator[str]:
    if os.path.isfile(arg):
        st = os.stat(arg)
        if st.st_size <= BIG:
            with open(arg, "rb") as fh:
                yield f"{arg} {hashlib.sha256(fh.read()).hexdigest()}"
        else:
            yield f"{arg} {st.st_size} {st.st_mtime_ns}"
    elif os.path.isdir(arg):
        yield arg
        rows = []
        for root, dirs, files in os.walk(arg):
            dirs[:] = [d for d in dirs if d != ".done"]
            for name in files:
                path = os.path.join(root, name)
                st = os.stat(path)
                rows.append(f"{os.path.relpath(path, arg)} {st.st_size} {st.st_mtime_ns}")
        yield from sorted(rows)
    else:
        yield arg


def fingerprint(args: List[str]) -> str:
    digest = hashlib.sha256()
    for arg in args:
        for record in _records(arg):
            digest.update(record.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    print(fingerprint(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
