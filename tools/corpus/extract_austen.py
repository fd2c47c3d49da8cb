#!/usr/bin/env python3
"""Rebuild tools/corpus/sentences.txt from Jane Austen's novels (one-off; not used at run time).

The committed ``sentences.txt`` is the source of truth; this script only records how it was made
so the extraction can be checked and repeated. The novels come from the Debian package
``r-cran-janeaustenr`` (an R data package; the novels themselves are public domain), read without R:

    apt-get download r-cran-janeaustenr
    dpkg-deb -x r-cran-janeaustenr_*.deb /tmp/janeausten
    python tools/corpus/extract_austen.py \\
        --rdata-dir /tmp/janeausten/usr/lib/R/site-library/janeaustenr/data \\
        --max-sentences 5000 --seed 0 > tools/corpus/sentences.txt

Steps: decode the R lazy-load database (each novel is a character vector of text lines), join
paragraphs, drop headings, split sentences at ``. ! ?`` followed by a capitalised word, expand
Mr/Mrs/Dr, normalise to upper-case A-Z, apostrophes and single spaces, drop any sentence holding
digits or characters that cannot be normalised, keep 4-20 words, dedupe, and sample a fixed
number of sentences with a seeded RNG (kept in book order).
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
import re
import struct
import sys
import zlib
from typing import Dict, Iterator, List, Tuple

BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")

_STRSXP = 16


def _read_index(rdx_path: str) -> Dict[str, Tuple[int, int]]:
    """Map object name -> (offset, length) in the .rdb file.

    The .rdx is a gzip'd R serialisation of a list whose ``variables`` element is a named list of
    integer pairs; rather than implement the full format we read the pairs and names in order,
    which is all this package's index holds.
    """
    data = gzip.decompress(open(rdx_path, "rb").read())
    pairs = [struct.unpack(">ii", data[m.end():m.end() + 8])
             for m in re.finditer(rb"\x00\x00\x00\x0d\x00\x00\x00\x02", data)]
    names = [m.group(1).decode() for m in re.finditer(rb"\x00\x04\x00\x09\x00\x00\x00.([a-z]+)", data, re.S)]
    names = [n for n in names if n in BOOKS]
    if len(names) != len(BOOKS) or len(pairs) < len(names):
        raise ValueError(f"{rdx_path}: unexpected index layout (names {names})")
    return dict(zip(names, pairs))


def _read_character_vector(rdb_path: str, offset: int, length: int) -> List[str]:
    """Decode one zlib-compressed, XDR-serialised R character vector from the lazy-load database."""
    with open(rdb_path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(length)
    raw = zlib.decompress(chunk[4:])  # first 4 bytes: uncompressed length
    if raw[:2] != b"X\n":
        raise ValueError(f"{rdb_path}@{offset}: not an XDR serialisation")
    pos = 2
    version = struct.unpack(">i", raw[pos:pos + 4])[0]
    pos += 12  # version, writer version, minimal reader version
    if version == 3:
        pos += 4 + struct.unpack(">i", raw[pos:pos + 4])[0]  # native encoding name
    flags, count = struct.unpack(">ii", raw[pos:pos + 8])
    pos += 8
    if flags & 0xFF != _STRSXP:
        raise ValueError(f"{rdb_path}@{offset}: expected a character vector, got SEXP type {flags & 0xFF}")
    lines = []
    for _ in range(count):
        _, n = struct.unpack(">ii", raw[pos:pos + 8])
        pos += 8
        if n < 0:  # NA_character_
            lines.append("")
            continue
        lines.append(raw[pos:pos + n].decode("utf-8"))
        pos += n
    return lines


def _paragraphs(lines: List[str]) -> Iterator[str]:
    """Join wrapped lines into paragraphs, skipping headings (all-caps lines such as CHAPTER I)."""
    buf: List[str] = []
    for line in lines + [""]:
        line = line.strip()
        if line:
            buf.append(line)
            continue
        if buf:
            para = " ".join(buf)
            buf = []
            if para.upper() != para:  # headings and titles are all upper case
                yield para


_ABBREV = {"Mr": "Mister", "Mrs": "Missus", "Dr": "Doctor"}
# A sentence ends at . ! ? (maybe followed by closing quotes) when the next word is capitalised.
_SPLIT = re.compile(r"(?<=[.!?])[\"']*\s+(?=[\"']*[A-Z])")


def _sentences(paragraph: str) -> Iterator[str]:
    text = paragraph.replace("_", "")  # _word_ marks italics
    text = re.sub(r"\b(Mrs|Mr|Dr)\.?(?=\s)", lambda m: _ABBREV[m.group(1)], text)
    for sent in _SPLIT.split(text):
        yield sent.strip()


def normalise(sentence: str) -> str | None:
    """Upper-case A-Z, apostrophes inside words and single spaces; None if the sentence can't be kept."""
    if re.search(r"[0-9&*\[\]£]|\bSt\b", sentence):
        return None
    text = re.sub(r"-+", " ", sentence)  # dashes join clauses or compound words: speak as separate words
    text = re.sub(r"[\"!?.,;:()]", " ", text)
    words = []
    for word in text.split():
        word = word.strip("'")  # quote marks, not apostrophes
        if not word:
            continue
        if not re.fullmatch(r"[A-Za-z]+(?:'[A-Za-z]+)*", word):
            return None  # accented or otherwise odd characters: drop rather than guess a spelling
        words.append(word.upper())
    return " ".join(words)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rdata-dir", required=True, help="janeaustenr/data directory (Rdata.rdb, Rdata.rdx)")
    parser.add_argument("--min-words", type=int, default=4)
    parser.add_argument("--max-words", type=int, default=20)
    parser.add_argument("--max-sentences", type=int, default=5000, help="0: every sentence, in book order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", help="file of sentences (one per line, normalised) to leave out, e.g. "
                        "sentences.txt when making the LM text, so that no test sentence is in it")
    args = parser.parse_args(argv)
    excluded = set()
    if args.exclude:
        with open(args.exclude, encoding="utf-8") as f:
            excluded = {line.strip() for line in f if line.strip()}

    index = _read_index(os.path.join(args.rdata_dir, "Rdata.rdx"))
    seen = set()
    kept: List[str] = []
    for book in BOOKS:
        lines = _read_character_vector(os.path.join(args.rdata_dir, "Rdata.rdb"), *index[book])
        for para in _paragraphs(lines):
            for sent in _sentences(para):
                # Only whole sentences: capitalised start, terminal punctuation at the end.
                if not re.match(r"^[\"']*[A-Z]", sent) or not re.search(r"[.!?][\"']*$", sent):
                    continue
                norm = normalise(sent)
                if norm is None or norm in seen or norm in excluded:
                    continue
                if not args.min_words <= len(norm.split()) <= args.max_words:
                    continue
                seen.add(norm)
                kept.append(norm)
    if args.max_sentences == 0:
        chosen = list(range(len(kept)))
    else:
        rng = random.Random(args.seed)
        chosen = sorted(rng.sample(range(len(kept)), min(args.max_sentences, len(kept))))
    print(f"{len(kept)} candidate sentences, writing {len(chosen)}", file=sys.stderr)
    for i in chosen:
        print(kept[i])
    return 0


if __name__ == "__main__":
    sys.exit(main())
