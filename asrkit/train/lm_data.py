"""Text for neural LM training: reading a text file, tokenising it, length-bucketed sentence batches, loaders.

A text file is read like ``asrkit train-ngram`` reads it: Kaldi ``text`` (``utt-id words...``) by default,
one plain sentence per line with ``plain_text``. Empty lines (and Kaldi lines with an utterance id only)
are skipped and counted, not an error: a corpus with a few empty transcripts is still a good corpus.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import torch
from torch.utils.data import DataLoader

from asrkit.config import ConfigError, LMDataConfig
from asrkit.data.sampler import FRAMES_PER_SECOND, BucketBatchSampler
from asrkit.lm.neural import make_lm_batch
from asrkit.text.tokenizer import Tokenizer

# More than this share of <unk> tokens means the tokenizer was made for another text (or the text is
# read in the wrong format): training on it would only teach the LM to predict <unk>.
MAX_UNK_RATE = 0.5


@dataclass
class LMCorpus:
    """A tokenised text file: ``sentences`` are token id lists without <sos>/<eos>."""

    path: str
    sentences: List[List[int]]
    empty_lines: int  # skipped: no words
    too_long: int  # dropped: longer than data.max_len tokens (+1 for <eos>)
    unk_tokens: int

    @property
    def num_tokens(self) -> int:
        """Targets per pass: every token plus one <eos> per sentence."""
        return sum(len(s) + 1 for s in self.sentences)

    def summary(self) -> str:
        return (f"{self.path}: {len(self.sentences)} sentences, {self.num_tokens} tokens (incl. <eos>), "
                f"{self.empty_lines} empty lines skipped, {self.too_long} sentences over data.max_len dropped, "
                f"<unk> rate {self.unk_tokens / max(self.num_tokens, 1):.2%}")


def read_text(path: str, plain_text: bool = False) -> tuple[List[str], int]:
    """Sentences of a Kaldi text file (or a plain one) and the number of empty lines skipped."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: text file not found")
    texts: List[str] = []
    empty = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                words = line.split()
                words = words if plain_text else words[1:]  # Kaldi: the first field is the utterance id
                if words:
                    texts.append(" ".join(words))
                else:
                    empty += 1
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from exc
    if not texts:
        raise ValueError(f"{path}: no non-empty sentences to train an LM on ({empty} empty lines"
                         f"{'' if plain_text else '; Kaldi format: utt-id words..., or pass --plain-text'})")
    return texts, empty


def load_corpus(path: str, tokenizer: Tokenizer, tokenizer_path: str, plain_text: bool = False,
                max_len: int = 0) -> LMCorpus:
    """Read and tokenise ``path``; sentences longer than ``max_len`` tokens (+ <eos>) are dropped (0: keep all).

    Raises ValueError naming the file when nothing is left or the tokenizer does not fit the text.
    """
    texts, empty = read_text(path, plain_text)
    encoded = [tokenizer.encode(t) for t in texts]
    unk = sum(s.count(tokenizer.unk_id) for s in encoded)
    total = sum(len(s) + 1 for s in encoded)
    if unk > MAX_UNK_RATE * total:
        raise ValueError(f"{path}: {unk / total:.0%} of its tokens are <unk> under the tokenizer {tokenizer_path}: "
                         f"the tokenizer does not fit this text (another corpus or casing, or "
                         f"{'a Kaldi text read with --plain-text' if plain_text else 'the text is not Kaldi text'})")
    kept = [s for s in encoded if not max_len or len(s) + 1 <= max_len]
    if not kept:
        raise ValueError(f"{path}: every sentence is longer than data.max_len={max_len} tokens")
    return LMCorpus(path, kept, empty, len(encoded) - len(kept), unk)


def check_data_config(cfg: LMDataConfig) -> None:
    if min(cfg.max_tokens, cfg.max_batch_size, cfg.max_len, cfg.bucket_width) < 1:
        raise ConfigError("data.max_tokens, data.max_batch_size, data.max_len and data.bucket_width must be >= 1")
    if cfg.max_len > cfg.max_tokens:
        raise ConfigError(f"data.max_len {cfg.max_len} exceeds data.max_tokens {cfg.max_tokens}: such a sentence "
                          f"could not fit in a batch")


def sentence_batches(sentences: Sequence[Sequence[int]], cfg: LMDataConfig, shuffle: bool,
                     seed: int = 0) -> BucketBatchSampler:
    """Batches of sentence indices, padded cost (sentences x (longest + 1)) within ``data.max_tokens``,
    sharded over the initialised process group (one process: all of them).

    The ASR sampler does the work: it counts lengths in 10 ms frames, so a sentence of n tokens is
    given as n + 1 "frames" (its ys_in/ys_out length) and the bucket width likewise. Shuffled batches
    come from buckets of similar length in a new order each epoch (``set_epoch``); unshuffled ones
    are sorted by length (dev evaluation).
    """
    lengths = [(len(s) + 1) / FRAMES_PER_SECOND for s in sentences]
    return BucketBatchSampler(lengths, cfg.max_tokens, cfg.max_batch_size, shuffle=shuffle, seed=seed,
                              bucket_width=cfg.bucket_width / FRAMES_PER_SECOND)


def collate_sentences(sentences: Sequence[Sequence[int]]) -> Dict[str, Any]:
    """Token id lists -> the batch an LM's ``forward`` takes: ``ys_in``, ``ys_out`` (B, L) (see
    :func:`~asrkit.lm.neural.make_lm_batch`) and ``num_tokens``, their target count (<eos> included),
    which is what the trainer weighs the batch by."""
    ys_in, ys_out = make_lm_batch(sentences)
    return {"ys_in": ys_in, "ys_out": ys_out, "num_tokens": sum(len(s) + 1 for s in sentences)}


def lm_loader(corpus: LMCorpus, cfg: LMDataConfig, *, train: bool, seed: int,
              pin_memory: bool = False) -> DataLoader:
    """A DataLoader of :func:`collate_sentences` batches whose ``batch_sampler`` is :func:`sentence_batches`
    (shuffled when ``train``). Batching token lists is cheap, so no worker processes; the loader still gets a
    generator of its own, so that starting an epoch never draws from the global torch RNG (dropout's)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    sampler = sentence_batches(corpus.sentences, cfg, shuffle=train, seed=seed)
    return DataLoader(corpus.sentences, batch_sampler=sampler, collate_fn=collate_sentences, generator=generator,
                      pin_memory=pin_memory)
