#!/usr/bin/env python3
"""Build the tokenizers and n-gram LMs that tools/bench/bench_decode.py uses in its text mode.

Usage: tools/bench/make_bench_lm.py [--out exp/bench_decode] [--text tools/corpus/sentences.txt]
                              [--heldout 1000] [--order 4] [--bpe-size 500] [--force]

The last --heldout sentences of --text are kept out of every tokenizer and LM and written to
OUT/heldout.txt: the benchmark builds its utterances from them, so the LMs never saw the test
text. From the other sentences (OUT/train.txt) it writes

  OUT/char/tokenizer.json     asrkit train-tokenizer --model-type char
  OUT/char/4gram.arpa         asrkit train-ngram --units token (an LM over the char tokens)
  OUT/bpe500/tokenizer.json   asrkit train-tokenizer --model-type bpe --vocab-size 500
  OUT/bpe500/4gram.arpa       asrkit train-ngram --units token (an LM over the BPE pieces)
  OUT/word_4gram.arpa         asrkit train-ngram --units word

through the same Python functions as those subcommands (KenLM's lmplz: tools/install/install_kenlm.sh).
Existing outputs are kept unless --force. Takes a few seconds.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from asrkit.cli.train_ngram import KenlmNotFoundError, train_ngram  # noqa: E402
from asrkit.cli.train_tokenizer import train_tokenizer  # noqa: E402

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_lines(path: str, lines: List[str]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def build(out: str, text: str, heldout: int, order: int, bpe_size: int, force: bool) -> None:
    with open(text, encoding="utf-8") as fh:
        sentences = [" ".join(line.split()) for line in fh if line.strip()]
    if heldout >= len(sentences):
        raise ValueError(f"--heldout {heldout} leaves no training sentences ({len(sentences)} in {text})")
    os.makedirs(out, exist_ok=True)
    train_txt, heldout_txt = os.path.join(out, "train.txt"), os.path.join(out, "heldout.txt")
    _write_lines(train_txt, sentences[:len(sentences) - heldout])
    _write_lines(heldout_txt, sentences[len(sentences) - heldout:])
    print(f"{train_txt}: {len(sentences) - heldout} sentences; {heldout_txt}: {heldout}")

    def need(path: str) -> bool:
        return force or not os.path.exists(path)

    for name, kind, size in (("char", "char", 0), (f"bpe{bpe_size}", "bpe", bpe_size)):
        tok_path = os.path.join(out, name, "tokenizer.json")
        os.makedirs(os.path.dirname(tok_path), exist_ok=True)
        if need(tok_path):
            tok = train_tokenizer(train_txt, tok_path, kind, size, plain_text=True)
            print(f"{tok_path}: {kind} tokenizer, {tok.vocab_size} tokens")
        lm_path = os.path.join(out, name, f"{order}gram.arpa")
        if need(lm_path):
            counts = train_ngram(train_txt, lm_path, order, "token", tok_path, plain_text=True)
            print(f"{lm_path}: token {order}-gram {counts}")
    word_path = os.path.join(out, f"word_{order}gram.arpa")
    if need(word_path):
        counts = train_ngram(train_txt, word_path, order, "word", plain_text=True)
        print(f"{word_path}: word {order}-gram {counts}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="make_bench_lm.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="exp/bench_decode", help="output folder (default: exp/bench_decode)")
    p.add_argument("--text", default=os.path.join(TOOLS, "corpus", "sentences.txt"),
                   help="plain sentences, one per line (default: tools/corpus/sentences.txt)")
    p.add_argument("--heldout", type=int, default=1000, help="last sentences kept for the benchmark inputs")
    p.add_argument("--order", type=int, default=4)
    p.add_argument("--bpe-size", type=int, default=500)
    p.add_argument("--force", action="store_true", help="rebuild outputs that exist")
    args = p.parse_args(argv)
    try:
        build(args.out, args.text, args.heldout, args.order, args.bpe_size, args.force)
    except (KenlmNotFoundError, RuntimeError, ValueError, OSError) as exc:
        print(f"make_bench_lm.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
