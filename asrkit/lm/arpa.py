"""Read back-off n-gram language models in the ARPA text format (plain or gzip).

An ARPA file holds, for every order k, lines ``log10_prob  w1 ... wk  [log10_backoff]``.
This module only parses and validates; :mod:`asrkit.lm.ngram` turns the result into
device tensors. Values are kept exactly as written: **log10**.
"""
from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple

from asrkit.config import _quote  # the one rule for a piece of a file in a message: escaped, short

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"

# One n-gram entry: (log10 probability, log10 back-off weight; 0.0 when absent).
Entry = Tuple[float, float]

_SECTION = re.compile(r"^\\(\d+)-grams:$")
_COUNT = re.compile(r"^ngram\s+(\d+)\s*=\s*(\d+)$")


class ArpaError(ValueError):
    """A malformed ARPA file; the message names the file and line."""


@dataclass
class ArpaLM:
    """A parsed ARPA model.

    ``ngrams[k-1]`` maps a k-word tuple to its ``(log10 prob, log10 backoff)``;
    ``ngrams[0]`` (the unigrams) in file order is the vocabulary.
    """

    order: int
    ngrams: List[Dict[Tuple[str, ...], Entry]] = field(default_factory=list)

    @property
    def vocab(self) -> List[str]:
        return [words[0] for words in self.ngrams[0]]

    def counts(self) -> List[int]:
        return [len(table) for table in self.ngrams]


def _open_text(path: str):
    # Detect gzip by its magic bytes, not the name: recipes often drop the .gz suffix. utf-8-sig: a byte order
    # mark (editors on Windows write one) is read, not taken as part of the \data\ line.
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _lines(path: str) -> Iterator[Tuple[int, str]]:
    try:
        fh = _open_text(path)
    except OSError as exc:
        raise ArpaError(f"{path}: cannot open: {exc.strerror}") from exc
    with fh:
        try:
            for lineno, line in enumerate(fh, start=1):
                yield lineno, line.strip()
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise ArpaError(f"{path}: cannot read: {exc}") from exc


def _parse_float(text: str, path: str, lineno: int, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArpaError(f"{path}:{lineno}: {what} {_quote(text)} is not a number") from None
    if math.isnan(value):
        raise ArpaError(f"{path}:{lineno}: {what} is NaN")
    if math.isinf(value):  # inf - inf in the back-off sums scores garbage
        hint = " (write -99 for a probability of 0, as SRILM does)" if what == "log-probability" else ""
        raise ArpaError(f"{path}:{lineno}: {what} {text} is not finite{hint}")
    return value


def read_arpa(path: str | os.PathLike) -> ArpaLM:
    """Parse an ARPA file (plain text or gzip) into an :class:`ArpaLM` (log10 values).

    Checks the ``\\data\\`` counts against the sections, the number of fields per line,
    numbers (finite), positive log-probabilities, duplicate n-grams and the ``\\end\\`` marker.
    """
    path = os.fspath(path)
    lines = _lines(path)
    declared: Dict[int, int] = {}
    # Header: skip anything before \data\ (some tools write comments there).
    for lineno, line in lines:
        if line == "\\data\\":
            break
    else:
        raise ArpaError(f"{path}: no \\data\\ header; not an ARPA file")
    # lineno/line stay at the \data\ line when the file ends right after it (the error names that line).
    for lineno, line in lines:
        if not line:
            if declared:
                break
            continue
        m = _COUNT.match(line)
        if not m:
            if _SECTION.match(line):
                break
            raise ArpaError(f"{path}:{lineno}: expected 'ngram K=COUNT' in \\data\\, got {_quote(line)}")
        declared[int(m.group(1))] = int(m.group(2))
    if not declared:
        raise ArpaError(f"{path}:{lineno}: \\data\\ section declares no n-gram counts")
    order = max(declared)
    if sorted(declared) != list(range(1, order + 1)):
        raise ArpaError(f"{path}: \\data\\ declares orders {sorted(declared)}; expected 1..{order}")

    lm = ArpaLM(order=order, ngrams=[{} for _ in range(order)])
    current = 0  # order of the section being read; 0 = between sections
    pending = line if _SECTION.match(line) else None
    ended = False

    def open_section(text: str, at: int) -> int:
        k = int(_SECTION.match(text).group(1))  # type: ignore[union-attr]
        if k < 1 or k > order:
            raise ArpaError(f"{path}:{at}: section \\{k}-grams: but \\data\\ declares order {order}")
        if lm.ngrams[k - 1]:
            raise ArpaError(f"{path}:{at}: section \\{k}-grams: appears twice")
        return k

    if pending is not None:
        current = open_section(pending, lineno)
    for lineno, line in lines:
        if not line:
            continue
        if line.startswith("\\"):
            if _SECTION.match(line):
                current = open_section(line, lineno)
                continue
            if line == "\\end\\":
                ended = True
                break
            raise ArpaError(f"{path}:{lineno}: unexpected marker {_quote(line)}")
        if current == 0:
            raise ArpaError(f"{path}:{lineno}: n-gram line outside any \\K-grams: section")
        fields = line.split()
        k = current
        if len(fields) == k + 1:
            backoff = 0.0
        elif len(fields) == k + 2:
            if k == order:
                raise ArpaError(f"{path}:{lineno}: highest-order {k}-gram has a back-off weight")
            backoff = _parse_float(fields[-1], path, lineno, "back-off")
        else:
            raise ArpaError(f"{path}:{lineno}: a {k}-gram line needs {k + 1} or {k + 2} fields, "
                            f"got {len(fields)}: {_quote(line)}")
        prob = _parse_float(fields[0], path, lineno, "log-probability")
        if prob > 0.0:
            raise ArpaError(f"{path}:{lineno}: positive log10 probability {prob}")
        words = tuple(fields[1:k + 1])
        table = lm.ngrams[k - 1]
        if words in table:
            raise ArpaError(f"{path}:{lineno}: duplicate {k}-gram {_quote(' '.join(words))}")
        table[words] = (prob, backoff)
    if not ended:
        raise ArpaError(f"{path}: missing \\end\\ marker (truncated file?)")
    for k in range(1, order + 1):
        got = len(lm.ngrams[k - 1])
        if got != declared[k]:
            raise ArpaError(f"{path}: \\data\\ declares ngram {k}={declared[k]} but the "
                            f"\\{k}-grams: section has {got} entries")
    return lm
