"""A training dataset whose items pass through waveform augmentation (asrkit.audio.waveaug) as they are loaded.

The epoch's draws are seeded by the loader's ``generator``: the trainer seeds it with ``train.seed * 1000 +
epoch`` before each epoch (and before a resumed one), and a worker inherits it as it starts, so every epoch
draws anew and a resumed epoch draws what the killed one drew. Babble noise mixes other utterances of the
same dataset, as they are read (not augmented).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from asrkit.audio.waveaug import WaveAugment

__all__ = ["AugmentedDataset"]


class AugmentedDataset(Dataset):
    """The items of ``base`` (dicts with ``utt`` and ``wav``, or None) augmented by ``augment``, with the keys
    ``augmented`` (the kinds applied) and ``vtlp_alpha`` added; ``speakers``: utterance id -> speaker (utt2spk)."""

    def __init__(self, base: Dataset, augment: WaveAugment, generator: torch.Generator,
                 speakers: Optional[Mapping[str, str]] = None):
        self.base, self.augment, self.generator = base, augment, generator
        self.speakers = dict(speakers or {})

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Optional[Dict[str, object]]:
        item = self.base[index]
        if item is None:
            return None
        utt = item["utt"]

        def others(k: int, rng: np.random.Generator) -> List[Tensor]:
            picked = [self.base[int(j)] for j in rng.integers(len(self.base), size=k)]
            return [o["wav"] for o in picked if o is not None and o["utt"] != utt]

        out = self.augment(item["wav"], utt, self.generator.initial_seed(), self.speakers.get(utt), others)
        return {**item, "wav": out.wav, "augmented": out.applied, "vtlp_alpha": out.vtlp_alpha}
