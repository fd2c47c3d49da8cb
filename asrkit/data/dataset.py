"""Map-style ASR dataset over a Kaldi data dir, and the collate function that pads a batch.

Problems are found when the dataset is built, not hours into training:
utterances without an audio entry, with an empty transcript (when a tokenizer
is given) or with a duration outside ``[min_duration, max_duration]`` are
dropped and reported through the ``asrkit.data`` logger (count per reason and
the first few ids; the full lists are in :attr:`AsrDataset.dropped`).
Durations come from ``utt2dur`` or the segment bounds, else from audio headers.

Audio that turns out to be unreadable at load time does not stop training:
``__getitem__`` logs a warning naming the utterance and returns ``None``, and
:func:`collate` leaves it out and counts it in ``batch["num_skipped"]``.
"""
from __future__ import annotations

import logging
import math
import os
from collections import Counter
from typing import Dict, List, Optional, Protocol, Sequence, Tuple, Union

import torch
from torch.utils.data import Dataset

from asrkit.audio.io import AudioError, load_audio
from asrkit.data.datadir import DataDir, DataDirError, Utterance, compute_utt2dur, read_data_dir

log = logging.getLogger("asrkit.data")
TOKEN_PAD = -1  # padding value of batch["tokens"]
_EXAMPLES = 5  # ids shown per drop reason in the log


class TokenEncoder(Protocol):
    def encode(self, text: str) -> List[int]: ...


class AsrDataset(Dataset):
    """Items are ``{"utt", "wav" (T,) float32, "tokens" (L,) int64, "text"}``, or ``None`` if the audio is unreadable.

    ``datadir``: a :class:`DataDir` or its path. ``sample_rate``: audio is
    resampled to it. ``tokenizer``: anything with ``encode(text) -> list[int]``;
    without one, ``tokens`` is empty and utterances without text are kept
    (decoding). ``duration_jobs``: threads for reading missing durations.
    """

    def __init__(self, datadir: Union[DataDir, str, os.PathLike], sample_rate: int,
                 tokenizer: Optional[TokenEncoder] = None, *, min_duration: float = 0.0,
                 max_duration: float = math.inf, duration_jobs: int = 1):
        dd = datadir if isinstance(datadir, DataDir) else read_data_dir(datadir)
        self.name = dd.path or "data dir"
        self.sample_rate = sample_rate
        self.dropped: Dict[str, List[str]] = {}  # reason -> utterance ids
        candidates: List[Tuple[Utterance, List[int]]] = []
        utterances = list(dd.utterances())
        for u in utterances:
            if u.source is None:
                self._drop("no audio entry in wav.scp/segments", u.utt)
                continue
            tokens: List[int] = []
            if tokenizer is not None:
                tokens = self._encode(tokenizer, u)
                if not tokens:
                    self._drop("empty or missing transcript", u.utt)
                    continue
            candidates.append((u, tokens))
        durations, errors = self._durations(dd, candidates, duration_jobs)
        self.items: List[Tuple[Utterance, List[int]]] = []
        self._durs: List[float] = []
        for u, tokens in candidates:
            dur = durations.get(u.utt)
            if dur is None:
                self._drop("unreadable audio", u.utt)
            elif dur < min_duration:
                self._drop(f"shorter than min_duration {min_duration} s", u.utt)
            elif dur > max_duration:
                self._drop(f"longer than max_duration {max_duration} s", u.utt)
            else:
                self.items.append((u, tokens))
                self._durs.append(dur)
        for msg in list(errors.values())[:_EXAMPLES]:
            log.warning("%s", msg)
        self._report(len(utterances))

    def _drop(self, reason: str, utt: str) -> None:
        self.dropped.setdefault(reason, []).append(utt)

    @staticmethod
    def _encode(tokenizer: TokenEncoder, u: Utterance) -> List[int]:
        if not u.text:
            return []
        try:
            return list(tokenizer.encode(u.text))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"utt {u.utt}: cannot tokenize transcript {u.text!r}: {exc}") from exc

    @staticmethod
    def _durations(dd: DataDir, candidates: Sequence[Tuple[Utterance, List[int]]],
                   jobs: int) -> Tuple[Dict[str, float], Dict[str, str]]:
        known = {u.utt: u.duration for u, _ in candidates if u.duration is not None}
        missing = [u.utt for u, _ in candidates if u.duration is None]
        if not missing:
            return known, {}
        log.info("reading the durations of %d utterances from their audio (write utt2dur with "
                 "tools/compute_utt2dur.py to skip this)", len(missing))
        found, errors = compute_utt2dur(dd.subset(missing), jobs=jobs)
        return {**known, **found}, errors

    def _report(self, total: int) -> None:
        if self.dropped:
            parts = [f"{len(utts)} {reason} (e.g. {', '.join(utts[:_EXAMPLES])})"
                     for reason, utts in self.dropped.items()]
            n = sum(len(v) for v in self.dropped.values())
            log.warning("%s: dropped %d of %d utterances: %s", self.name, n, total, "; ".join(parts))
        if not self.items:
            raise DataDirError(f"{self.name}: no usable utterance left (of {total}); "
                               f"dropped: {', '.join(f'{len(v)} {k}' for k, v in self.dropped.items()) or 'none'}")

    def __len__(self) -> int:
        return len(self.items)

    def durations(self) -> List[float]:
        """Duration in seconds of each item, by index (for the batch sampler)."""
        return list(self._durs)

    def __getitem__(self, index: int) -> Optional[Dict[str, object]]:
        u, tokens = self.items[index]
        try:
            wav = load_audio(u.source, self.sample_rate, start=u.start, end=u.end, name=u.utt)  # (T,)
        except AudioError as exc:
            log.warning("skipping unreadable utterance: %s", exc)
            return None
        return {"utt": u.utt, "wav": wav, "tokens": torch.tensor(tokens, dtype=torch.long), "text": u.text or ""}


def collate(items: Sequence[Optional[Dict[str, object]]]) -> Dict[str, object]:
    """Pad a list of dataset items into a batch; ``None`` items are skipped and counted.

    Returns ``wav`` (B, Tmax) float32 zero-padded, ``wav_lens`` (B,) int64,
    ``tokens`` (B, Lmax) int64 padded with -1, ``token_lens`` (B,) int64,
    ``utts`` and ``texts`` (lists of B strings) and ``num_skipped`` (int).
    If every item was ``None`` the batch has B = 0 (tensors of shape (0, 0)
    and (0,)); the trainer skips such a batch. Items from an
    :class:`~asrkit.data.augmented.AugmentedDataset` add ``vtlp_alpha`` (B,)
    float32 and ``augmented`` (how many utterances each kind was applied to,
    with ``utts``: how many went through augmentation).
    """
    good = [it for it in items if it is not None]
    wav_lens = torch.tensor([it["wav"].shape[0] for it in good], dtype=torch.long)  # (B,)
    token_lens = torch.tensor([it["tokens"].shape[0] for it in good], dtype=torch.long)  # (B,)
    wav = torch.zeros(len(good), int(wav_lens.max()) if good else 0, dtype=torch.float32)  # (B, Tmax)
    tokens = torch.full((len(good), int(token_lens.max()) if good else 0), TOKEN_PAD, dtype=torch.long)  # (B, Lmax)
    for b, it in enumerate(good):
        wav[b, : wav_lens[b]] = it["wav"]
        tokens[b, : token_lens[b]] = it["tokens"]
    batch = {"wav": wav, "wav_lens": wav_lens, "tokens": tokens, "token_lens": token_lens,
             "utts": [it["utt"] for it in good], "texts": [it["text"] for it in good],
             "num_skipped": len(items) - len(good)}
    augmented = [it for it in good if "augmented" in it]
    if augmented:
        batch["vtlp_alpha"] = torch.tensor([float(it.get("vtlp_alpha", 1.0)) for it in good], dtype=torch.float32)
        batch["augmented"] = dict(Counter(kind for it in augmented for kind in it["augmented"]),
                                  utts=len(augmented))
    return batch
