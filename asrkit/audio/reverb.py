"""Reverberation by room impulse responses: simulated shoebox rooms, or a user's list of measured ones.

Simulated rooms use pyroomacoustics' image-source method (the ``augment`` extra): a room's size, wall
absorption and source-microphone distance are drawn uniformly from the ranges of
:class:`~asrkit.config.ReverbConfig`, both positions at least :data:`WALL_MARGIN` from every wall. The
simulator delays every response by half its fractional-delay filter; that delay is cut off, so the direct
path arrives ``distance / c * rate`` samples after the start, as in the room. Every impulse response is
scaled to unit energy (``sum(h**2) == 1``), and :func:`reverberate` keeps the utterance's length and its
power, so reverberation changes the sound, not the level (gain is an augmentation of its own).

A list of impulse responses (``augment.reverb.rir_list``) is Kaldi's ``rir_list`` (lines
``--rir-id ID --room-id ROOM path``, as in RIRS_NOISES) or one audio path a line; paths are relative to the
working directory, as in a ``wav.scp``. The files are read when drawn, so a list of thousands costs no memory.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from asrkit.audio.io import AudioError, load_audio
from asrkit.config import ConfigError, ReverbConfig
from asrkit.extras import require

__all__ = ["Room", "SPEED_OF_SOUND", "sample_room", "simulate_rir", "simulate_bank", "read_rir_list",
           "normalize_rir", "reverberate", "RirSource"]

SPEED_OF_SOUND = 343.0  # m/s: pyroomacoustics' default, which the simulation is run with
WALL_MARGIN = 0.3  # metres between the source or the microphone and any wall
_PLACEMENT_TRIES = 50  # directions drawn for the source; when none fits the distance, it is shortened to fit


@dataclass(frozen=True)
class Room:
    """A shoebox room (metres), its walls' energy absorption, and where the source and the microphone are."""
    size: Tuple[float, float, float]
    absorption: float
    source: Tuple[float, float, float]
    mic: Tuple[float, float, float]

    @property
    def distance(self) -> float:
        """Source to microphone, metres."""
        return math.dist(self.source, self.mic)


def _uniform(rng: np.random.Generator, bounds: Sequence[float]) -> float:
    return float(rng.uniform(bounds[0], bounds[1]))


def sample_room(cfg: ReverbConfig, rng: np.random.Generator) -> Room:
    """A room drawn from ``cfg``'s ranges: size, absorption and distance uniform; the microphone uniform in the
    room (inside the wall margin), the source at the drawn distance in a uniformly drawn direction that fits.
    When no tried direction fits the distance (a small room), the source goes as far as the best one allows."""
    size = np.array([_uniform(rng, cfg.room_length), _uniform(rng, cfg.room_width), _uniform(rng, cfg.room_height)])
    absorption = _uniform(rng, cfg.absorption)
    distance = _uniform(rng, cfg.distance)
    low, high = np.full(3, WALL_MARGIN), size - WALL_MARGIN
    mic = rng.uniform(low, high)
    directions = rng.normal(size=(_PLACEMENT_TRIES, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)  # (N, 3) unit vectors
    # How far the source can go along each direction before it leaves the box (a zero component: never, by it).
    reach = (np.where(directions > 0, high - mic, mic - low) / np.abs(directions)).min(axis=1)  # (N,)
    fits = reach >= distance
    i = int(np.argmax(fits)) if fits.any() else int(np.argmax(reach))  # the first that fits, else the longest
    source = mic + directions[i] * min(distance, float(reach[i]))
    return Room(tuple(size.tolist()), absorption, tuple(source.tolist()), tuple(mic.tolist()))


def normalize_rir(rir: Tensor) -> Tensor:
    """``rir`` (K,) scaled to unit energy; an all-zero response is an error (it would silence the utterance)."""
    energy = float(rir.double().square().sum())
    if not energy > 0.0:
        raise ValueError("an impulse response of zero energy")
    return rir / math.sqrt(energy)


def simulate_rir(room: Room, sample_rate: int, max_order: int) -> Tensor:
    """The impulse response (K,) float32 of ``room`` from the source to the microphone, by the image-source method
    up to reflections of order ``max_order``; unit energy, the direct path at ``distance / c * sample_rate``."""
    pra = require("pyroomacoustics", "augment.reverb (simulated rooms)")
    shoebox = pra.ShoeBox(list(room.size), fs=sample_rate, materials=pra.Material(room.absorption),
                          max_order=max_order, air_absorption=False)
    shoebox.add_source(list(room.source))
    shoebox.add_microphone(list(room.mic))
    shoebox.compute_rir()
    # The fractional-delay filters centre every arrival this many samples late: cut that global delay off.
    delay = pra.constants.get("frac_delay_length") // 2
    rir = torch.from_numpy(np.asarray(shoebox.rir[0][0][delay:], dtype=np.float32))
    return normalize_rir(rir)


def simulate_bank(cfg: ReverbConfig, sample_rate: int, seed: int) -> List[Tensor]:
    """``cfg.num_rooms`` impulse responses of rooms drawn by :func:`sample_room` from ``seed`` (the same for every
    process that asks with the same seed)."""
    rng = np.random.default_rng(seed)
    return [simulate_rir(sample_room(cfg, rng), sample_rate, cfg.max_order) for _ in range(cfg.num_rooms)]


def read_rir_list(path: str) -> List[str]:
    """The impulse-response paths of a Kaldi ``rir_list`` (``--rir-id X --room-id Y path``; Kaldi's other options,
    such as ``--rt-60``, are read past) or of a plain list (one path a line); blank lines are skipped. A malformed
    line, or a path to no file, is an error naming the file and line."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"augment.reverb.rir_list: {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"augment.reverb.rir_list: {path}: not a UTF-8 text file") from None
    paths = []
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        options, rest = fields[:-1], fields[-1]
        names = options[0::2]
        if len(options) % 2 or any(not n.startswith("--") for n in names):
            raise ConfigError(f"augment.reverb.rir_list: {path}:{number}: expected '--rir-id ID --room-id ROOM path' "
                              f"(options --name value, then the path) or a path, got {line.strip()[:80]!r}")
        if not os.path.isfile(rest):
            raise ConfigError(f"augment.reverb.rir_list: {path}:{number}: {rest}: no such file")
        paths.append(rest)
    if not paths:
        raise ConfigError(f"augment.reverb.rir_list: {path}: no impulse response listed")
    return paths


def reverberate(wav: Tensor, rir: Tensor) -> Tensor:
    """``wav`` (T,) convolved with ``rir`` (K,), cut to its first T samples (the tail past the utterance is
    dropped, as Kaldi's wav-reverberate does) and scaled to ``wav``'s power. A silent ``wav`` stays silent."""
    # FFT convolution at a power-of-two length: 2-3x faster than torchaudio's fftconvolve at the exact length.
    n = 1 << (wav.numel() + rir.numel() - 2).bit_length()
    x, h = wav.float(), rir.float()
    out = torch.fft.irfft(torch.fft.rfft(x, n) * torch.fft.rfft(h, n), n)[: wav.numel()]
    power_in, power_out = float(x.double().square().sum()), float(out.double().square().sum())
    if power_out > 0.0:
        out = out * math.sqrt(power_in / power_out)
    return out.to(wav.dtype)


class RirSource:
    """The impulse responses an ``augment.reverb`` config draws from: a simulated bank (made once, here, from
    ``seed``: build this before the loader's workers start, and they share it) or the files of a list."""

    def __init__(self, cfg: ReverbConfig, sample_rate: int, seed: int):
        self.sample_rate = sample_rate
        if cfg.rir_list is not None:
            self.paths: List[str] = read_rir_list(cfg.rir_list)
            self.bank: List[Tensor] = []
        else:
            self.paths, self.bank = [], simulate_bank(cfg, sample_rate, seed)

    def __len__(self) -> int:
        return len(self.paths) or len(self.bank)

    def draw(self, rng: np.random.Generator) -> Tensor:
        """One impulse response (K,), unit energy, chosen uniformly."""
        i = int(rng.integers(len(self)))
        if self.bank:
            return self.bank[i]
        path = self.paths[i]
        try:
            return normalize_rir(load_audio(path, self.sample_rate, name="rir", pipe=False))
        except ValueError:
            raise AudioError(f"utt rir: {path}: the impulse response is silent") from None
