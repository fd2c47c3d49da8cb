"""The waveform augmentations of an ``augment:`` config, composed and applied to one utterance at a time.

Order: reverberation (asrkit.audio.reverb), noise (asrkit.audio.noise), band and gain (asrkit.audio.channel);
VTLP (asrkit.audio.vtlp) only draws its warp factor here, which the frontend applies. Each kind decides and
draws from a generator of its own, seeded by ``(epoch seed, utterance id, kind)`` (VTLP with ``per_speaker``:
the speaker id): the same utterance in the same epoch always gets the same audio, whichever worker loads it
and whether the run was resumed, and turning one kind on or off leaves the others' draws as they were.
A noise or impulse-response file that cannot be read is reported and that kind skipped for the utterance.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from torch import Tensor

from asrkit.audio.channel import apply_gain, band_limit
from asrkit.audio.io import AudioError
from asrkit.audio.noise import NoiseSource, OtherUtterances, list_noise_files, mix_at_snr
from asrkit.audio.reverb import RirSource, read_rir_list, reverberate
from asrkit.config import AugmentConfig, ConfigError
from asrkit.extras import require

__all__ = ["KINDS", "Augmented", "WaveAugment", "augment_enabled", "check_sources", "draw_rng"]

log = logging.getLogger("asrkit.audio")
KINDS = ("reverb", "noise", "band", "gain", "vtlp")  # the order of application; the names counted in train.log


def augment_enabled(cfg: AugmentConfig) -> bool:
    """Whether any kind of ``cfg`` has a probability above 0."""
    return any(getattr(cfg, kind).prob > 0 for kind in KINDS)


def check_sources(cfg: AugmentConfig) -> None:
    """What the kinds in use read, checked before a run writes anything: the noise directories, the impulse-response
    list and its files, or pyroomacoustics for simulated rooms (each error one line naming the key and file)."""
    if cfg.noise.prob > 0:
        list_noise_files(cfg.noise.dirs)
    if cfg.reverb.prob > 0:
        if cfg.reverb.rir_list is not None:
            read_rir_list(cfg.reverb.rir_list)
        else:
            require("pyroomacoustics", "augment.reverb (simulated rooms)")


def draw_rng(seed: int, key: str, kind: str) -> np.random.Generator:
    """The generator of ``kind``'s draws for ``key`` (an utterance or speaker id) under ``seed``: a stable hash of
    the key (Python's ``hash`` of a string differs between processes), so every process draws the same."""
    digest = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")
    return np.random.default_rng([seed, digest, KINDS.index(kind)])


@dataclass(frozen=True)
class Augmented:
    """One utterance after augmentation: the waveform (T,), the kinds applied (in order), VTLP's warp factor."""
    wav: Tensor
    applied: Tuple[str, ...]
    vtlp_alpha: float


class WaveAugment:
    """The augmentations of ``cfg`` for audio at ``sample_rate``. Built once before the loader's workers start:
    the simulated impulse responses (from ``seed``) and the noise file lists are made here and shared."""

    def __init__(self, cfg: AugmentConfig, sample_rate: int, seed: int):
        self.cfg, self.sample_rate = cfg, sample_rate
        self.rirs = RirSource(cfg.reverb, sample_rate, seed) if cfg.reverb.prob > 0 else None
        self.noises = NoiseSource(cfg.noise, sample_rate) if cfg.noise.prob > 0 else None

    def __call__(self, wav: Tensor, utt: str, seed: int, speaker: Optional[str] = None,
                 others: Optional[OtherUtterances] = None) -> Augmented:
        """``wav`` (T,) of utterance ``utt`` augmented with the draws of ``seed`` (the epoch's). ``speaker``: its
        speaker, for VTLP per speaker; ``others(k, rng)``: k other training utterances, for babble noise."""
        cfg, applied = self.cfg, []
        rng = draw_rng(seed, utt, "reverb")
        if self.rirs is not None and rng.random() < cfg.reverb.prob:
            try:
                wav = reverberate(wav, self.rirs.draw(rng))
                applied.append("reverb")
            except AudioError as exc:
                log.warning("utt %s: no reverberation: %s", utt, exc)
        rng = draw_rng(seed, utt, "noise")
        if self.noises is not None and rng.random() < cfg.noise.prob:
            snr = float(rng.uniform(*cfg.noise.snr))
            try:
                mixed = mix_at_snr(wav, self.noises.draw(wav.numel(), rng, others or _no_others), snr)
            except AudioError as exc:
                log.warning("utt %s: no noise: %s", utt, exc)
                mixed = None
            if mixed is not None:
                wav = mixed
                applied.append("noise")
        rng = draw_rng(seed, utt, "band")
        if rng.random() < cfg.band.prob:
            wav = band_limit(wav, self.sample_rate, cfg.band.rate, cfg.band.low_hz)
            applied.append("band")
        rng = draw_rng(seed, utt, "gain")
        if rng.random() < cfg.gain.prob:
            wav = apply_gain(wav, float(rng.uniform(*cfg.gain.db)))
            applied.append("gain")
        alpha = 1.0
        key = f"speaker {speaker}" if cfg.vtlp.per_speaker and speaker is not None else utt
        rng = draw_rng(seed, key, "vtlp")
        if rng.random() < cfg.vtlp.prob:
            alpha = float(rng.uniform(*cfg.vtlp.alpha))
            applied.append("vtlp")
        return Augmented(wav, tuple(applied), alpha)


def _no_others(k: int, rng: np.random.Generator) -> list:
    raise ConfigError("augment.noise.generated: babble needs other training utterances, and none were given")
