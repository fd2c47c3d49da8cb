"""Train a back-off n-gram LM (ARPA) on a text file with KenLM's lmplz.

Word units: the LM's words are the transcript words (a word LM, applied at word boundaries
of any tokenizer). Token units: each transcript is first split into the tokenizer's pieces
(chars with "▁" for spaces, or sentencepiece pieces) and the LM is over those pieces.
lmplz is found in $ASRKIT_KENLM_BIN, then tools/kenlm/bin, then PATH; build it with
tools/install/install_kenlm.sh. The estimator is lmplz's modified Kneser-Ney; --discount_fallback
is passed by default so that tiny corpora (no singletons/doubletons) still train, and
--skip_symbols so that <s>, </s>, <unk> in the text are read as spaces.
Output ending in .gz is gzip-compressed.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from asrkit.atomic import atomic_write
from asrkit.data.table import TableError, iter_table

# tools/kenlm/bin of this checkout (filled by tools/install/install_kenlm.sh)
DEFAULT_KENLM_DIR = Path(__file__).resolve().parents[2] / "tools" / "kenlm" / "bin"


class KenlmNotFoundError(RuntimeError):
    """A KenLM program is not installed where asrkit looks for it."""


def find_kenlm_binary(name: str) -> str:
    """Path of a KenLM program (``lmplz``, ``build_binary``): $ASRKIT_KENLM_BIN, tools/kenlm/bin, PATH."""
    env = os.environ.get("ASRKIT_KENLM_BIN", "")
    for folder in ([Path(env)] if env else []) + [DEFAULT_KENLM_DIR]:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise KenlmNotFoundError(
        f"KenLM's {name} was not found (looked in $ASRKIT_KENLM_BIN={env or '<unset>'}, {DEFAULT_KENLM_DIR} "
        f"and PATH). Build it with tools/install/install_kenlm.sh (about a minute), or set ASRKIT_KENLM_BIN to the "
        f"folder that holds {name}.")


def read_sentences(text_path: str, plain_text: bool = False) -> List[str]:
    """Transcripts of a Kaldi text file (``utt words...``) or of a plain file, one sentence per line."""
    if plain_text:
        try:
            with open(text_path, encoding="utf-8") as fh:
                texts = [" ".join(line.split()) for line in fh]
        except OSError as exc:
            raise ValueError(f"{text_path}: cannot open: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{text_path}: not UTF-8 text: {exc}") from exc
    else:
        texts = [value for _, value, _ in iter_table(text_path)]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"{text_path}: no non-empty sentences to train an n-gram LM on")
    return texts


def to_pieces(texts: Sequence[str], tokenizer_path: str) -> List[str]:
    """Each sentence as space-separated tokenizer pieces (blank/sos-eos never appear)."""
    from asrkit.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    return [" ".join(tok.token_list[i] for i in tok.encode(t)) for t in texts]


def arpa_counts(path: str) -> Dict[int, int]:
    """The ``ngram K=COUNT`` lines of an ARPA header (reads only the header)."""
    opener = gzip.open if path.endswith(".gz") else open
    counts: Dict[int, int] = {}
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("ngram "):
                k, _, n = line[6:].partition("=")
                counts[int(k)] = int(n)
            elif line.startswith("\\1-grams:"):
                break
    return counts


def train_ngram(text_path: str, out_path: str, order: int, units: str = "word",
                tokenizer_path: Optional[str] = None, plain_text: bool = False,
                prune: Optional[Sequence[int]] = None, memory: str = "10%",
                discount_fallback: bool = True) -> Dict[int, int]:
    """Write an ARPA LM of ``order`` trained on ``text_path`` to ``out_path``; returns the n-gram counts."""
    if order < 1:
        raise ValueError(f"--order must be >= 1, got {order}")
    if units not in ("word", "token"):
        raise ValueError(f"--units must be 'word' or 'token', got '{units}'")
    if units == "token" and not tokenizer_path:
        raise ValueError("--units token needs --tokenizer (the LM is over its pieces)")
    lmplz = find_kenlm_binary("lmplz")
    texts = read_sentences(text_path, plain_text)
    if units == "token":
        texts = to_pieces(texts, tokenizer_path)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory(prefix="asrkit_lmplz_") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as fh:
            fh.write("\n".join(texts) + "\n")
        arpa = os.path.join(tmp, "lm.arpa")
        cmd = [lmplz, "-o", str(order), "--text", corpus, "--arpa", arpa, "-S", memory, "-T", tmp,
               "--skip_symbols"]
        if discount_fallback:
            cmd.append("--discount_fallback")
        if prune:
            cmd += ["--prune"] + [str(p) for p in prune]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"lmplz failed (exit {proc.returncode}) on {text_path}:\n{tail}")
        counts = arpa_counts(arpa)
        with open(arpa, "rb") as src, atomic_write(out_path, "wb") as fh:
            if out_path.endswith(".gz"):
                with gzip.GzipFile(fileobj=fh, mode="wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfileobj(src, fh)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train-ngram", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", type=int, required=True, help="n-gram order (e.g. 3 or 4)")
    p.add_argument("--text", required=True, help="Kaldi text file (utt-id words...), or plain lines with --plain-text")
    p.add_argument("--plain-text", action="store_true", help="--text has one sentence per line, no utterance ids")
    p.add_argument("--units", choices=["word", "token"], default="word",
                   help="LM over words (default) or over the tokenizer's pieces")
    p.add_argument("--tokenizer", help="tokenizer JSON (asrkit train-tokenizer); required with --units token")
    p.add_argument("--prune", type=int, nargs="+", metavar="COUNT",
                   help="lmplz --prune thresholds per order (e.g. 0 1 1 drops singleton bigrams and trigrams)")
    p.add_argument("--memory", default="10%", help="lmplz sort memory, -S (default: 10%% of RAM)")
    p.add_argument("--no-discount-fallback", action="store_true",
                   help="fail instead of using fallback discounts when Kneser-Ney estimation is impossible")
    p.add_argument("out", help="output ARPA file (.gz to compress)")
    args = p.parse_args(argv)
    if args.order < 1:
        p.error(f"--order must be >= 1, got {args.order}")
    if args.units == "token" and not args.tokenizer:
        p.error("--units token needs --tokenizer (the LM is over its pieces)")
    if args.prune and len(args.prune) > args.order:
        p.error(f"--prune has {len(args.prune)} thresholds for an order-{args.order} model")
    try:
        counts = train_ngram(args.text, args.out, args.order, args.units, args.tokenizer, args.plain_text,
                             args.prune, args.memory, not args.no_discount_fallback)
    except (KenlmNotFoundError, RuntimeError, ValueError, TableError, OSError) as exc:
        print(f"asrkit train-ngram: {exc}", file=sys.stderr)
        return 1
    summary = ", ".join(f"{k}-grams {n}" for k, n in sorted(counts.items()))
    print(f"wrote {args.out}: {args.units}-unit {args.order}-gram ({summary})")
    return 0
