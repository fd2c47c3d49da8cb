#!/usr/bin/env python3
"""Assemble the language-model training text: book text plus training transcripts, minus held-out sentences.

Usage:
    python tools/make_lm_text.py --out data/lm/text.txt [--corpus tools/corpus/lm_text.txt.gz] \\
        [--transcripts data/train/text] [--exclude data/dev/text data/test/text ...] [--word-list data/lm/words.txt]

Writes one sentence per line (no utterance ids; ``asrkit train-ngram --plain-text`` and
``asrkit train-lm --plain-text`` read it): every line of ``--corpus`` (plain text, ``.gz`` read as gzip), then
the text column of each ``--transcripts`` Kaldi file. Any sentence that is also the text of an utterance in an
``--exclude`` Kaldi file (the dev and test splits) is left out and counted, so an LM never saw a sentence it is
evaluated on. Sentences must be normalised like the transcripts (upper-case words, single spaces): a corpus
line with a lower-case letter is an error naming the file and line, since it could never match a transcript.
``--word-list`` also writes the sorted distinct words of the written text, one per line: the closed vocabulary of a
lexicon-constrained search (``decode.lexicon``).
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
from typing import IO, Iterator, List, Sequence, Set, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)  # run as a script from anywhere: asrkit lives in the repo root

from asrkit.data.table import TableError, iter_table  # noqa: E402

DEFAULT_CORPUS = os.path.join(_REPO, "tools", "corpus", "lm_text.txt.gz")


def _open_text(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def corpus_sentences(path: str) -> Iterator[Tuple[int, str]]:
    """(line number, sentence) for every non-empty line of a plain-text corpus."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            sentence = " ".join(line.split())
            if not sentence:
                continue
            if re.search(r"[a-z]", sentence):
                raise ValueError(f"{path}:{lineno}: lower-case text {sentence[:60]!r}: the LM text must be "
                                 "normalised like the transcripts (upper case)")
            yield lineno, sentence


def transcript_sentences(path: str) -> List[str]:
    """The text column of a Kaldi text file (utterances with an empty text are skipped)."""
    return [text for _, text, _ in iter_table(path, allow_empty_value=True) if text]


def _write_lines(path: str, lines: Sequence[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(path + ".tmp", path)


def make_lm_text(out_path: str, corpus: Sequence[str], transcripts: Sequence[str],
                 exclude: Sequence[str], word_list: str | None = None) -> Tuple[int, int, int]:
    """Write the LM text (and its vocabulary to ``word_list``); returns (sentences, words, sentences excluded)."""
    held_out: Set[str] = set()
    for path in exclude:
        held_out.update(transcript_sentences(path))
    written = words = excluded = 0
    vocabulary: Set[str] = set()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        sources: List[Iterator[str]] = [(s for _, s in corpus_sentences(p)) for p in corpus]
        sources += [iter(transcript_sentences(p)) for p in transcripts]
        for source in sources:
            for sentence in source:
                if sentence in held_out:
                    excluded += 1
                    continue
                out.write(sentence + "\n")
                written += 1
                tokens = sentence.split()
                words += len(tokens)
                vocabulary.update(tokens)
    if word_list is not None:
        _write_lines(word_list, sorted(vocabulary))
    os.replace(tmp, out_path)  # a killed run never leaves a half-written file that looks complete
    return written, words, excluded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output text file, one sentence per line")
    parser.add_argument("--corpus", nargs="*", default=[DEFAULT_CORPUS],
                        help="plain-text corpora (.gz read as gzip; default: tools/corpus/lm_text.txt.gz)")
    parser.add_argument("--transcripts", nargs="*", default=[], help="Kaldi text files whose text is added")
    parser.add_argument("--exclude", nargs="*", default=[],
                        help="Kaldi text files of held-out splits: their sentences are never written")
    parser.add_argument("--word-list", help="also write the text's distinct words here, sorted, one per line")
    args = parser.parse_args(argv)
    for path in [*args.corpus, *args.transcripts, *args.exclude]:
        if not os.path.isfile(path):
            parser.error(f"no such file: {path}")
    try:
        written, words, excluded = make_lm_text(args.out, args.corpus, args.transcripts, args.exclude,
                                               args.word_list)
    except (ValueError, TableError) as e:
        print(f"make_lm_text.py: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {written} sentences, {words} words ({excluded} held-out sentences left out)"
          + (f"; {args.word_list}: the distinct words" if args.word_list else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
