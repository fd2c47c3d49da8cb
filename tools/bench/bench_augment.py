#!/usr/bin/env python3
"""What waveform augmentation costs a loader worker, per kind, on synthetic audio (one CPU thread).

Usage: python tools/bench/bench_augment.py [--utts 40] [--seconds 5] [--rooms 50]

Prints milliseconds per utterance for each kind alone (reverb from the simulated bank, pink noise, babble of
3-6 utterances, band, gain, VTLP's draw), for all of them at once, for loading the utterance from a wav file
(what the loader does anyway), and what a simulated room costs: the bank's construction per room (paid once per
run) against simulating a room for every utterance instead.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from asrkit.audio.io import load_audio
from asrkit.audio.reverb import sample_room, simulate_rir
from asrkit.audio.waveaug import WaveAugment
from asrkit.config import AugmentConfig, BandConfig, GainConfig, NoiseConfig, ReverbConfig, VtlpConfig

RATE = 16000


def _ms_per_utt(fn, n: int) -> float:
    fn(0)  # warm up (imports, FFT plans)
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) * 1000.0 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utts", type=int, default=40, help="utterances timed per kind")
    parser.add_argument("--seconds", type=float, default=5.0, help="utterance length")
    parser.add_argument("--rooms", type=int, default=50, help="rooms in the simulated bank")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    wav = torch.from_numpy((0.1 * rng.standard_normal(int(args.seconds * RATE))).astype(np.float32))
    reverb = ReverbConfig(prob=1.0, num_rooms=args.rooms)
    simulate_rir(sample_room(reverb, np.random.default_rng(0)), RATE, reverb.max_order)  # import pyroomacoustics
    start = time.perf_counter()
    WaveAugment(AugmentConfig(reverb=reverb), RATE, seed=1)
    bank_ms = (time.perf_counter() - start) * 1000.0 / args.rooms
    per_utt_sim = _ms_per_utt(lambda i: simulate_rir(sample_room(reverb, np.random.default_rng(i)), RATE,
                                                     reverb.max_order), min(args.utts, 20))
    kinds = {
        "reverb (bank)": AugmentConfig(reverb=reverb),
        "noise pink": AugmentConfig(noise=NoiseConfig(prob=1.0, generated=("pink",))),
        "noise babble": AugmentConfig(noise=NoiseConfig(prob=1.0, generated=("babble",))),
        "band": AugmentConfig(band=BandConfig(prob=1.0)),
        "gain": AugmentConfig(gain=GainConfig(prob=1.0)),
        "vtlp (draw)": AugmentConfig(vtlp=VtlpConfig(prob=1.0)),
        "all": AugmentConfig(reverb=reverb, noise=NoiseConfig(prob=1.0), band=BandConfig(prob=1.0),
                             gain=GainConfig(prob=1.0), vtlp=VtlpConfig(prob=1.0)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "utt.wav")
        sf.write(path, wav.numpy(), RATE, subtype="PCM_16")
        load_ms = _ms_per_utt(lambda i: load_audio(path, RATE), args.utts)

        def others(k, g):  # babble reads its utterances as the loader does
            return [load_audio(path, RATE) for _ in range(k)]

        print(f"{args.seconds:g} s utterances, {args.utts} per row, 1 thread")
        print(f"{'reading the wav (for scale)':32s} {load_ms:8.2f} ms/utt")
        for name, cfg in kinds.items():
            aug = WaveAugment(cfg, RATE, seed=1)
            ms = _ms_per_utt(lambda i: aug(wav, f"utt{i}", 1, others=others), args.utts)
            print(f"{name:32s} {ms:8.2f} ms/utt")
    print(f"{'a room, in the bank (once)':32s} {bank_ms:8.2f} ms/room")
    print(f"{'a room simulated per utterance':32s} {per_utt_sim:8.2f} ms/utt")


if __name__ == "__main__":
    main()
