#!/usr/bin/env python3
"""Make a reverberant, noisy copy of a Kaldi data dir, through rooms and noises that training never uses.

Usage:
    python tools/make_reverb_noise_set.py --src data/test --out data/test_reverb_noise [--seed 1] [--snr 5,20]
        [--audio-dir DIR]

Each utterance of SRC (same id, text and speaker) is convolved with the impulse response of a room of its own
(asrkit.audio.reverb: pyroomacoustics' image-source method, reflections up to order MAX_ORDER; the response at
unit energy, the utterance's length and power kept), then mixed with noise at an SNR drawn uniformly from --snr
(asrkit.audio.noise.mix_at_snr: speech power over noise power across the whole utterance), and scaled down when
its peak would clip. 16-bit FLAC under OUT/wav/ (or AUDIO_DIR); OUT gets wav.scp (absolute paths), text, utt2spk,
spk2utt, utt2dur and ``conditions`` (each utterance's room, distance, noise and SNR).

The held-out set, disjoint from what ``augment:`` draws in training (asrkit.config's ReverbConfig and NoiseConfig
defaults, and the recipes' configs: tests/tools/test_make_reverb_noise_set.py checks both):
* rooms (ROOM_CLASSES), one of four classes drawn uniformly: small (length and width 2.0-2.9 m, height 2.2-2.45 m;
  training 3-10 and 2.5-4) or large (10.5-14 m, height 4.1-5 m), each live (wall absorption 0.08-0.18; training
  0.2-0.8) or dead (0.82-0.95); source to microphone 0.2-0.45 m in small rooms, 3.2-5 m in large ones (training
  0.5-3; a large room shortens it when no direction fits);
* noises (NOISE_KINDS), one drawn uniformly, none of training's white, pink, brown or babble: ``blue`` and
  ``violet`` (power rising as f and f**2), ``hum`` (mains hum: 50 or 60 Hz and its first 8 harmonics at 1/k
  amplitude, random phases) and ``bursty`` (1-4 kHz band noise switched on and off in 50-300 ms bursts, about a
  third of the time on);
* every draw from a generator seeded by (--seed, SEED_TAG, the utterance id's CRC-32): the same audio for the
  same seed and utterance whatever else is in the dir, and streams no training draw uses.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import soundfile
import torch
from torch import Tensor

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)  # run as a script from anywhere: asrkit lives in the repo root

from asrkit.audio.io import AudioError, load_audio  # noqa: E402
from asrkit.audio.noise import mix_at_snr  # noqa: E402
from asrkit.audio.reverb import Room, sample_room, simulate_rir, reverberate  # noqa: E402
from asrkit.config import ConfigError, ReverbConfig  # noqa: E402
from asrkit.data.datadir import DataDir, DataDirError, read_data_dir, write_data_dir  # noqa: E402
from asrkit.data.table import write_table  # noqa: E402
from asrkit.extras import MissingExtraError  # noqa: E402

SAMPLE_RATE = 16000
SEED_TAG = 3470  # keeps these generators' streams apart from every other seeded draw of the project
MAX_ORDER = 17  # image-source reflection order: tails up to ~0.65 s in the large rooms
PEAK = 0.99  # a mixture louder than this is scaled down (both parts: the SNR stays)
_SMALL = dict(room_length=(2.0, 2.9), room_width=(2.0, 2.9), room_height=(2.2, 2.45), distance=(0.2, 0.45))
_LARGE = dict(room_length=(10.5, 14.0), room_width=(10.5, 14.0), room_height=(4.1, 5.0), distance=(3.2, 5.0))
ROOM_CLASSES: Dict[str, ReverbConfig] = {
    "small-live": ReverbConfig(**_SMALL, absorption=(0.08, 0.18), max_order=MAX_ORDER),
    "small-dead": ReverbConfig(**_SMALL, absorption=(0.82, 0.95), max_order=MAX_ORDER),
    "large-live": ReverbConfig(**_LARGE, absorption=(0.08, 0.18), max_order=MAX_ORDER),
    "large-dead": ReverbConfig(**_LARGE, absorption=(0.82, 0.95), max_order=MAX_ORDER),
}
NOISE_KINDS = ("blue", "violet", "hum", "bursty")
RISING_SLOPES = {"blue": 1.0, "violet": 2.0}  # power spectral density grows as f**slope
HUM_HARMONICS = 8
BURST_BAND_HZ = (1000.0, 4000.0)
BURST_S = (0.05, 0.3)  # lengths of the bursts and of the gaps between them (gaps twice as long on average)


@dataclass(frozen=True)
class Condition:
    """What one utterance goes through."""
    room_class: str
    room: Room
    noise: str
    snr_db: float

    def describe(self) -> str:
        size = "x".join(f"{x:.2f}" for x in self.room.size)
        return (f"room={self.room_class} size={size} absorption={self.room.absorption:.3f} "
                f"distance={self.room.distance:.2f} noise={self.noise} snr={self.snr_db:.2f}")


def utterance_rng(seed: int, utt: str) -> np.random.Generator:
    return np.random.default_rng([seed, SEED_TAG, zlib.crc32(utt.encode("utf-8"))])


def draw_condition(rng: np.random.Generator, snr: Tuple[float, float]) -> Condition:
    """A held-out room (class uniform, then its ranges), noise kind and SNR; ``rng`` goes on to draw the noise."""
    room_class = list(ROOM_CLASSES)[int(rng.integers(len(ROOM_CLASSES)))]
    room = sample_room(ROOM_CLASSES[room_class], rng)
    return Condition(room_class, room, NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))], float(rng.uniform(*snr)))


def _unit_power(x: np.ndarray) -> Tensor:
    x = x - x.mean()
    return torch.from_numpy((x / math.sqrt(float(np.mean(x ** 2)) + 1e-30)).astype(np.float32))


def held_out_noise(kind: str, n: int, rng: np.random.Generator) -> Tensor:
    """``n`` samples (float32, unit power) of a held-out noise kind (module docstring)."""
    t = np.arange(n) / SAMPLE_RATE
    if kind in RISING_SLOPES:
        spectrum = np.fft.rfft(rng.standard_normal(n))
        freqs = np.fft.rfftfreq(n, d=1.0 / SAMPLE_RATE)
        spectrum *= (freqs / freqs[-1]) ** (RISING_SLOPES[kind] / 2)  # amplitude grows as f**(slope/2)
        return _unit_power(np.fft.irfft(spectrum, n))
    if kind == "hum":
        f0 = (50.0, 60.0)[int(rng.integers(2))]
        phases = rng.uniform(0, 2 * np.pi, HUM_HARMONICS)
        return _unit_power(sum(np.sin(2 * np.pi * f0 * k * t + phases[k - 1]) / k for k in range(1, HUM_HARMONICS + 1)))
    if kind == "bursty":
        spectrum = np.fft.rfft(rng.standard_normal(n))
        freqs = np.fft.rfftfreq(n, d=1.0 / SAMPLE_RATE)
        spectrum[(freqs < BURST_BAND_HZ[0]) | (freqs > BURST_BAND_HZ[1])] = 0.0
        band = np.fft.irfft(spectrum, n)
        gate = np.zeros(n)
        i = int(rng.integers(int(BURST_S[1] * SAMPLE_RATE)))  # the first burst starts within one gap
        while i < n:
            on = int(rng.uniform(*BURST_S) * SAMPLE_RATE)
            gate[i:i + on] = 1.0
            i += on + int(2 * rng.uniform(*BURST_S) * SAMPLE_RATE)
        if not gate.any():  # an utterance shorter than the first gap still gets a burst
            gate[: int(BURST_S[0] * SAMPLE_RATE)] = 1.0
        return _unit_power(band * gate)
    raise ValueError(f"unknown held-out noise kind '{kind}' (expected one of {', '.join(NOISE_KINDS)})")


def corrupt(wav: Tensor, utt: str, seed: int, snr: Tuple[float, float]) -> Tuple[Tensor, Condition]:
    """``wav`` (T,) at 16 kHz through its held-out room and noise: (T,) float32 and what was drawn."""
    rng = utterance_rng(seed, utt)
    cond = draw_condition(rng, snr)
    speech = reverberate(wav, simulate_rir(cond.room, SAMPLE_RATE, MAX_ORDER))
    mixed = mix_at_snr(speech, held_out_noise(cond.noise, wav.numel(), rng), cond.snr_db)
    if mixed is None:
        raise ValueError(f"utterance {utt}: silent audio: no SNR can be set")
    peak = float(mixed.abs().max())
    return (mixed * (PEAK / peak) if peak > PEAK else mixed), cond


def make_set(src: str, out: str, seed: int, snr: Tuple[float, float],
             audio_dir: Optional[str] = None) -> Dict[str, Condition]:
    """Write the corrupted copy of the data dir ``src`` into ``out``; returns each utterance's condition."""
    dd = read_data_dir(src)
    wav_dir = os.path.abspath(audio_dir or os.path.join(out, "wav"))
    os.makedirs(wav_dir, exist_ok=True)
    wav_scp: Dict[str, str] = {}
    durs: Dict[str, float] = {}
    conds: Dict[str, Condition] = {}
    for u in dd.utterances():
        wav = load_audio(u.source, SAMPLE_RATE, start=u.start, end=u.end, name=u.utt)
        audio, conds[u.utt] = corrupt(wav, u.utt, seed, snr)
        path = os.path.join(wav_dir, f"{u.utt}.flac")
        tmp = f"{path}.tmp.flac"
        soundfile.write(tmp, audio.numpy(), SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        os.replace(tmp, path)  # no half-written file if interrupted
        wav_scp[u.utt], durs[u.utt] = path, audio.numel() / SAMPLE_RATE
    write_data_dir(DataDir(wav_scp, None, dd.text, dd.utt2spk, durs), out)
    write_table(os.path.join(out, "conditions"), {u: c.describe() for u, c in conds.items()})
    return conds


def parse_snr(text: str) -> Tuple[float, float]:
    """``"5,20"`` -> (5.0, 20.0); low <= high."""
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--snr '{text}': expected LOW,HIGH in dB, e.g. 5,20") from None
    if low > high:
        raise ValueError(f"--snr '{text}': LOW is above HIGH")
    return low, high


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="make_reverb_noise_set.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", required=True, help="the clean Kaldi data dir (e.g. data/test)")
    parser.add_argument("--out", required=True, help="the data dir to write (e.g. data/test_reverb_noise)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--snr", default="5,20", help="SNR range in dB, drawn uniformly (default 5,20)")
    parser.add_argument("--audio-dir", help="put the FLACs here instead of OUT/wav/")
    args = parser.parse_args(argv)
    try:
        snr = parse_snr(args.snr)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        conds = make_set(args.src, args.out, args.seed, snr, args.audio_dir)
    except (AudioError, ConfigError, DataDirError, MissingExtraError, ValueError, OSError) as exc:
        print(f"make_reverb_noise_set.py: error: {exc}", file=sys.stderr)
        return 1
    kinds = ", ".join(f"{k} {sum(c.noise == k for c in conds.values())}" for k in NOISE_KINDS)
    rooms = ", ".join(f"{k} {sum(c.room_class == k for c in conds.values())}" for k in ROOM_CLASSES)
    print(f"{args.out}: {len(conds)} utterances; rooms: {rooms}; noises: {kinds}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
