"""Train a character or sentencepiece (BPE/unigram) tokenizer on a Kaldi text file."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from asrkit.data.table import TableError, read_table
from asrkit.text.tokenizer import CharTokenizer, Tokenizer, train_sentencepiece


def train_tokenizer(text_path: str, out_path: str, model_type: str = "char", vocab_size: int = 0,
                    plain_text: bool = False) -> Tokenizer:
    """Train on ``text_path`` (Kaldi ``utt words...`` lines, or plain lines) and save to ``out_path``."""
    if plain_text:
        with open(text_path, encoding="utf-8") as fh:
            texts = [line.strip() for line in fh if line.strip()]
    else:
        texts = [t for t in read_table(text_path).values() if t]
    if not texts:
        raise ValueError(f"{text_path}: no non-empty transcripts to train a tokenizer on")
    if model_type == "char":
        tok: Tokenizer = CharTokenizer.train(texts)
    else:
        if vocab_size <= 3:
            raise ValueError("--vocab-size must be > 3 for sentencepiece tokenizers")
        tok = train_sentencepiece(texts, vocab_size, model_type)
    tok.save(out_path)
    return tok


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train-tokenizer", description=__doc__)
    p.add_argument("--text", required=True, help="Kaldi text file (utt-id words...)")
    p.add_argument("--model-type", choices=["char", "bpe", "unigram"], default="char")
    p.add_argument("--vocab-size", type=int, default=0, help="sentencepiece vocabulary size (incl. 3 specials)")
    p.add_argument("--plain-text", action="store_true", help="--text has plain sentences, no utterance ids")
    p.add_argument("out", help="output tokenizer JSON")
    args = p.parse_args(argv)
    if args.model_type != "char" and args.vocab_size <= 0:
        p.error(f"--model-type {args.model_type} needs --vocab-size")
    try:
        tok = train_tokenizer(args.text, args.out, args.model_type, args.vocab_size, args.plain_text)
    except (ValueError, TableError, OSError) as exc:
        print(f"asrkit train-tokenizer: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {args.model_type} tokenizer, {tok.vocab_size} tokens")
    return 0
