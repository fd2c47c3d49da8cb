"""Training and validation data loaders: dataset, alignability filter, bucketing sampler, seeded workers.

Utterances whose encoder output would be shorter than their label sequence (CTC needs one frame per
label plus one between repeated labels) cannot be trained on and would give an infinite loss; they
are dropped before training with a report, using the model's ``output_lengths(wav_lens)`` (no
network run) on the durations the dataset already knows.

Randomness: the sampler is seeded by ``train.seed + epoch``; the loader draws its workers' base seed
from its own generator, reseeded every epoch (so creating an iterator never touches the global torch
RNG, which the model's dropout and SpecAugment use, and a resumed run sees the same stream); each
worker seeds python's and numpy's generators from its torch seed.
"""
from __future__ import annotations

import logging
import random
from typing import List, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from asrkit.config import ExperimentConfig
from asrkit.data.datadir import DataDirError, read_data_dir
from asrkit.data.dataset import AsrDataset, TokenEncoder, collate
from asrkit.data.sampler import BucketBatchSampler
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
                 train: bool, pin_memory: bool = False) -> DataLoader:
    """A DataLoader over ``data_dir`` whose ``batch_sampler`` is a :class:`BucketBatchSampler` sharded over
    the initialised process group and whose ``generator`` is reseeded per epoch by the trainer."""
    d = cfg.data
    dataset = AsrDataset(read_data_dir(data_dir), cfg.frontend.sample_rate, tokenizer=tokenizer,
                         min_duration=d.min_duration, max_duration=d.max_duration)
    data, durations = filter_alignable(dataset, model, cfg)
    sampler = BucketBatchSampler(durations, max_frames=d.max_frames, max_batch_size=d.max_batch_size,
                                 shuffle=train, seed=cfg.train.seed, bucket_width=d.bucket_width)
    generator = torch.Generator()
    generator.manual_seed(cfg.train.seed)
    return DataLoader(data, batch_sampler=sampler, collate_fn=collate, num_workers=d.num_workers,
                      worker_init_fn=seed_worker, generator=generator,
                      pin_memory=pin_memory)
