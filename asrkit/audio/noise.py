"""Additive noise at a drawn signal-to-noise ratio: noise files from directories, or generated noise.

The SNR is ``10 log10(P_speech / P_noise)`` with powers averaged over the whole utterance (the speech as it
reaches this step: reverberated, if it was). Sources (:class:`~asrkit.config.NoiseConfig`):

* a directory: any audio file under it (``.wav``, ``.flac``, ``.ogg``; MUSAN's ``noise``, ``music`` and
  ``speech`` folders are one directory each), a segment of the utterance's length from a uniformly drawn
  offset, repeated when the file is shorter;
* ``white``, ``pink`` or ``brown`` noise: Gaussian noise whose power spectral density falls as ``1 / f**k``
  (k = 0, 1, 2), shaped in the frequency domain;
* ``babble``: other utterances of the training set, each at unit power and circularly shifted by a drawn
  offset, summed.
"""
from __future__ import annotations

import math
import os
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from asrkit.audio.io import audio_info, load_audio
from asrkit.config import ConfigError, NoiseConfig

__all__ = ["AUDIO_EXTENSIONS", "SLOPES", "coloured_noise", "mix_at_snr", "fit_length", "babble", "list_noise_files",
           "read_noise", "NoiseSource"]

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg")
SLOPES = {"white": 0.0, "pink": 1.0, "brown": 2.0}  # power spectral density falls as 1 / f**slope
OtherUtterances = Callable[[int, np.random.Generator], List[Tensor]]  # (how many, rng) -> waveforms


def _power(x: Tensor) -> float:
    """Mean square of ``x``, in float64."""
    return float(x.double().square().mean())


def coloured_noise(kind: str, n: int, rng: np.random.Generator) -> Tensor:
    """``n`` samples (float32) of ``kind`` noise (white, pink or brown: see :data:`SLOPES`) at unit power (pink or
    brown noise of one sample is 0: all of it would be DC, which is removed)."""
    white = rng.standard_normal(n)
    slope = SLOPES[kind]
    if slope:
        spectrum = np.fft.rfft(white)
        spectrum[1:] /= np.arange(1, spectrum.size) ** (slope / 2)  # amplitude falls as f**(-k/2): power as f**(-k)
        spectrum[0] = 0.0  # no DC offset (brown noise would otherwise drift)
        white = np.fft.irfft(spectrum, n)
    x = torch.from_numpy(white.astype(np.float32))
    p = _power(x)
    return x / math.sqrt(p) if p > 0 else x


def fit_length(x: Tensor, n: int) -> Tensor:
    """``x`` (T,) repeated as often as needed and cut to ``n`` samples."""
    if x.numel() == 0:
        raise ValueError("cannot fit an empty signal to a length")
    return x.repeat(-(-n // x.numel()))[:n]


def mix_at_snr(speech: Tensor, noise: Tensor, snr_db: float) -> Optional[Tensor]:
    """``speech + g * noise`` (both (T,)) with ``g`` such that ``10 log10(P_speech / P_(g noise)) == snr_db``; None when
    either is silent (no SNR can be set)."""
    if noise.shape != speech.shape:
        raise ValueError(f"mix_at_snr: noise of shape {tuple(noise.shape)} for speech of {tuple(speech.shape)}")
    p_speech, p_noise = _power(speech), _power(noise)
    if p_speech == 0.0 or p_noise == 0.0:
        return None
    gain = math.sqrt(p_speech / (p_noise * 10.0 ** (snr_db / 10.0)))
    return (speech.double() + gain * noise.double()).to(speech.dtype)


def babble(utterances: Sequence[Tensor], n: int, rng: np.random.Generator) -> Tensor:
    """``n`` samples of babble: each of ``utterances`` fitted to ``n``, at unit power, rolled by a drawn offset; summed.
    Silent utterances add nothing."""
    out = torch.zeros(n)
    for u in utterances:
        x = fit_length(u.float(), n)
        p = _power(x)
        if p > 0:
            out += torch.roll(x / math.sqrt(p), int(rng.integers(n)))
    return out


def list_noise_files(dirs: Sequence[str]) -> List[List[str]]:
    """The audio files under each of ``dirs`` (recursively, sorted: the same list on every machine); a missing
    directory, or one with no audio file, is an error naming it."""
    found = []
    for d in dirs:
        if not os.path.isdir(d):
            raise ConfigError(f"augment.noise.dirs: {d}: no such directory")
        files = sorted(os.path.join(root, f) for root, _, names in os.walk(d, followlinks=True) for f in names
                       if f.lower().endswith(AUDIO_EXTENSIONS))
        if not files:
            raise ConfigError(f"augment.noise.dirs: {d}: no audio files ({', '.join(AUDIO_EXTENSIONS)}) under it")
        found.append(files)
    return found


def read_noise(path: str, n: int, sample_rate: int, rng: np.random.Generator) -> Tensor:
    """``n`` samples at ``sample_rate`` of the noise file ``path`` from a uniformly drawn offset (repeated when the
    file is shorter). Raises :class:`~asrkit.audio.io.AudioError` naming the file when it cannot be read."""
    rate, frames = audio_info(path, name="noise", pipe=False)
    need = math.ceil(n * rate / sample_rate)  # samples at the file's rate
    first = int(rng.integers(max(frames - need, 0) + 1))
    end = min(first + need, frames) / rate
    x = load_audio(path, sample_rate, start=first / rate, end=end, name="noise", pipe=False)
    return fit_length(x, n)


class NoiseSource:
    """The noise sources of an ``augment.noise`` config: its directories (listed once, here) and generated kinds;
    :meth:`draw` picks one uniformly."""

    def __init__(self, cfg: NoiseConfig, sample_rate: int):
        self.sample_rate = sample_rate
        self.babble_utts = cfg.babble_utts
        self.files = list_noise_files(cfg.dirs)
        self.names: Tuple[str, ...] = tuple(cfg.dirs) + tuple(cfg.generated)  # the sources, by index

    def draw(self, n: int, rng: np.random.Generator, others: OtherUtterances) -> Tensor:
        """``n`` samples of noise from a source chosen uniformly; ``others(k, rng)`` gives babble's k utterances."""
        i = int(rng.integers(len(self.names)))
        if i < len(self.files):
            files = self.files[i]
            return read_noise(files[int(rng.integers(len(files)))], n, self.sample_rate, rng)
        kind = self.names[i]
        if kind == "babble":
            low, high = self.babble_utts
            return babble(others(int(rng.integers(low, high + 1)), rng), n, rng)
        return coloured_noise(kind, n, rng)
