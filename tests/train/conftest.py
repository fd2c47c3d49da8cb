"""Fixtures for the trainer tests."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from asrkit.text.tokenizer import CharTokenizer
from trainkit import WORDS, make_data_dir


@pytest.fixture
def corpus(tmp_path) -> Dict[str, Path]:
    """train (8 utts), dev (4 utts) and a char tokenizer covering WORDS."""
    train = make_data_dir(tmp_path / "train", 8, seed=1)
    dev = make_data_dir(tmp_path / "dev", 4, seed=2)
    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(WORDS).save(tok)
    return {"train": train, "dev": dev, "tokenizer": tok, "root": tmp_path}


@pytest.fixture
def equal_lengths(tmp_path):
    """Four utterances of the same length (no padding, so any batching computes the same thing)."""
    data = make_data_dir(tmp_path / "eq", 4, seed=5, durations=[0.8] * 4)
    tok = tmp_path / "tok.json"
    CharTokenizer.train(["ABCDEF "]).save(tok)
    return {"train": data, "dev": data, "tokenizer": tok}
