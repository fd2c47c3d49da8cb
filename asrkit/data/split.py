"""Split a Kaldi data dir into N shards for parallel jobs (what Kaldi's ``split_data.sh`` does).

Shards are **contiguous ranges of the sorted utterance ids**, as in Kaldi, so that concatenating the
shards' outputs in shard order gives the whole dir's outputs in utterance order. Unlike
``split_data.sh --per-utt``, the cut points balance **total audio duration** rather than the number of
utterances: every shard's duration is within one utterance of ``total / N``. Durations come from
``utt2dur``, the segment bounds, or the audio headers (read only for utterances that need them); an
utterance whose duration cannot be read (a missing or corrupt file) counts as the mean of the others, so
its shard still decodes it (and reports it as failed).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

from asrkit.data.datadir import DataDir, DataDirError, compute_utt2dur


def utterance_durations(dd: DataDir, jobs: int = 1) -> Dict[str, float]:
    """Seconds per utterance of ``dd.all_utts()``; unreadable ones (and ids without audio) get the mean of the
    readable ones (1.0 if none)."""
    known, _errors = compute_utt2dur(dd, only_missing=True, jobs=jobs)
    utts = dd.all_utts()
    fill = sum(known.values()) / len(known) if known else 1.0
    # a negative or zero duration (bad segment) must not pull a cut point backwards
    return {u: max(known.get(u, fill), 1e-3) for u in utts}


def balanced_ranges(utts: Sequence[str], durations: Mapping[str, float], n: int) -> List[List[str]]:
    """``utts`` (in the given order) cut into ``n`` non-empty contiguous ranges of about equal total duration.

    Shard ``k`` (0-based) ends at the first utterance whose cumulative duration reaches ``(k + 1) / n`` of
    the total, kept non-empty and leaving at least one utterance for each later shard.
    """
    if n < 1:
        raise DataDirError(f"cannot split into {n} shards")
    if n > len(utts):
        raise DataDirError(f"cannot split {len(utts)} utterances into {n} non-empty shards")
    total = float(sum(durations[u] for u in utts))
    out: List[List[str]] = []
    begin, acc = 0, 0.0
    for i, u in enumerate(utts):
        acc += durations[u]
        k = len(out)
        if k == n - 1:
            break  # the last shard takes the rest
        remaining_shards = n - k - 1
        # cut after utterance i when this shard reached its share, or when the later shards need every
        # remaining utterance to stay non-empty
        if acc >= total * (k + 1) / n or len(utts) - (i + 1) == remaining_shards:
            out.append(list(utts[begin: i + 1]))
            begin = i + 1
    out.append(list(utts[begin:]))
    return out


def split_data_dir(dd: DataDir, n: int, jobs: int = 1) -> List[DataDir]:
    """``dd`` as ``n`` sub data dirs: contiguous sorted-id ranges balanced by duration (see the module doc).

    Every id any table names is kept (one without audio too: its shard reports it as failed, as a decode of
    the whole dir does). Raises DataDirError when ``dd`` has fewer utterances than ``n``.
    """
    utts = dd.all_utts()
    if not utts:
        raise DataDirError(f"{dd.path or 'data dir'}: no utterances to split")
    durations = utterance_durations(dd, jobs)
    try:
        ranges = balanced_ranges(utts, durations, n)
    except DataDirError as exc:
        raise DataDirError(f"{dd.path or 'data dir'}: {exc}") from None
    return [dd.subset(r) for r in ranges]
