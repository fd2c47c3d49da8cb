"""Tar shards for data at scale: writing them from a Kaldi data dir, and streaming training batches from them.

Format (WebDataset conventions, so any WebDataset/tar tool reads it): ``shard-000000.tar``, ... each hold
``NNNNNN.flac`` (16-bit FLAC at the index's sample rate) and ``NNNNNN.json`` (``{"utt", "text"}``) per
utterance, keyed by position (Kaldi ids may hold dots, which WebDataset would take for extensions);
``shards.json`` beside them indexes every shard's utterances (key, id, samples, text). The index lets
every rank plan the whole epoch from metadata alone, without reading audio.

Reading (``WebDataset``'s ``tarfile_samples``: local paths, ``pipe:cmd`` and URLs alike) is sequential.
Each epoch (seeded by ``seed + epoch``, the same on every rank) the shard order is shuffled and shard
``k`` of it goes to rank ``k % world_size``; a rank's shards go to its DataLoader workers the same way,
so each shard is read by exactly one (rank, worker) pair per epoch. A worker reads its shards in order
through a bucketing buffer of ``buffer_size`` utterances: shuffled, stable-sorted by length bucket,
packed by padded frames exactly like :class:`~asrkit.data.sampler.BucketBatchSampler`, batch order
shuffled. The DataLoader then takes the workers' batches in turn.

Equal steps per rank: the plan tells every rank how many batches each rank makes this epoch; a rank
with fewer than the most pads its epoch with empty batches (B = 0), which the trainer counts as
nothing while keeping DDP's collectives in step. No utterance is dropped or repeated, at the cost of
a few idle steps on short ranks (shards of about equal size keep them few).
"""
from __future__ import annotations

import io
import json
import logging
import os
import random
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import soundfile as sf
import torch
from torch.utils.data import IterableDataset, get_worker_info
from tqdm import tqdm

from asrkit.audio.io import AudioError, load_audio, resample
from asrkit.data.datadir import DataDirError, read_data_dir
from asrkit.data.dataset import collate
from asrkit.data.sampler import FRAMES_PER_SECOND, pack_batches
from asrkit.extras import require

log = logging.getLogger("asrkit.data")
INDEX_FILE = "shards.json"
FORMAT = "asrkit-shards/1"


class ShardError(ValueError):
    """A shard set that cannot be used; the message names the file (and utterance)."""


@dataclass(frozen=True)
class ShardEntry:
    key: str  # the member name stem inside the tar
    utt: str
    num_samples: int
    text: str


@dataclass(frozen=True)
class Shard:
    url: str  # a path, URL or "pipe:cmd" WebDataset can open
    entries: Tuple[ShardEntry, ...]


@dataclass(frozen=True)
class ShardSet:
    sample_rate: int
    shards: Tuple[Shard, ...]


# ------------------------------------------------------------------------------------------------ writing
def write_shards(data_dir: str, out_dir: str, utts_per_shard: int, sample_rate: int = 16000,
                 shuffle_seed: Optional[int] = 0, progress: bool = True) -> ShardSet:
    """Write the utterances of the Kaldi dir ``data_dir`` as tar shards of ``utts_per_shard`` utterances plus
    ``shards.json`` into ``out_dir``, in an order shuffled by ``shuffle_seed`` (None: the dir's order; a
    shuffle spreads long and short utterances over the shards). Audio is resampled to ``sample_rate``; an
    utterance without audio entry or text, or with unreadable audio, is an error naming it."""
    wds = require("webdataset", "writing shards")  # the format's reference writer

    if utts_per_shard < 1:
        raise ValueError(f"utts_per_shard must be at least 1, got {utts_per_shard}")
    utts = list(read_data_dir(data_dir).utterances())
    if not utts:
        raise DataDirError(f"{data_dir}: no utterances")
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(utts)
    os.makedirs(out_dir, exist_ok=True)
    index: List[Dict[str, object]] = []
    bar = tqdm(total=len(utts), desc="shards", disable=not progress, unit="utt")
    for first in range(0, len(utts), utts_per_shard):
        name = f"shard-{len(index):06d}.tar"
        rows = []
        tmp = os.path.join(out_dir, name + ".tmp")
        with wds.TarWriter(tmp, encoder=False, mtime=0) as tar:
            for pos, u in enumerate(utts[first:first + utts_per_shard]):
                if u.source is None or not u.text:
                    raise DataDirError(f"{data_dir}: utt {u.utt}: no {'audio entry' if u.source is None else 'text'}")
                try:
                    wav = load_audio(u.source, sample_rate, start=u.start, end=u.end, name=u.utt)  # (T,)
                except AudioError as exc:
                    raise DataDirError(f"{data_dir}: {exc}") from None
                flac = io.BytesIO()
                sf.write(flac, wav.clamp(-1.0, 1.0).numpy(), sample_rate, format="FLAC", subtype="PCM_16")
                key = f"{pos:06d}"
                meta = json.dumps({"utt": u.utt, "text": u.text}, ensure_ascii=False).encode("utf-8")
                tar.write({"__key__": key, "flac": flac.getvalue(), "json": meta})
                rows.append([key, u.utt, int(wav.numel()), u.text])
                bar.update(1)
        os.replace(tmp, os.path.join(out_dir, name))  # a kill mid-shard leaves no truncated .tar
        index.append({"name": name, "utts": rows})
    bar.close()
    tmp = os.path.join(out_dir, INDEX_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "sample_rate": sample_rate, "shards": index}, f, ensure_ascii=False)
    os.replace(tmp, os.path.join(out_dir, INDEX_FILE))
    return read_shard_set(out_dir)


# ------------------------------------------------------------------------------------------------ index
def is_shard_spec(path: str) -> bool:
    """Is ``path`` a shard set (a dir holding ``shards.json``, or a ``.tar`` name/brace pattern)?"""
    return os.path.isfile(os.path.join(path, INDEX_FILE)) or ".tar" in os.path.basename(path)


def read_shard_set(spec: str) -> ShardSet:
    """The shards of ``spec``: a directory written by :func:`write_shards` (all its shards), or a brace
    pattern such as ``DIR/shard-{000000..000009}.tar`` (those shards; ``shards.json`` is read from DIR)."""
    import braceexpand  # a WebDataset dependency

    if os.path.isdir(spec):
        root, names = spec, None
    else:
        root = os.path.dirname(spec) or "."
        names = [os.path.basename(p) for p in braceexpand.braceexpand(spec)]
    path = os.path.join(root, INDEX_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ShardError(f"{path}: no shard index (write the shards with tools/make_shards.py)") from None
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: not a shard index ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ShardError(f"{path}: format {data.get('format') if isinstance(data, dict) else None!r}, "
                         f"expected {FORMAT!r}")
    by_name = {}
    for s in data["shards"]:
        try:
            entries = tuple(ShardEntry(str(k), str(u), int(n), str(t)) for k, u, n, t in s["utts"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardError(f"{path}: shard {s.get('name')!r}: bad utterance row ({exc})") from None
        by_name[s["name"]] = Shard(os.path.join(root, s["name"]), entries)
    missing = [n for n in names or () if n not in by_name]
    if missing:
        raise ShardError(f"{spec}: {len(missing)} shards not in {path} (e.g. {', '.join(missing[:3])})")
    shards = tuple(by_name[n] for n in (names if names is not None else by_name))
    if not shards:
        raise ShardError(f"{spec}: no shards")
    return ShardSet(int(data["sample_rate"]), shards)


# ------------------------------------------------------------------------------------------------ planning
def assign_shards(num_shards: int, epoch: int, seed: int, world_size: int,
                  num_workers: int) -> List[List[List[int]]]:
    """``[rank][worker] -> shard indices`` for ``epoch``: each shard exactly once (see the module docstring)."""
    order = list(range(num_shards))
    random.Random(seed + epoch).shuffle(order)
    per_rank = [order[r::world_size] for r in range(world_size)]
    return [[shards[w::num_workers] for w in range(num_workers)] for shards in per_rank]


def bucket_stream(items: Sequence[int], frames: Sequence[int], buffer_size: int, max_frames: int,
                  max_batch_size: int, bucket_frames: int, rng: random.Random) -> List[List[List[int]]]:
    """Batches of ``items`` (indices into ``frames``, in stream order) through a bucketing buffer: each
    window of ``buffer_size`` items is shuffled, stable-sorted by ``frames // bucket_frames``, packed
    with :func:`~asrkit.data.sampler.pack_batches` and its batches shuffled. Returns one list of batches
    per window (a reader needs a window's items in memory before it can yield its batches)."""
    windows = []
    for first in range(0, len(items), buffer_size):
        window = list(items[first:first + buffer_size])
        rng.shuffle(window)
        window.sort(key=lambda i: frames[i] // bucket_frames)  # stable: random within a bucket
        batches = pack_batches(window, frames, max_frames, max_batch_size)
        rng.shuffle(batches)
        windows.append(batches)
    return windows


def round_robin_skips(counts: Sequence[int], consumed: int) -> Tuple[List[int], int]:
    """For a DataLoader that takes its workers' batches in turn (passing over a worker that has run out):
    how many of each worker's batches are among the first ``consumed``, and the worker whose turn is next
    (for mid-epoch resume: started with that worker first, the loader continues the same sequence)."""
    skips, last = [0] * len(counts), -1
    left = consumed
    while left > 0 and any(s < c for s, c in zip(skips, counts)):
        for w, c in enumerate(counts):
            if left and skips[w] < c:
                skips[w] += 1
                left -= 1
                last = w
    return skips, (last + 1) % max(1, len(counts))


class ShardStream(IterableDataset):
    """One rank's training batches (collated, as :func:`~asrkit.data.dataset.collate` makes them) from a
    :class:`ShardSet`. ``tokens[i]``: the token ids of item ``i`` (items: the shards' entries in order);
    ``keep[i]``: use item ``i`` (False: filtered out, e.g. too long). :meth:`set_epoch` before iterating.
    ``num_workers``: those of the DataLoader that reads it (0: the main process)."""

    def __init__(self, shard_set: ShardSet, tokens: Sequence[Sequence[int]], keep: Sequence[bool], *,
                 sample_rate: int, max_frames: int, max_batch_size: int, bucket_width: float, buffer_size: int,
                 seed: int, rank: int, world_size: int, num_workers: int):
        require("webdataset", "reading shards")  # here, not in the loader's workers: an error before training
        self.shard_set, self.sample_rate = shard_set, sample_rate
        self.items = [(s, e) for s, shard in enumerate(shard_set.shards) for e in shard.entries]
        if not len(tokens) == len(keep) == len(self.items):
            raise ValueError(f"{len(self.items)} utterances in the shards, {len(tokens)} token lists, {len(keep)} flags")
        if len(shard_set.shards) < world_size:
            raise ShardError(f"{len(shard_set.shards)} shards for {world_size} processes: every process needs "
                             f"at least one (write smaller shards with tools/make_shards.py --utts-per-shard)")
        self.tokens, self.keep = [list(t) for t in tokens], list(keep)
        self.frames = [max(1, round(e.num_samples / shard_set.sample_rate * FRAMES_PER_SECOND)) for _, e in self.items]
        first, self._first_item = 0, []
        for shard in shard_set.shards:
            self._first_item.append(first)
            first += len(shard.entries)
        self.batching = (buffer_size, max_frames, max_batch_size, max(1, round(bucket_width * FRAMES_PER_SECOND)))
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.num_workers = max(1, num_workers)
        self._planned: Tuple[int, int] = (-1, seed)  # (epoch, seed) of self.plan
        self.skip = 0
        self.plan: List[List[List[List[int]]]] = []  # this rank's [worker][window][batch] -> items
        self.worker_shards: List[List[int]] = []
        self.batches_per_rank: List[int] = []

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Plan ``epoch`` for every rank (metadata only); this rank's iteration starts after ``skip`` batches."""
        if (epoch, self.seed) != self._planned:
            assignment = assign_shards(len(self.shard_set.shards), epoch, self.seed, self.world_size,
                                       self.num_workers)
            self.batches_per_rank, plans = [], []
            for r, workers in enumerate(assignment):
                plan = [self._plan_worker(shards, epoch, r, w) for w, shards in enumerate(workers)]
                self.batches_per_rank.append(sum(len(b) for windows in plan for b in windows))
                plans.append(plan)
            self.plan, self.worker_shards, self._planned = plans[self.rank], assignment[self.rank], (epoch, self.seed)
        self.skip = skip

    def _plan_worker(self, shards: List[int], epoch: int, rank: int, worker: int) -> List[List[List[int]]]:
        items = [self._first_item[s] + j for s in shards for j in range(len(self.shard_set.shards[s].entries))
                 if self.keep[self._first_item[s] + j]]
        rng = random.Random(f"{self.seed}/{epoch}/{rank}/{worker}")  # str seeds hash the same in every process
        return bucket_stream(items, self.frames, *self.batching, rng=rng)

    def __len__(self) -> int:
        """Batches of the epoch (padded to the most any rank makes), minus those skipped."""
        return max(0, max(self.batches_per_rank) - self.skip)

    def _load(self, item: int, sample: Dict[str, object]) -> Optional[Dict[str, object]]:
        s, entry = self.items[item]
        try:
            wav, rate = sf.read(io.BytesIO(sample["flac"]), dtype="float32", always_2d=True)  # (T, C)
            wav = torch.from_numpy(wav).mean(dim=1)  # (T,)
        except (KeyError, RuntimeError, sf.LibsndfileError) as exc:
            log.warning("skipping unreadable utterance %s in %s: %s", entry.utt, self.shard_set.shards[s].url, exc)
            return None
        return {"utt": entry.utt, "wav": resample(wav, rate, self.sample_rate).contiguous(),
                "tokens": torch.tensor(self.tokens[item], dtype=torch.long), "text": entry.text}

    def _resume_point(self) -> Tuple[List[int], int]:
        """Per planned worker, the batches a resume skips; and the planned worker the DataLoader's worker 0 runs."""
        counts = [sum(len(b) for b in windows) for windows in self.plan]
        return round_robin_skips(counts, self.skip)

    def _windows(self, worker: int, skip: int) -> Iterator[List[List[int]]]:
        """The planned worker's windows of batches, without the first ``skip`` batches."""
        for batches in self.plan[worker]:
            if skip >= len(batches):
                skip -= len(batches)
                continue
            yield batches[skip:]
            skip = 0

    def __iter__(self) -> Iterator[Dict[str, object]]:
        from webdataset.tariterators import shardlist, tarfile_samples  # there: required by __init__

        info = get_worker_info()
        if (info.num_workers if info is not None else 1) != self.num_workers:
            raise RuntimeError(f"planned for {self.num_workers} workers, read by "
                               f"{info.num_workers if info else 1}")
        skips, first = self._resume_point()
        # Rotating the plan keeps the workers' cyclic order, so a resumed loader yields what the original would.
        worker = ((info.id if info is not None else 0) + first) % self.num_workers
        shards = self.worker_shards[worker]
        where = {self.shard_set.shards[s].url: s for s in shards}
        samples = iter(tarfile_samples(shardlist([self.shard_set.shards[s].url for s in shards])))
        for batches in self._windows(worker, skips[worker]):
            needed = {i for b in batches for i in b}
            got: Dict[int, Optional[Dict[str, object]]] = {}
            while len(got) < len(needed):
                sample = next(samples, None)
                if sample is None:
                    lost = min(needed - set(got))
                    raise ShardError(f"{self.shard_set.shards[self.items[lost][0]].url}: utt "
                                     f"{self.items[lost][1].utt} (key {self.items[lost][1].key}) is in the index "
                                     f"but not in the shard")
                item = self._item_of(where, sample)
                if item in needed:
                    got[item] = self._load(item, sample)
            for b in batches:
                yield collate([got[i] for i in b])

    def _item_of(self, where: Dict[str, int], sample: Dict[str, object]) -> int:
        url, key = sample["__url__"], sample["__key__"]
        s = where[url]
        entries = self.shard_set.shards[s].entries
        # Keys are positions: the index row of a key is found without a per-item dictionary.
        j = int(key) if key.isdigit() else -1
        if not (0 <= j < len(entries) and entries[j].key == key):
            raise ShardError(f"{url}: member {key!r} is not in the shard index (stale {INDEX_FILE}?)")
        return self._first_item[s] + j


class ShardEpochs:
    """The epoch control the trainer drives a batch sampler with (``set_epoch``, ``len``, ``state_dict``,
    ``load_state_dict``), for a :class:`ShardStream`."""

    def __init__(self, stream: ShardStream):
        self.stream, self.epoch, self._resume_at = stream, 0, 0
        stream.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume_at = 0
        self.epoch = epoch
        self.stream.set_epoch(epoch, self._resume_at)

    def __len__(self) -> int:
        return len(self.stream)

    def state_dict(self, batches_consumed: int = 0) -> Dict[str, int]:
        return {"epoch": self.epoch, "batches_consumed": int(batches_consumed), "seed": self.stream.seed,
                "num_replicas": self.stream.world_size, "num_workers": self.stream.num_workers}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Continue at the batch after the last consumed one (same processes and workers as before)."""
        for k, have in (("num_replicas", self.stream.world_size), ("num_workers", self.stream.num_workers)):
            if state.get(k, have) != have:
                raise ValueError(f"cannot resume mid-epoch with {k} {have}: the checkpoint was made with {state[k]}")
        self.stream.seed, self.epoch, self._resume_at = state["seed"], state["epoch"], state["batches_consumed"]
        self.stream.set_epoch(self.epoch, self._resume_at)
