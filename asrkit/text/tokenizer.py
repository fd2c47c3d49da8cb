"""Tokenizers: characters or sentencepiece (unigram/BPE), with fixed special ids.

Every tokenizer has ``<blank>`` = 0 (CTC blank), ``<unk>`` = 1 and
``<sos/eos>`` = 2, then its own symbols. Word boundaries use sentencepiece's
marker ``▁`` (U+2581): the char tokenizer spells a space as the token ``▁``,
and a sentencepiece piece that starts with ``▁`` begins a word. A tokenizer is
saved as one JSON file (a sentencepiece model is embedded in it, base64), so an
experiment directory needs no other file to decode.
"""
from __future__ import annotations

import base64
import json
import os
from typing import Iterable, List, Protocol, Sequence

from asrkit.atomic import atomic_write

BLANK, UNK, SOS_EOS = "<blank>", "<unk>", "<sos/eos>"
SPECIALS = (BLANK, UNK, SOS_EOS)
# The special ids, defined here only: models, LMs and the pipeline import them. (search/ imports torch
# only, so its functions take the ids as arguments, with these values as defaults.)
BLANK_ID, UNK_ID, SOS_EOS_ID = 0, 1, 2
WORD_MARK = "\u2581"


class Tokenizer(Protocol):
    blank_id: int
    unk_id: int
    sos_eos_id: int
    token_list: List[str]

    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> List[int]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def save(self, path: str | os.PathLike) -> None: ...


class _Base:
    blank_id, unk_id, sos_eos_id = BLANK_ID, UNK_ID, SOS_EOS_ID
    token_list: List[str]

    @property
    def vocab_size(self) -> int:
        return len(self.token_list)

    def pieces(self, ids: Iterable[int]) -> List[str]:
        return [self.token_list[i] for i in ids]

    def _join(self, ids: Iterable[int]) -> str:
        text = "".join(self.token_list[i] for i in ids if i >= len(SPECIALS) or i == self.unk_id)
        return " ".join(text.replace(WORD_MARK, " ").split())


class CharTokenizer(_Base):
    """One token per character; the space is ``▁``. Unknown characters map to ``<unk>``."""

    def __init__(self, chars: Sequence[str]):
        chars = [c for c in chars if c not in SPECIALS]
        if len(set(chars)) != len(chars):
            raise ValueError("duplicate characters in char tokenizer symbols")
        self.token_list = list(SPECIALS) + list(chars)
        self._index = {c: i for i, c in enumerate(self.token_list)}

    @classmethod
    def train(cls, texts: Iterable[str]) -> "CharTokenizer":
        chars = set()
        for t in texts:
            chars.update(" ".join(t.split()))
        chars.discard(" ")
        return cls([WORD_MARK] + sorted(chars))

    def encode(self, text: str) -> List[int]:
        text = " ".join(text.split()).replace(" ", WORD_MARK)
        return [self._index.get(c, self.unk_id) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return self._join(ids)

    def save(self, path: str | os.PathLike) -> None:
        _write_json(path, {"kind": "char", "tokens": self.token_list[len(SPECIALS):]})


class SentencePieceTokenizer(_Base):
    """Wraps a sentencepiece model trained with asrkit's special-id layout (see :func:`train_sentencepiece`)."""

    def __init__(self, model_proto: bytes):
        import sentencepiece as spm

        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.token_list = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        if tuple(self.token_list[:3]) != SPECIALS:
            raise ValueError(f"sentencepiece model has special pieces {self.token_list[:3]}, expected {list(SPECIALS)}")

    def encode(self, text: str) -> List[int]:
        return list(self._sp.encode(" ".join(text.split()), out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        return self._join(ids)

    def save(self, path: str | os.PathLike) -> None:
        _write_json(path, {"kind": "sentencepiece", "model": base64.b64encode(self._proto).decode("ascii")})


def train_sentencepiece(texts: Iterable[str], vocab_size: int, model_type: str = "bpe",
                        character_coverage: float = 1.0) -> SentencePieceTokenizer:
    """Train a sentencepiece model in memory with ``<blank>``=0, ``<unk>``=1, ``<sos/eos>``=2."""
    import io

    import sentencepiece as spm

    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got '{model_type}'")
    sentences = [" ".join(t.split()) for t in texts if t.strip()]
    if not sentences:
        raise ValueError("no non-empty training text for the tokenizer")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=buf, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, pad_id=0, pad_piece=BLANK, unk_id=1, unk_piece=UNK,
        bos_id=-1, eos_id=-1, user_defined_symbols=[SOS_EOS], hard_vocab_limit=False,
        split_digits=True, minloglevel=2)
    return SentencePieceTokenizer(buf.getvalue())


def _write_json(path: str | os.PathLike, obj: dict) -> None:
    with atomic_write(path) as fh:
        json.dump(obj, fh, ensure_ascii=False)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer JSON written by ``Tokenizer.save``."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read tokenizer: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not an asrkit tokenizer file (a JSON object with a 'kind' is expected)")
    kind = obj.get("kind")
    if kind not in ("char", "sentencepiece"):
        shown = repr(kind) if len(repr(kind)) <= 40 else repr(kind)[:37] + "..."  # quote the file only briefly
        raise ValueError(f"{path}: unknown tokenizer kind {shown} (expected 'char' or 'sentencepiece')")
    entry = "tokens" if kind == "char" else "model"
    if entry not in obj:
        raise ValueError(f"{path}: a {kind} tokenizer file needs a '{entry}' entry; there is no '{entry}'")
    if kind == "char":
        tokens = obj["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{path}: 'tokens' must be a list of strings")
        try:
            return CharTokenizer(tokens)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    try:
        proto = base64.b64decode(obj["model"], validate=True)
    except (TypeError, ValueError):  # binascii.Error is a ValueError
        raise ValueError(f"{path}: 'model' is not a base64-encoded sentencepiece model") from None
    try:
        return SentencePieceTokenizer(proto)
    except RuntimeError:  # sentencepiece's parse error: a C++ source location, nothing to act on
        raise ValueError(f"{path}: the sentencepiece model in it is corrupt (sentencepiece cannot parse it)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
