"""Training and validation data loaders: dataset, alignability filter, bucketing sampler, seeded workers.

Utterances whose encoder output would be shorter than their label sequence (CTC needs one frame per
label plus one between repeated labels) cannot be trained on and would give an infinite loss; they
are dropped before training with a report, using the model's ``output_lengths(wav_lens)`` (no
network run) on the durations the dataset already knows.

Randomness: the sampler is seeded by ``train.seed + epoch``; the loader draws its workers' base seed
from its own generator, reseeded every epoch (so creating an iterator never touches the global torch
RNG, which the model's dropout and SpecAugment use, and a resumed run sees the same stream); each
worker seeds python's and numpy's generators from its torch seed.

Waveform augmentation (``augment:``, training only) runs in the workers on each item as it is read
(:class:`~asrkit.data.augmented.AugmentedDataset`), its draws seeded by that same per-epoch generator's seed
and the utterance id, so a resumed epoch gets the same audio.

Tar shards (:mod:`asrkit.data.shards`, ``asrkit train --train-shards``) are the other training source:
:class:`ShardLoader` streams them and offers the trainer the same ``batch_sampler``/``generator`` handles.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from asrkit.audio.waveaug import WaveAugment, augment_enabled
from asrkit.config import ConfigError, ExperimentConfig
from asrkit.data.augmented import AugmentedDataset
from asrkit.data.datadir import DataDirError, read_data_dir
from asrkit.data.dataset import AsrDataset, TokenEncoder, collate
from asrkit.data.sampler import BucketBatchSampler
from asrkit.data.shards import ShardEpochs, ShardSet, ShardStream, is_shard_spec, read_shard_set
from asrkit.train.distributed import DistContext
from asrkit.models.asr import AsrModel
from asrkit.models.losses import ctc_min_frames

log = logging.getLogger("asrkit.train")
_EXAMPLES = 5


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: the torch seed differs per worker and epoch; derive the others from it."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def alignable(durations: Sequence[float], token_ids: Sequence[Sequence[int]], model: AsrModel,
              sample_rate: int, speed_factor: float = 1.0) -> List[bool]:
    """Per utterance: does the encoder give enough frames for its labels? CTC needs one per label plus one
    between repeated labels; a model without a CTC head (attention only) one frame per label.

    ``speed_factor``: the largest speed-perturbation factor (a faster copy is shorter).
    """
    samples = torch.tensor([int(d * sample_rate / speed_factor) for d in durations], dtype=torch.long)
    with torch.no_grad():
        frames = model.output_lengths(samples).tolist()
    need = [ctc_min_frames(t) if model.ctc is not None else len(t) for t in token_ids]
    return [f >= max(n, 1) for f, n in zip(frames, need)]


def filter_alignable(dataset: AsrDataset, model: AsrModel, cfg: ExperimentConfig) -> Tuple[Dataset, List[float]]:
    """Drop (and report) the utterances of ``dataset`` too short for their labels; returns the dataset
    to load from and its durations."""
    durations = dataset.durations()
    speed = max(cfg.speed_perturb.factors) if cfg.speed_perturb.enabled else 1.0
    ok = alignable(durations, [tokens for _, tokens in dataset.items], model, cfg.frontend.sample_rate, speed)
    keep = [i for i, good in enumerate(ok) if good]
    if len(keep) == len(durations):
        return dataset, durations
    bad = [dataset.items[i][0].utt for i, good in enumerate(ok) if not good]
    log.warning("%s: dropped %d of %d utterances whose encoder output is shorter than their label sequence "
                "(e.g. %s)", dataset.name, len(bad), len(durations), ", ".join(bad[:_EXAMPLES]))
    if not keep:
        raise DataDirError(f"{dataset.name}: every utterance is too short for its transcript after "
                           f"{model.subsampling_factor}x subsampling")
    return Subset(dataset, keep), [durations[i] for i in keep]


def build_loader(data_dir: str, cfg: ExperimentConfig, tokenizer: TokenEncoder, model: AsrModel, *,
                 train: bool, pin_memory: bool = False) -> Union[DataLoader, "ShardLoader"]:
    """A DataLoader over ``data_dir`` whose ``batch_sampler`` is a :class:`BucketBatchSampler` sharded over
    the initialised process group and whose ``generator`` is reseeded per epoch by the trainer.
    ``data_dir`` may also be a tar shard set (see :func:`~asrkit.data.shards.is_shard_spec`; training only):
    a :class:`ShardLoader` then."""
    if is_shard_spec(data_dir):
        if not train:
            raise DataDirError(f"{data_dir}: tar shards are a training source; validate on a Kaldi data dir")
        return build_shard_loader(data_dir, cfg, tokenizer, model, pin_memory=pin_memory)
    d = cfg.data
    dataset = AsrDataset(read_data_dir(data_dir), cfg.frontend.sample_rate, tokenizer=tokenizer,
                         min_duration=d.min_duration, max_duration=d.max_duration)
    data, durations = filter_alignable(dataset, model, cfg)
    sampler = BucketBatchSampler(durations, max_frames=d.max_frames, max_batch_size=d.max_batch_size,
                                 shuffle=train, seed=cfg.train.seed, bucket_width=d.bucket_width,
                                 sortagrad_epochs=d.sortagrad_epochs)
    generator = torch.Generator()
    generator.manual_seed(cfg.train.seed)
    if train and augment_enabled(cfg.augment):
        augment = WaveAugment(cfg.augment, cfg.frontend.sample_rate, seed=cfg.train.seed)
        data = AugmentedDataset(data, augment, generator, {u.utt: u.spk for u, _ in dataset.items if u.spk})
    return DataLoader(data, batch_sampler=sampler, collate_fn=collate, num_workers=d.num_workers,
                      worker_init_fn=seed_worker, generator=generator,
                      pin_memory=pin_memory)


class ShardLoader:
    """Training batches streamed from tar shards: a DataLoader over a :class:`ShardStream` whose epoch ends
    with empty batches (B = 0) up to the most batches any rank has this epoch, so every rank takes the
    same number of steps. ``batch_sampler`` (a :class:`ShardEpochs`) and ``generator`` are what the trainer
    drives a sampled loader with."""

    def __init__(self, stream: ShardStream, num_workers: int, pin_memory: bool, seed: int):
        self.stream, self.batch_sampler = stream, ShardEpochs(stream)
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        # batch_size=None: the stream yields whole batches, collated in the workers.
        self.loader = DataLoader(stream, batch_size=None, num_workers=num_workers, worker_init_fn=seed_worker,
                                 generator=self.generator, pin_memory=pin_memory)

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        total, done = len(self.stream), 0
        for batch in self.loader:
            done += 1
            yield batch
        if done > total:
            raise RuntimeError(f"the shard stream gave {done} batches, {total} were planned")
        for _ in range(total - done):
            yield collate([])


def shard_tokens(shard_set: ShardSet, tokenizer: TokenEncoder) -> Tuple[List[List[int]], List[str]]:
    """Token ids of every utterance of ``shard_set`` (index order), and their ids."""
    tokens, utts = [], []
    for shard in shard_set.shards:
        for e in shard.entries:
            try:
                tokens.append(list(tokenizer.encode(e.text)) if e.text else [])
            except (ValueError, KeyError) as exc:
                raise ValueError(f"{shard.url}: utt {e.utt}: cannot tokenize transcript {e.text!r}: {exc}") from exc
            utts.append(e.utt)
    return tokens, utts


def build_shard_loader(spec: str, cfg: ExperimentConfig, tokenizer: TokenEncoder, model: AsrModel, *,
                       pin_memory: bool = False, ctx: Optional[DistContext] = None) -> ShardLoader:
    """A :class:`ShardLoader` over the shard set ``spec`` for this process's rank (``ctx``: default, the
    torchrun environment). Utterances with no text, outside ``data.min/max_duration`` or too short for
    their labels are left out, with a report."""
    d = cfg.data
    if d.shard_buffer < 1:
        raise DataDirError(f"data.shard_buffer must be at least 1, got {d.shard_buffer}")
    if augment_enabled(cfg.augment):
        raise ConfigError(f"augment: {spec}: waveform augmentation is applied to Kaldi data dirs; training from tar "
                          "shards does not take it yet (set every augment.*.prob to 0, or train on a data dir)")
    if d.sortagrad_epochs:
        raise DataDirError(f"data.sortagrad_epochs: {spec}: tar shards are streamed through a bucketing buffer, "
                           "with no global length order to go shortest first; use a Kaldi data dir or set it to 0")
    if ctx is None:
        import torch.distributed as dist

        on = dist.is_available() and dist.is_initialized()
        ctx = DistContext(dist.get_rank() if on else 0, dist.get_world_size() if on else 1)
    shard_set = read_shard_set(spec)
    tokens, utts = shard_tokens(shard_set, tokenizer)
    durations = [e.num_samples / shard_set.sample_rate for s in shard_set.shards for e in s.entries]
    speed = max(cfg.speed_perturb.factors) if cfg.speed_perturb.enabled else 1.0
    fits = alignable(durations, tokens, model, cfg.frontend.sample_rate, speed)
    keep = [bool(t) and d.min_duration <= dur <= d.max_duration and ok
            for t, dur, ok in zip(tokens, durations, fits)]
    dropped = [u for u, k in zip(utts, keep) if not k]
    if dropped:
        log.warning("%s: left out %d of %d utterances (no text, outside data.min/max_duration, or too short for "
                    "their labels), e.g. %s", spec, len(dropped), len(utts), ", ".join(dropped[:_EXAMPLES]))
    if len(dropped) == len(utts):
        raise DataDirError(f"{spec}: no usable utterance left (of {len(utts)})")
    stream = ShardStream(shard_set, tokens, keep, sample_rate=cfg.frontend.sample_rate, max_frames=d.max_frames,
                         max_batch_size=d.max_batch_size, bucket_width=d.bucket_width, buffer_size=d.shard_buffer,
                         seed=cfg.train.seed, rank=ctx.rank, world_size=ctx.world_size,
                         num_workers=d.num_workers)
    return ShardLoader(stream, d.num_workers, pin_memory, cfg.train.seed)
