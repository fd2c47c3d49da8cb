#!/usr/bin/env python3
"""Synthesize a small English ASR corpus (Kaldi data dirs) with espeak-ng.

Usage:
    python tools/make_synthetic_corpus.py --out data --num-train 1000 --num-dev 100 --num-test 100 \\
        --seed 0 [--snr-db 20 | --no-noise] [--jobs 2] [--audio-dir DIR] [--sentences FILE]

Writes ``OUT/train``, ``OUT/dev`` and ``OUT/test``, each holding ``wav.scp``, ``text``, ``utt2spk``,
``spk2utt`` and ``utt2dur`` (sorted by key), with 16 kHz 16-bit mono FLAC files under
``OUT/<split>/wav/`` (or ``AUDIO_DIR/<split>/``); ``wav.scp`` holds absolute paths.

* Sentences come from ``tools/corpus/sentences.txt`` (public-domain novels, upper case A-Z,
  apostrophes and spaces; see ``tools/corpus/README.md``). The three splits use disjoint
  sentences; train reuses its own sentences (with new voices and prosody) only when asked for
  more utterances than it has sentences.
* A speaker is an espeak-ng voice plus a voice variant, e.g. ``enus_m3`` = ``en-us+m3``; utterance
  ids start with the speaker id (Kaldi convention, so sorting keeps speakers together).
  train and dev draw speakers from the same pool; every other test utterance uses a voice or a
  variant that never occurs in train, the rest use train speakers.
* Each utterance gets its own speaking rate (espeak ``-s``), pitch (``-p``), level and leading /
  trailing silence, and, unless ``--no-noise``, white, pink or brown Gaussian noise scaled so that
  (utterance power) / (noise power) is exactly ``--snr-db``.
* Everything is drawn from RNGs seeded by (seed, split, utterance index): the same seed gives
  byte-identical table files and identical audio whatever ``--jobs`` is, and the noise is drawn
  from its own stream, so a ``--no-noise`` run yields the clean signal of a noisy run.
"""
from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import soundfile
from scipy.signal import resample_poly
from tqdm import tqdm

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)  # run as a script from anywhere: asrkit lives in the repo root

from asrkit.data.table import write_table  # noqa: E402

DEFAULT_SENTENCES = os.path.join(_REPO, "tools", "corpus", "sentences.txt")
SAMPLE_RATE = 16000
SPLITS = ("train", "dev", "test")

# espeak-ng voice -> short speaker-id code (letters only, so "-" sorts before every code character
# and utterance ids sort speaker by speaker). mbrola voices are left out: they need extra packages.
TRAIN_VOICES: Dict[str, str] = {
    "en-us": "enus",
    "en-gb": "engb",
    "en-gb-x-rp": "enrp",
    "en-gb-scotland": "ensc",
    "en-029": "encb",
}
HELDOUT_VOICES: Dict[str, str] = {
    "en-us-nyc": "enny",
    "en-gb-x-gbclan": "enla",
    "en-gb-x-gbcwmd": "enwm",
}
# Formant variants (male, female, Klatt synthesiser); whisper/croak-like variants are left out.
TRAIN_VARIANTS: Tuple[str, ...] = ("m1", "m2", "m3", "m4", "m6", "f1", "f2", "f3", "f4", "klatt", "klatt3")
HELDOUT_VARIANTS: Tuple[str, ...] = ("m7", "f5", "klatt2")

RATE_WPM = (135, 195)        # espeak -s range (default 175 words per minute)
PITCH = (25, 75)             # espeak -p range (0-99, default 50)
PEAK_LEVEL = (0.25, 0.7)     # peak amplitude of the clean speech, full scale = 1
SILENCE_S = (0.05, 0.35)     # leading and trailing silence added to each utterance
NOISE_KINDS = ("white", "pink", "brown")
NOISE_CORNER_HZ = 100.0      # shaped noise is flat below this frequency

_SENTENCE_RE = re.compile(r"[A-Z']+(?: [A-Z']+)*")


@dataclass(frozen=True)
class Speaker:
    """An espeak-ng voice + variant; ``spk_id`` is the Kaldi speaker id."""

    voice: str
    variant: str
    spk_id: str

    @property
    def espeak_voice(self) -> str:
        return f"{self.voice}+{self.variant}"


@dataclass(frozen=True)
class UttSpec:
    """Everything needed to render one utterance; rendering is a pure function of this."""

    utt_id: str
    text: str
    speaker: Speaker
    rate: int
    pitch: int
    peak: float
    lead_s: float
    tail_s: float
    snr_db: Optional[float]
    noise_kind: str
    noise_seed: Tuple[int, ...]
    path: str


def _speakers(voices: Dict[str, str], variants: Sequence[str]) -> List[Speaker]:
    return [Speaker(v, var, f"{code}_{var}") for v, code in voices.items() for var in variants]


def speaker_pools() -> Tuple[List[Speaker], List[Speaker]]:
    """Return (speakers used in train/dev, speakers never used in train)."""
    seen = _speakers(TRAIN_VOICES, TRAIN_VARIANTS)
    unseen = (_speakers(HELDOUT_VOICES, TRAIN_VARIANTS + HELDOUT_VARIANTS)
              + _speakers(TRAIN_VOICES, HELDOUT_VARIANTS))
    return seen, unseen


def load_sentences(path: str) -> List[str]:
    """Read one normalised sentence per line; malformed or repeated lines are errors naming the line."""
    sentences: List[str] = []
    first_line: Dict[str, int] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\n")
            if not _SENTENCE_RE.fullmatch(line):
                raise ValueError(f"{path}:{lineno}: not an upper-case sentence of A-Z, apostrophes and "
                                 f"single spaces: {line!r}")
            if line in first_line:
                raise ValueError(f"{path}:{lineno}: duplicate sentence (first on line {first_line[line]})")
            first_line[line] = lineno
            sentences.append(line)
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    return sentences


def plan_corpus(sentences: Sequence[str], counts: Dict[str, int], seed: int, snr_db: Optional[float],
                out_dir: str, audio_dir: Optional[str] = None) -> Dict[str, List[UttSpec]]:
    """Assign sentences, speakers and synthesis settings to every utterance of every split.

    Test and dev sentences are taken first from one seeded permutation, so they do not depend on
    the number of training utterances; train takes the rest.
    """
    n_heldout = counts["test"] + counts["dev"]
    if (n_heldout >= len(sentences) and counts["train"] > 0) or n_heldout > len(sentences):
        raise ValueError(f"{counts['dev']} dev + {counts['test']} test utterances need that many distinct "
                         f"sentences and leave none for train; the corpus has {len(sentences)}")
    order = np.random.default_rng([seed, 7919]).permutation(len(sentences))
    pools = {"test": order[:counts["test"]], "dev": order[counts["test"]:n_heldout], "train": order[n_heldout:]}
    if counts["train"] > len(pools["train"]):
        print(f"note: {counts['train']} train utterances but {len(pools['train'])} train sentences: "
              "sentences are reused with other voices", file=sys.stderr)
    seen, unseen = speaker_pools()
    plan: Dict[str, List[UttSpec]] = {}
    for split_idx, split in enumerate(SPLITS):
        wav_dir = os.path.abspath(os.path.join(audio_dir, split) if audio_dir else os.path.join(out_dir, split, "wav"))
        specs = []
        for i in range(counts[split]):
            rng = np.random.default_rng([seed, split_idx, i])
            # Test: even indices get an unseen voice/variant, so even a 1-utterance test set has one.
            pool = unseen if split == "test" and i % 2 == 0 else seen
            speaker = pool[int(rng.integers(len(pool)))]
            utt_id = f"{speaker.spk_id}-{split}{i:06d}"
            specs.append(UttSpec(
                utt_id=utt_id,
                text=sentences[int(pools[split][i % len(pools[split])])],
                speaker=speaker,
                rate=int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1)),
                pitch=int(rng.integers(PITCH[0], PITCH[1] + 1)),
                peak=float(rng.uniform(*PEAK_LEVEL)),
                lead_s=float(rng.uniform(*SILENCE_S)),
                tail_s=float(rng.uniform(*SILENCE_S)),
                snr_db=snr_db,
                noise_kind=NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))],
                noise_seed=(seed, split_idx, i, 1),
                path=os.path.join(wav_dir, f"{utt_id}.flac"),
            ))
        plan[split] = specs
    return plan


def espeak(text: str, voice: str, rate: int, pitch: int, utt_id: str, binary: str = "espeak-ng") -> Tuple[np.ndarray, int]:
    """Run espeak-ng and return (waveform float64 (T,), sample rate)."""
    # Lower case: espeak reads all-caps words as abbreviations ("IT" -> "I T", "AM" -> "a.m.").
    cmd = [binary, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", "--", text.lower()]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0 or not proc.stdout:
        raise RuntimeError(f"utterance {utt_id}: espeak-ng failed (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()} [{' '.join(cmd)}]")
    audio, sr = soundfile.read(io.BytesIO(proc.stdout), dtype="float64")
    if audio.ndim != 1 or audio.size == 0:
        raise RuntimeError(f"utterance {utt_id}: espeak-ng returned no mono audio [{' '.join(cmd)}]")
    return audio, sr


def make_noise(kind: str, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-power Gaussian noise (T,): white, pink (1/f power) or brown (1/f^2 power).

    Shaped noise is flat below ``NOISE_CORNER_HZ`` so its power lies in the speech band rather
    than in inaudible sub-20 Hz rumble.
    """
    white = rng.standard_normal(num_samples)
    if kind == "white":
        noise = white
    elif kind in ("pink", "brown"):
        spec = np.fft.rfft(white)
        freqs_hz = np.fft.rfftfreq(num_samples, d=1.0 / SAMPLE_RATE)
        exponent = 0.5 if kind == "pink" else 1.0  # amplitude slope for 1/f or 1/f^2 power
        noise = np.fft.irfft(spec / np.maximum(freqs_hz, NOISE_CORNER_HZ) ** exponent, n=num_samples)
    else:
        raise ValueError(f"unknown noise kind '{kind}' (expected one of {', '.join(NOISE_KINDS)})")
    noise = noise - noise.mean()
    return noise / np.sqrt(np.mean(noise ** 2) + 1e-20)


def render(spec: UttSpec, binary: str = "espeak-ng") -> np.ndarray:
    """Synthesize one utterance: 16 kHz float64 waveform (T,) in [-1, 1]."""
    audio, sr = espeak(spec.text, spec.speaker.espeak_voice, spec.rate, spec.pitch, spec.utt_id, binary)
    if sr != SAMPLE_RATE:
        g = np.gcd(sr, SAMPLE_RATE)
        audio = resample_poly(audio, SAMPLE_RATE // g, sr // g)
    peak = np.max(np.abs(audio))
    if peak <= 0:
        raise RuntimeError(f"utterance {spec.utt_id}: espeak-ng produced silence for {spec.text!r}")
    audio = audio * (spec.peak / peak)
    audio = np.concatenate([np.zeros(round(spec.lead_s * SAMPLE_RATE)), audio,
                            np.zeros(round(spec.tail_s * SAMPLE_RATE))])
    if spec.snr_db is not None:
        noise = make_noise(spec.noise_kind, audio.size, np.random.default_rng(list(spec.noise_seed)))
        speech_power = np.mean(audio ** 2)
        audio = audio + noise * np.sqrt(speech_power / 10 ** (spec.snr_db / 10))
        mix_peak = np.max(np.abs(audio))
        if mix_peak > 0.99:  # scale the mixture, not the noise, so the SNR stays as asked
            audio = audio * (0.99 / mix_peak)
    return audio


def _render_to_file(args: Tuple[UttSpec, str]) -> Tuple[str, int]:
    spec, binary = args
    audio = render(spec, binary)
    tmp = f"{spec.path}.tmp{os.getpid()}.flac"
    soundfile.write(tmp, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    os.replace(tmp, spec.path)  # no half-written FLAC if interrupted
    return spec.utt_id, audio.size


def make_corpus(out_dir: str, num_train: int, num_dev: int, num_test: int, seed: int = 0,
                snr_db: Optional[float] = 20.0, jobs: int = 1, audio_dir: Optional[str] = None,
                sentences_path: str = DEFAULT_SENTENCES, espeak_binary: str = "espeak-ng",
                progress: bool = True) -> Dict[str, List[UttSpec]]:
    """Synthesize the train/dev/test data dirs under ``out_dir``; returns the plan that was rendered."""
    binary = shutil.which(espeak_binary)
    if binary is None:
        raise FileNotFoundError(f"espeak-ng not found ('{espeak_binary}'); install it, e.g. apt-get install espeak-ng")
    counts = {"train": num_train, "dev": num_dev, "test": num_test}
    plan = plan_corpus(load_sentences(sentences_path), counts, seed, snr_db, out_dir, audio_dir)
    work = [(spec, binary) for split in SPLITS for spec in plan[split]]
    for spec, _ in work:
        os.makedirs(os.path.dirname(spec.path), exist_ok=True)
    bar = tqdm(total=len(work), desc="synthesizing", unit="utt", disable=not progress)
    num_samples: Dict[str, int] = {}
    if jobs <= 1:
        for item in work:
            utt_id, n = _render_to_file(item)
            num_samples[utt_id] = n
            bar.update()
    else:
        with multiprocessing.Pool(jobs) as pool:
            for utt_id, n in pool.imap_unordered(_render_to_file, work, chunksize=8):
                num_samples[utt_id] = n
                bar.update()
    bar.close()
    for split in SPLITS:
        data_dir = os.path.join(out_dir, split)
        os.makedirs(data_dir, exist_ok=True)
        specs = plan[split]
        write_table(os.path.join(data_dir, "wav.scp"), {s.utt_id: s.path for s in specs})
        write_table(os.path.join(data_dir, "text"), {s.utt_id: s.text for s in specs})
        write_table(os.path.join(data_dir, "utt2spk"), {s.utt_id: s.speaker.spk_id for s in specs})
        write_table(os.path.join(data_dir, "utt2dur"),
                    {s.utt_id: f"{num_samples[s.utt_id] / SAMPLE_RATE:.4f}" for s in specs})
        spk2utt: Dict[str, List[str]] = {}
        for s in sorted(specs, key=lambda s: s.utt_id):
            spk2utt.setdefault(s.speaker.spk_id, []).append(s.utt_id)
        write_table(os.path.join(data_dir, "spk2utt"), {k: " ".join(v) for k, v in spk2utt.items()})
    return plan


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="make_synthetic_corpus.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory; gets train/ dev/ test/")
    parser.add_argument("--num-train", type=int, required=True)
    parser.add_argument("--num-dev", type=int, required=True)
    parser.add_argument("--num-test", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("--snr-db", type=float, default=20.0, help="additive noise SNR in dB (default 20)")
    noise.add_argument("--no-noise", action="store_true", help="clean speech, no added noise")
    parser.add_argument("--jobs", type=int, default=1, help="parallel synthesis processes")
    parser.add_argument("--audio-dir", help="put FLACs under AUDIO_DIR/<split>/ instead of OUT/<split>/wav/")
    parser.add_argument("--sentences", default=DEFAULT_SENTENCES, help="normalised sentence list, one per line")
    parser.add_argument("--espeak", default="espeak-ng", help="espeak-ng executable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    for name in ("num_train", "num_dev", "num_test"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.num_train + args.num_dev + args.num_test == 0:
        parser.error("nothing to synthesize: all of --num-train/--num-dev/--num-test are 0")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if not args.no_noise and not -20.0 <= args.snr_db <= 100.0:
        parser.error(f"--snr-db {args.snr_db} is outside [-20, 100]")
    try:
        make_corpus(args.out, args.num_train, args.num_dev, args.num_test, seed=args.seed,
                    snr_db=None if args.no_noise else args.snr_db, jobs=args.jobs, audio_dir=args.audio_dir,
                    sentences_path=args.sentences, espeak_binary=args.espeak, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"make_synthetic_corpus.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
