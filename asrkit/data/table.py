"""Kaldi table files: one ``key value...`` record per line (text, wav.scp, utt2spk, ...).

Readers keep line numbers so every error names the file and the line.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, Iterator, Mapping, Tuple

from asrkit.atomic import atomic_write
from asrkit.config import _quote  # the one rule for a piece of a file in a message: escaped, short


class TableError(ValueError):
    """A malformed Kaldi table file; the message names the file and line."""


def iter_table(path: str | os.PathLike, *, allow_empty_value: bool = True) -> Iterator[Tuple[str, str, int]]:
    """Yield ``(key, value, line_number)`` for each record of a Kaldi table file.

    Tolerates CRLF line endings, tabs and repeated spaces (the value is
    whitespace-normalised to single spaces). Blank lines are an error because
    Kaldi tools reject them and they usually mean a broken file. Bytes that are
    not UTF-8 are an error naming the line (:func:`_utf8_error`). An error quotes
    a short excerpt of the file only after a good record: a file whose first
    record fails is not of this kind, and nothing of it is shown (it may be any
    file a path pointed to).
    """
    path = os.fspath(path)
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise TableError(f"{path}: cannot open: {exc.strerror}") from exc
    with fh:
        try:
            for lineno, line in enumerate(fh, start=1):
                fields = line.split()
                if not fields:
                    raise TableError(f"{path}:{lineno}: empty line")
                key, value = fields[0], " ".join(fields[1:])
                if not value and not allow_empty_value:
                    raise TableError(f"{path}:{lineno}: no value after the key (is this a Kaldi table file?)"
                                     if lineno == 1 else f"{path}:{lineno}: no value for key {_quote(key)}")
                yield key, value, lineno
        except UnicodeDecodeError as exc:
            raise TableError(_utf8_error(path)) from exc


def _utf8_error(path: str) -> str:
    """The message for a file that is not UTF-8, naming the first bad line and the offending bytes.

    The text reader decodes in chunks, so its error position says nothing about lines: the file is
    scanned again as bytes to find the line (only on this error path).
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = " ".join(f"0x{b:02x}" for b in raw[exc.start:exc.end])
                return (f"{path}: line {lineno}: not valid UTF-8 ({bad} at byte {exc.start + 1} of the "
                        f"line: {exc.reason}); re-encode the file as UTF-8")
    return f"{path}: not valid UTF-8"  # the file changed under us


def read_table(path: str | os.PathLike, *, allow_empty_value: bool = True) -> Dict[str, str]:
    """Read a Kaldi table into an insertion-ordered dict; a repeated key is an error naming both lines."""
    out: Dict[str, str] = {}
    seen: Dict[str, int] = {}
    for key, value, lineno in iter_table(path, allow_empty_value=allow_empty_value):
        if key in seen:
            raise TableError(f"{os.fspath(path)}:{lineno}: duplicate key {_quote(key)} "
                             f"(first seen on line {seen[key]})")
        seen[key] = lineno
        out[key] = value
    return out


def read_table_with_lines(path: str | os.PathLike, *, allow_empty_value: bool = True) -> Dict[str, Tuple[str, int]]:
    """Like :func:`read_table` but keeps the line number of each record: ``{key: (value, line)}``."""
    out: Dict[str, Tuple[str, int]] = {}
    for key, value, lineno in iter_table(path, allow_empty_value=allow_empty_value):
        if key in out:
            raise TableError(
                f"{os.fspath(path)}:{lineno}: duplicate key {_quote(key)} (first seen on line {out[key][1]})")
        out[key] = (value, lineno)
    return out


def write_table(path: str | os.PathLike, records: Mapping[str, str] | Iterable[Tuple[str, str]],
                *, sort: bool = True) -> None:
    """Write ``key value`` lines (sorted by key unless ``sort=False``) atomically."""
    items = list(records.items()) if isinstance(records, Mapping) else list(records)
    if sort:
        items.sort(key=lambda kv: kv[0])
    with atomic_write(path) as fh:
        for key, value in items:
            fh.write(f"{key} {value}\n" if value != "" else f"{key}\n")
