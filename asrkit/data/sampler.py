"""Length-bucketing batch sampler with a padded-frame budget, DDP sharding and mid-epoch resume.

Lengths are counted in 10 ms feature frames (``round(duration * 100)``). A
batch's cost is its padded size, ``batch_size * longest utterance``; batches
stay within ``max_frames`` and ``max_batch_size``. An utterance longer than
``max_frames`` forms a batch of its own (warned about once).

Each epoch (seeded by ``seed + epoch``, so deterministic): shuffle, stable-sort
by length bucket (``bucket_width`` seconds), so utterances of similar length
end up together but in a new order, pack greedily, then shuffle the batch order.
With ``shuffle=False`` the order is by length, for validation and decoding.

SortaGrad (Amodei et al. 2016, "Deep Speech 2", section 3.1): for the first ``sortagrad_epochs`` epochs the
batches are the same shuffled-within-bucket packing but go shortest bucket first, which shortens CTC's
early blank-only plateau; every later epoch shuffles the batch order as above.

Sharding: rank ``r`` of ``R`` takes batches ``r, r+R, r+2R, ...``. To give
every rank the same number of batches without losing or repeating data, the
largest batches are split in two until the count is a multiple of ``R``; only
if every batch holds a single utterance (fewer utterances than ranks, ``max_batch_size``
1, or utterances too long to pair) are up to ``R - 1`` of them repeated (padding).
"""
from __future__ import annotations

import logging
import random
from typing import Dict, Iterator, List, Optional, Sequence

import torch.distributed as dist
from torch.utils.data import Sampler

log = logging.getLogger("asrkit.data")
FRAMES_PER_SECOND = 100


def pack_batches(order: Sequence[int], frames: Sequence[int], max_frames: int, max_batch_size: int) -> List[List[int]]:
    """Cut ``order`` (indices into ``frames``) greedily into batches whose padded size, ``len(batch) *
    longest``, stays within ``max_frames`` and whose length stays within ``max_batch_size`` (an index
    longer than ``max_frames`` alone). Shared by this sampler and the tar-shard stream
    (:mod:`asrkit.data.shards`), so both batch alike."""
    batches: List[List[int]] = []
    cur: List[int] = []
    longest = 0
    for i in order:
        f = frames[i]
        grown = max(longest, f)
        if cur and (len(cur) + 1 > max_batch_size or (len(cur) + 1) * grown > max_frames):
            batches.append(cur)
            cur, grown = [], f
        cur.append(i)
        longest = grown
    if cur:
        batches.append(cur)
    return batches


class BucketBatchSampler(Sampler[List[int]]):
    """Yields lists of dataset indices. Use ``set_epoch`` each epoch, ``state_dict`` to checkpoint.

    ``num_replicas``/``rank`` default to the initialised ``torch.distributed``
    group (else 1 and 0).
    """

    def __init__(self, durations: Sequence[float], max_frames: int, max_batch_size: int, *,
                 shuffle: bool = True, seed: int = 0, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, bucket_width: float = 0.5, sortagrad_epochs: int = 0):
        if max_frames <= 0 or max_batch_size <= 0:
            raise ValueError(f"max_frames ({max_frames}) and max_batch_size ({max_batch_size}) must be positive")
        if sortagrad_epochs < 0:
            raise ValueError(f"sortagrad_epochs must be >= 0, got {sortagrad_epochs}")
        distributed = dist.is_available() and dist.is_initialized()
        self.num_replicas = num_replicas if num_replicas is not None else (
            dist.get_world_size() if distributed else 1)
        self.rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        self.frames = [max(1, round(d * FRAMES_PER_SECOND)) for d in durations]
        self.max_frames, self.max_batch_size = max_frames, max_batch_size
        self.shuffle, self.seed, self.sortagrad_epochs = shuffle, seed, sortagrad_epochs
        self.bucket_frames = max(1, round(bucket_width * FRAMES_PER_SECOND))
        self.epoch = 0
        self._resume_at = 0  # batches of self.epoch already consumed before this iteration (resume)
        self._yielded = 0  # batches of self.epoch handed out so far
        self._cache: Optional[tuple] = None
        oversized = sum(f > max_frames for f in self.frames)
        if oversized:
            log.warning("%d utterances are longer than max_frames=%d (longest %d frames); each forms a batch "
                        "of its own", oversized, max_frames, max(self.frames))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order. Setting the epoch just restored by ``load_state_dict`` keeps the resume point."""
        if epoch != self.epoch:
            self._resume_at = self._yielded = 0
        self.epoch = epoch

    def _pack(self, order: List[int]) -> List[List[int]]:
        return pack_batches(order, self.frames, self.max_frames, self.max_batch_size)

    def _even_out(self, batches: List[List[int]]) -> List[List[int]]:
        """Make the batch count a multiple of num_replicas: split the biggest batches, else repeat some."""
        need = -len(batches) % self.num_replicas
        while need and batches:
            j = max(range(len(batches)), key=lambda k: len(batches[k]))
            if len(batches[j]) < 2:
                break
            b = batches[j]
            batches[j:j + 1] = [b[: len(b) // 2], b[len(b) // 2:]]
            need -= 1
        if need and batches:  # fewer utterances than ranks: repeat batches so no rank runs short
            batches += [batches[k % len(batches)] for k in range(need)]
        return batches

    def _epoch_batches(self) -> List[List[int]]:
        """This rank's batches for ``self.epoch`` (cached)."""
        key = (self.epoch, self.seed)
        if self._cache is None or self._cache[0] != key:
            indices = list(range(len(self.frames)))
            if self.shuffle:
                rng = random.Random(self.seed + self.epoch)
                rng.shuffle(indices)
                indices.sort(key=lambda i: self.frames[i] // self.bucket_frames)  # stable: random within a bucket
            else:
                indices.sort(key=lambda i: self.frames[i])
            batches = self._even_out(self._pack(indices))
            if self.shuffle and self.epoch >= self.sortagrad_epochs:
                rng.shuffle(batches)
            self._cache = (key, batches[self.rank::self.num_replicas])
        return self._cache[1]

    def __len__(self) -> int:
        """Batches the next iteration yields (the whole epoch, minus those consumed before a resume)."""
        return max(0, len(self._epoch_batches()) - self._resume_at)

    def __iter__(self) -> Iterator[List[int]]:
        batches = self._epoch_batches()
        start, self._resume_at = self._resume_at, 0
        self._yielded = start
        for k in range(start, len(batches)):
            self._yielded = k + 1
            yield list(batches[k])

    def state_dict(self, batches_consumed: Optional[int] = None) -> Dict[str, int]:
        """Epoch and batches consumed in it. A DataLoader with workers fetches batches ahead of the
        training loop, so pass the count the loop actually used; by default the count yielded is stored."""
        done = self._yielded if batches_consumed is None else batches_consumed
        return {"epoch": self.epoch, "batches_consumed": int(done), "seed": self.seed,
                "num_replicas": self.num_replicas}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Continue at the batch after the last consumed one; the next ``__iter__`` starts there."""
        if state["num_replicas"] != self.num_replicas:
            raise ValueError(f"cannot resume mid-epoch with {self.num_replicas} ranks: the checkpoint was made "
                             f"with {state['num_replicas']}")
        self.seed, self.epoch = state["seed"], state["epoch"]
        self._resume_at = self._yielded = state["batches_consumed"]
