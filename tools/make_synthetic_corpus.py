#!/usr/bin/env python3
"""Synthesize a small English ASR corpus (Kaldi data dirs) with espeak-ng, festival and flite.

Usage:
    python tools/make_synthetic_corpus.py --out data --num-train 1000 --num-dev 100 --num-test 100 \\
        [--num-test-unseen 100] [--train-synths espeak:2,festival,flite] [--unseen-synth flite] \\
        [--unseen-voices awb,rms] [--derived-voices false|true] [--extra-train SPK:N,...] --seed 0 \\
        [--snr-db 20 | --no-noise] [--jobs 2] [--audio-dir DIR] [--sentences FILE]

Writes ``OUT/train``, ``OUT/dev``, ``OUT/test`` and (unless ``--num-test-unseen 0``) ``OUT/test_unseen``,
each holding ``wav.scp``, ``text``, ``utt2spk``, ``spk2utt`` and ``utt2dur`` (sorted by key), with 16 kHz
16-bit mono FLAC files under ``OUT/<split>/wav/`` (or ``AUDIO_DIR/<split>/``); ``wav.scp`` holds
absolute paths.

* Sentences come from ``tools/corpus/sentences.txt`` (public-domain novels, upper case A-Z,
  apostrophes and spaces; see ``tools/corpus/README.md``). The four splits use disjoint
  sentences; train reuses its own sentences (with new voices and prosody) only when asked for
  more utterances than it has sentences.
* Synthesizers (back-ends in ``tools/synthesizers.py``): espeak-ng voices x variants (every variant the
  engine has but three held out), festival's ``kal_diphone``, ``ked_diphone`` and ``cmu_us_slt_arctic_hts``,
  flite's ``awb``, ``rms``, ``slt``, ``kal16`` and ``kal`` (8 kHz). train, dev and test use ``--train-synths``
  (default ``espeak:2,festival,flite``: half espeak, a quarter each festival and flite); ``NAME:WEIGHT``
  sets a synthesizer's share of the utterances (default weight 1). The shares are exact, not drawn:
  utterance i of a split goes to the synthesizer furthest behind its share. test_unseen uses only
  ``--unseen-synth`` (default flite) with ``--unseen-voices`` (default for flite ``awb,rms``: its slt, kal16
  and kal are the speakers of festival's slt and kal); those voices are never in train, dev or test, and the
  unseen synthesizer's other voices train like any other (flite's slt, kal16 and kal by default).
* A speaker is a synthesizer voice (+ espeak variant): espeak ``enus_m3`` = ``en-us+m3``, festival
  ``fest_kal``/``fest_ked``/``fest_slt``, flite ``flite_awb``/``flite_rms``/``flite_slt``/``flite_kal``/
  ``flite_kal8``.
  ``--derived-voices true`` adds derived speakers, each drawn like any other voice of its synthesizer: flite's
  slt as a man ``flite_slt_m`` (its F0 setting x 0.8, then formants and F0 x 0.85 by resampling: ~117 Hz),
  festival's slt as a man ``fest_slt_m`` (x 0.85 by resampling alone: its HTS engine takes no F0 setting) and
  festival's kal and ked as women ``fest_kal_f``/``fest_ked_f`` (F0 x 1.6, formants x 1.17); the speaking rate
  given to the engine undoes the resampling's change of duration (``tools/synthesizers.py``). test_unseen never
  has them, nor does any other split have one derived from a held-out voice. Off by default (the corpus is then
  the same as before the option existed).
  ``--extra-train flite_slt_m:400`` adds 400 train utterances of one speaker (any training or derived speaker)
  after the ``--num-train`` drawn ones, which stay byte-identical, as do dev, test and test_unseen: a lever on
  the training voices that leaves every test set the same audio.
  Utterance ids start with the speaker id (Kaldi convention, so sorting keeps speakers together).
  train and dev draw speakers from the same pool; every other espeak test utterance uses an espeak voice
  or variant that never occurs in train, the rest use train speakers.
* Each utterance gets its own speaking rate and pitch (factors of the voice's default, told to each
  engine in its own terms; espeak-ng's wider, nearly its whole 0-99 pitch scale, and its intonation range
  and pauses between words too), level and leading / trailing silence (the synthesizer's own silence is trimmed
  first, see ``TRIM_DB``), and, unless ``--no-noise``, white, pink or brown Gaussian noise scaled so that (utterance power) / (noise power) is exactly ``--snr-db``.
* Everything is drawn from RNGs seeded by (seed, split, utterance index): the same seed gives
  byte-identical table files and identical audio whatever ``--jobs`` is, and the noise is drawn
  from its own stream, so a ``--no-noise`` run yields the clean signal of a noisy run.
* festival renders batches of ``FESTIVAL_BATCH`` utterances per process (fixed by the plan, not by
  ``--jobs``); espeak-ng and flite run once per utterance. Only the synthesizers a run uses must be
  installed.
"""
from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import soundfile
from tqdm import tqdm

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)  # run as a script from anywhere: asrkit lives in the repo root

from asrkit.data.table import write_table  # noqa: E402
from asrkit.extras import MissingExtraError, require  # noqa: E402


def _load_synthesizers() -> ModuleType:
    """tools/synthesizers.py by path: putting tools/ on sys.path would shadow packages (tools/kenlm)."""
    name = "asrkit_tools_synthesizers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_REPO, "tools", "synthesizers.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look their module up there
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


synthesizers = _load_synthesizers()
SAMPLE_RATE, SYNTHS, Speaker = synthesizers.SAMPLE_RATE, synthesizers.SYNTHS, synthesizers.Speaker
espeak, voices = synthesizers.espeak, synthesizers.voices  # espeak: used by the LibriSpeech recipe test

DEFAULT_SENTENCES = os.path.join(_REPO, "tools", "corpus", "sentences.txt")
SPLITS = ("train", "dev", "test", "test_unseen")
DEFAULT_TRAIN_SYNTHS: Dict[str, float] = {"espeak": 2.0, "festival": 1.0, "flite": 1.0}
DEFAULT_UNSEEN_SYNTH = "flite"
DEFAULT_UNSEEN_VOICES: Dict[str, Tuple[str, ...]] = {"flite": ("awb", "rms")}
FESTIVAL_BATCH = 48          # utterances per festival process (its start costs ~0.2 s CPU)
OTHER_BATCH = 8              # utterances per task for the one-process-per-utterance synthesizers

RATE = (0.78, 1.12)          # speaking-rate factor (festival, flite)
PITCH = (0.85, 1.18)         # F0 factor (festival, flite)
ESPEAK_RATE = (0.7, 1.3)     # espeak-ng: 122-228 words per minute (it stays intelligible far beyond)
ESPEAK_PITCH = (0.67, 1.33)  # espeak-ng: -p 0-99, its whole scale
PITCH_RANGE = (0.5, 2.0)     # espeak-ng's intonation range, x the voice's own (the engine caps it at 2)
WORD_GAP = 4                 # espeak-ng: 0-3 x 10 ms of extra pause between words, drawn uniformly
PEAK_LEVEL = (0.25, 0.7)     # peak amplitude of the clean speech, full scale = 1
SILENCE_S = (0.05, 0.35)     # leading and trailing silence added to each utterance
# A synthesizer's own leading / trailing silence (10 ms frames this far below the loudest frame) is cut first,
# so every utterance's margins are the drawn SILENCE_S: espeak-ng appends ~0.3 s of zeros and flite and
# festival 0.2-0.5 s at -50 to -70 dB, ~9% of the demo's training compute and a voice cue nothing needs.
# Word-final fricatives stay above -40 dB in all three engines.
TRIM_DB = -45.0
NOISE_KINDS = ("white", "pink", "brown")
NOISE_CORNER_HZ = 100.0      # shaped noise is flat below this frequency

_SENTENCE_RE = re.compile(r"[A-Z']+(?: [A-Z']+)*")


@dataclass(frozen=True)
class UttSpec:
    """Everything needed to render one utterance; rendering is a pure function of this."""

    utt_id: str
    text: str
    speaker: Speaker
    rate: float              # speaking-rate factor, 1 = the voice's default
    pitch: float             # F0 factor, 1 = the voice's default
    pitch_range: float       # espeak-ng: intonation range factor, 1 = the voice's own
    word_gap: int            # espeak-ng: extra pause between words, 10 ms units
    peak: float
    lead_s: float
    tail_s: float
    snr_db: Optional[float]
    noise_kind: str
    noise_seed: Tuple[int, ...]
    path: str


@dataclass(frozen=True)
class SynthChoice:
    """Which synthesizers make which splits."""

    train_synths: Dict[str, float]                  # synthesizer -> weight (share of train/dev/test)
    unseen_synth: str = DEFAULT_UNSEEN_SYNTH
    unseen_voices: Optional[Tuple[str, ...]] = None  # None: DEFAULT_UNSEEN_VOICES or all voices
    derived: bool = False                            # add the derived speakers (synthesizers.DERIVED_VOICES)
    extra_train: Tuple[Tuple[str, int], ...] = ()    # (speaker id, utterances) added to train only

    def train_pool(self, synth: str) -> List[Speaker]:
        """The speakers of ``synth`` that train, dev and test draw from: the unseen voices are never among them,
        nor the speakers derived from them."""
        return self._pool(synth, self.derived)

    def _pool(self, synth: str, derived: bool) -> List[Speaker]:
        held = {s.voice for s in self.unseen_pool()} if synth == self.unseen_synth else set()
        pool = voices(synth) + (synthesizers.derived_voices(synth) if derived else [])
        return [s for s in pool if s.voice not in held]

    def extra_train_speakers(self) -> List[Tuple[Speaker, int]]:
        """``extra_train`` resolved: any speaker of a training synthesizer, derived ones included, but never a
        held-out voice nor one derived from it."""
        known = {s.spk_id: s for synth in self.train_synths for s in self._pool(synth, derived=True)}
        out = []
        for spk_id, count in self.extra_train:
            if spk_id not in known:
                derived = sorted(s.spk_id for synth in self.train_synths for s in synthesizers.derived_voices(synth)
                                 if s.spk_id in known)
                raise ValueError(f"--extra-train: '{spk_id}' is not a speaker of the training synthesizers "
                                 f"({', '.join(self.train_synths)}) outside test_unseen's voices; expected a "
                                 f"training speaker id (utt2spk) or a derived one ({', '.join(derived) or 'none'})")
            out.append((known[spk_id], count))
        return out

    def unseen_pool(self) -> List[Speaker]:
        pool = voices(self.unseen_synth)
        names = self.unseen_voices or DEFAULT_UNSEEN_VOICES.get(self.unseen_synth) or tuple(s.voice for s in pool)
        unknown = sorted(set(names) - {s.voice for s in pool})
        if unknown:
            raise ValueError(f"unknown {self.unseen_synth} voice(s) {', '.join(unknown)} in --unseen-voices "
                             f"(expected some of {', '.join(s.voice for s in pool)})")
        return [s for s in pool if s.voice in names]

    def check(self) -> None:
        if not self.train_synths or any(w <= 0 for w in self.train_synths.values()):
            raise ValueError("--train-synths needs at least one synthesizer, every weight > 0")
        for synth in (*self.train_synths, self.unseen_synth):
            if synth not in SYNTHS:
                raise ValueError(f"unknown synthesizer '{synth}' (expected one of {', '.join(SYNTHS)})")
        self.unseen_pool()
        self.extra_train_speakers()
        if self.unseen_synth in self.train_synths and not self.train_pool(self.unseen_synth):
            raise ValueError(f"every {self.unseen_synth} voice is held out for test_unseen (--unseen-voices): "
                             f"leave {self.unseen_synth} out of --train-synths or hold out fewer voices")

    def twins(self) -> List[str]:
        """Unseen voices that are a training synthesizer's speaker under another engine."""
        out = []
        for spk in self.unseen_pool():
            twin = synthesizers.SAME_SPEAKER.get((spk.synth, spk.voice))
            if twin and twin[0] in self.train_synths:
                out.append(f"{spk.synth} {spk.voice} (= {twin[0]} {twin[1]})")
        return out


def parse_synth_weights(arg: str) -> Dict[str, float]:
    """``"espeak:2,festival"`` -> ``{"espeak": 2.0, "festival": 1.0}``."""
    weights: Dict[str, float] = {}
    for item in arg.split(","):
        name, _, weight = item.strip().partition(":")
        if name not in SYNTHS:
            raise ValueError(f"unknown synthesizer '{name}' in '{arg}' (expected one of {', '.join(SYNTHS)})")
        if name in weights:
            raise ValueError(f"synthesizer '{name}' given twice in '{arg}'")
        try:
            weights[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"bad weight '{weight}' for {name} in '{arg}' (expected NAME[:WEIGHT])") from None
        if not weights[name] > 0:
            raise ValueError(f"weight of {name} in '{arg}' must be > 0")
    return weights


def parse_extra_train(arg: str) -> Tuple[Tuple[str, int], ...]:
    """``"flite_slt_m:400,fest_kal:100"`` -> ``(("flite_slt_m", 400), ("fest_kal", 100))``; ``""`` -> ``()``."""
    out: Dict[str, int] = {}
    for item in filter(None, (part.strip() for part in arg.split(","))):
        spk_id, sep, count = item.partition(":")
        if not sep or not count.isdigit() or int(count) <= 0:
            raise ValueError(f"bad --extra-train item '{item}' in '{arg}' (expected SPEAKER:N with N > 0)")
        if spk_id in out:
            raise ValueError(f"speaker '{spk_id}' given twice in --extra-train '{arg}'")
        out[spk_id] = int(count)
    return tuple(out.items())


def synth_sequence(weights: Dict[str, float], n: int) -> List[str]:
    """The synthesizer of each of n utterances: each goes to the one furthest behind its share."""
    total = sum(weights.values())
    counts = {k: 0 for k in weights}
    out = []
    for i in range(n):
        synth = max(weights, key=lambda k: (i + 1) * weights[k] / total - counts[k])  # ties: first listed
        counts[synth] += 1
        out.append(synth)
    return out


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
                out_dir: str, audio_dir: Optional[str] = None,
                synths: Optional[SynthChoice] = None) -> Dict[str, List[UttSpec]]:
    """Assign sentences, speakers and synthesis settings to every utterance of every split.

    ``counts`` maps split -> utterances (a missing test_unseen is 0). Test, dev and test_unseen
    sentences are taken first from one seeded permutation, so they do not depend on the number of
    training utterances; train takes the rest.
    """
    synths = synths or SynthChoice(dict(DEFAULT_TRAIN_SYNTHS))
    synths.check()
    counts = {split: counts.get(split, 0) for split in SPLITS}
    n_heldout = counts["test"] + counts["dev"] + counts["test_unseen"]
    n_train = counts["train"] + sum(n for _, n in synths.extra_train)
    if (n_heldout >= len(sentences) and n_train > 0) or n_heldout > len(sentences):
        raise ValueError(f"{counts['dev']} dev + {counts['test']} test + {counts['test_unseen']} test_unseen "
                         f"utterances need that many distinct sentences and leave none for train; the corpus "
                         f"has {len(sentences)}")
    order = np.random.default_rng([seed, 7919]).permutation(len(sentences))
    bounds = np.cumsum([counts["test"], counts["dev"], counts["test_unseen"]])
    pools = {"test": order[:bounds[0]], "dev": order[bounds[0]:bounds[1]],
             "test_unseen": order[bounds[1]:bounds[2]], "train": order[bounds[2]:]}
    if n_train > len(pools["train"]):
        print(f"note: {n_train} train utterances but {len(pools['train'])} train sentences: "
              "sentences are reused with other voices", file=sys.stderr)
    seen = {synth: synths.train_pool(synth) for synth in synths.train_synths}
    heldout = synthesizers.espeak_heldout_speakers()
    plan: Dict[str, List[UttSpec]] = {}
    for split_idx, split in enumerate(SPLITS):
        wav_dir = os.path.abspath(os.path.join(audio_dir, split) if audio_dir else os.path.join(out_dir, split, "wav"))
        if split == "test_unseen":
            sequence = [synths.unseen_synth] * counts[split]
        else:
            sequence = synth_sequence(synths.train_synths, counts[split])
        specs = []
        num_espeak = 0
        for i, synth in enumerate(sequence):
            rng = np.random.default_rng([seed, split_idx, i])
            if split == "test_unseen":
                pool = synths.unseen_pool()
            elif synth == "espeak" and split == "test":
                # Even espeak test utterances get an unseen voice/variant, so even 1 such utterance has one.
                pool = heldout if num_espeak % 2 == 0 else seen[synth]
                num_espeak += 1
            else:
                pool = seen[synth]
            speaker = pool[int(rng.integers(len(pool)))]
            specs.append(_draw_spec(rng, (seed, split_idx, i), f"{split}{i:06d}", speaker,
                                    sentences[int(pools[split][i % len(pools[split])])], snr_db, wav_dir))
        if split == "train":
            # after every drawn utterance, so that train's first counts["train"] and the other splits are as without
            i = counts["train"]
            for speaker, count in synths.extra_train_speakers():
                for _ in range(count):
                    rng = np.random.default_rng([seed, split_idx, i])
                    specs.append(_draw_spec(rng, (seed, split_idx, i), f"{split}{i:06d}", speaker,
                                            sentences[int(pools[split][i % len(pools[split])])], snr_db, wav_dir))
                    i += 1
        plan[split] = specs
    return plan


def _draw_spec(rng: np.random.Generator, noise_seed: Tuple[int, ...], name: str, speaker: Speaker, text: str,
               snr_db: Optional[float], wav_dir: str) -> UttSpec:
    """One utterance's settings, drawn from ``rng`` (after its speaker); its id is ``<speaker>-<name>``."""
    espeak_voice = speaker.synth == "espeak"
    utt_id = f"{speaker.spk_id}-{name}"
    return UttSpec(
        utt_id=utt_id,
        text=text,
        speaker=speaker,
        # 3 decimals: the engines get the same numbers whatever the platform's float printing
        rate=round(float(rng.uniform(*(ESPEAK_RATE if espeak_voice else RATE))), 3),
        pitch=round(float(rng.uniform(*(ESPEAK_PITCH if espeak_voice else PITCH))), 3),
        peak=float(rng.uniform(*PEAK_LEVEL)),
        lead_s=float(rng.uniform(*SILENCE_S)),
        tail_s=float(rng.uniform(*SILENCE_S)),
        snr_db=snr_db,
        noise_kind=NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))],
        # drawn last, so that every earlier draw (and so test_unseen's audio) is as before they existed
        pitch_range=round(float(rng.uniform(*PITCH_RANGE)), 2),
        word_gap=int(rng.integers(WORD_GAP)),
        noise_seed=(*noise_seed, 1),
        path=os.path.join(wav_dir, f"{utt_id}.flac"),
    )


def make_noise(kind: str, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-power Gaussian noise (T,): white, pink (1/f power) or brown (1/f^2 power).

    Shaped noise is flat below ``NOISE_CORNER_HZ`` so its power lies in the speech band rather
    than in inaudible sub-20 Hz rumble.
    """
    if kind == "white":
        noise = rng.standard_normal(num_samples)
    elif kind in ("pink", "brown"):
        # Shape a block of an FFT-friendly length and keep its start: an FFT of a length with a large
        # prime factor is 15x slower, and that was most of the time spent outside the synthesizers.
        from scipy.fft import next_fast_len  # the synth extra, required by make_corpus

        size = next_fast_len(num_samples, real=True)
        spec = np.fft.rfft(rng.standard_normal(size))
        freqs_hz = np.fft.rfftfreq(size, d=1.0 / SAMPLE_RATE)
        exponent = 0.5 if kind == "pink" else 1.0  # amplitude slope for 1/f or 1/f^2 power
        noise = np.fft.irfft(spec / np.maximum(freqs_hz, NOISE_CORNER_HZ) ** exponent, n=size)[:num_samples]
    else:
        raise ValueError(f"unknown noise kind '{kind}' (expected one of {', '.join(NOISE_KINDS)})")
    noise = noise - noise.mean()
    return noise / np.sqrt(np.mean(noise ** 2) + 1e-20)


def trim_silence(audio: np.ndarray, floor_db: float = TRIM_DB) -> np.ndarray:
    """(T,) -> the span from the first to the last 10 ms frame within ``floor_db`` of the loudest frame."""
    frame = SAMPLE_RATE // 100
    n = audio.size // frame
    if n == 0:
        return audio
    rms = np.sqrt(np.mean(audio[:n * frame].reshape(n, frame) ** 2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (floor_db / 20))
    if loud.size == 0:  # all zeros: nothing to measure against
        return audio
    return audio[loud[0] * frame:(loud[-1] + 1) * frame]


def finish(spec: UttSpec, audio: np.ndarray) -> np.ndarray:
    """Trim, level, silence and noise for one synthesized 16 kHz utterance (T,) -> waveform in [-1, 1]."""
    peak = np.max(np.abs(audio))
    if peak <= 0:
        raise RuntimeError(f"utterance {spec.utt_id}: {spec.speaker.synth} produced silence for {spec.text!r}")
    audio = trim_silence(audio)
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


def render(spec: UttSpec, programs: Dict[str, str]) -> np.ndarray:
    """Synthesize one utterance: 16 kHz float64 waveform (T,) in [-1, 1]."""
    return finish(spec, synthesizers.synthesize([spec], programs)[0])


def _render_batch(args: Tuple[List[UttSpec], Dict[str, str]]) -> List[Tuple[str, int]]:
    specs, programs = args
    done = []
    for spec, raw in zip(specs, synthesizers.synthesize(specs, programs)):
        audio = finish(spec, raw)
        tmp = f"{spec.path}.tmp{os.getpid()}.flac"
        soundfile.write(tmp, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        os.replace(tmp, spec.path)  # no half-written FLAC if interrupted
        done.append((spec.utt_id, audio.size))
    return done


def batches(specs: Sequence[UttSpec]) -> List[List[UttSpec]]:
    """Group utterances into work items of one synthesizer each, festival's first (they take longest)."""
    by_synth: Dict[str, List[UttSpec]] = {}
    for spec in specs:
        by_synth.setdefault(spec.speaker.synth, []).append(spec)
    out = []
    for synth in sorted(by_synth, key=lambda s: s != "festival"):
        size = FESTIVAL_BATCH if synth == "festival" else OTHER_BATCH
        group = by_synth[synth]
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return out


def _summary(split: str, specs: Sequence[UttSpec], num_samples: Dict[str, int]) -> str:
    secs: Dict[str, float] = {}
    for s in specs:
        secs[s.speaker.synth] = secs.get(s.speaker.synth, 0.0) + num_samples[s.utt_id] / SAMPLE_RATE
    total = sum(secs.values())
    shares = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in sorted(secs.items()))
    return f"{split}: {len(specs)} utterances, {total / 3600:.2f} h ({shares})"


def make_corpus(out_dir: str, num_train: int, num_dev: int, num_test: int, seed: int = 0,
                snr_db: Optional[float] = 20.0, jobs: int = 1, audio_dir: Optional[str] = None,
                sentences_path: str = DEFAULT_SENTENCES, espeak_binary: str = "espeak-ng",
                progress: bool = True, num_test_unseen: int = 0, synths: Optional[SynthChoice] = None,
                binaries: Optional[Dict[str, str]] = None) -> Dict[str, List[UttSpec]]:
    """Synthesize the data dirs under ``out_dir`` (test_unseen only if ``num_test_unseen`` > 0).

    ``binaries`` maps synthesizer -> program name (``espeak_binary`` is espeak's); returns the plan.
    """
    require("scipy", "synthesizing speech")  # resampling and noise; here, before the worker processes start
    synths = synths or SynthChoice(dict(DEFAULT_TRAIN_SYNTHS))
    counts = {"train": num_train, "dev": num_dev, "test": num_test, "test_unseen": num_test_unseen}
    plan = plan_corpus(load_sentences(sentences_path), counts, seed, snr_db, out_dir, audio_dir, synths)
    if num_test_unseen > 0 and synths.twins():
        print(f"note: test_unseen voices heard in training under another engine: {', '.join(synths.twins())}",
              file=sys.stderr)
    used = sorted({s.speaker.synth for split in SPLITS for s in plan[split]})
    programs = synthesizers.find_programs(used, {"espeak": espeak_binary, **(binaries or {})})
    splits = [split for split in SPLITS if split != "test_unseen" or num_test_unseen > 0]
    work = [(batch, programs) for batch in batches([s for split in splits for s in plan[split]])]
    for batch, _ in work:
        for spec in batch:
            os.makedirs(os.path.dirname(spec.path), exist_ok=True)
    bar = tqdm(total=sum(len(b) for b, _ in work), desc="synthesizing", unit="utt", disable=not progress)
    num_samples: Dict[str, int] = {}
    with multiprocessing.Pool(jobs) if jobs > 1 else _Serial() as pool:
        for done in pool.imap_unordered(_render_batch, work):
            num_samples.update(done)
            bar.update(len(done))
    bar.close()
    for split in splits:
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
        if specs and progress:
            print(_summary(split, specs, num_samples), file=sys.stderr)
    return plan


class _Serial:
    """multiprocessing.Pool's imap_unordered in this process (for --jobs 1)."""

    def __enter__(self) -> "_Serial":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def imap_unordered(func, items):  # type: ignore[no-untyped-def]
        return map(func, items)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="make_synthetic_corpus.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory; gets train/ dev/ test/ [test_unseen/]")
    parser.add_argument("--num-train", type=int, required=True)
    parser.add_argument("--num-dev", type=int, required=True)
    parser.add_argument("--num-test", type=int, required=True)
    parser.add_argument("--num-test-unseen", type=int, default=100,
                        help="utterances of the unseen synthesizer (default 100; 0: no test_unseen/)")
    parser.add_argument("--train-synths", default="espeak:2,festival,flite",
                        help="synthesizers of train/dev/test as NAME[:WEIGHT],... (weights are shares of the "
                             "utterances; default espeak:2,festival,flite = half espeak, a quarter each of the "
                             f"others; names: {', '.join(SYNTHS)})")
    parser.add_argument("--unseen-synth", default=DEFAULT_UNSEEN_SYNTH,
                        help="synthesizer of test_unseen (default flite)")
    parser.add_argument("--unseen-voices",
                        help="comma-separated voices of the unseen synthesizer (default for flite: awb,rms; else all)")
    parser.add_argument("--derived-voices", choices=("false", "true"), default="false",
                        help="true: also train on derived speakers (slt as a man, kal and ked as women: F0 and "
                             "vocal-tract shifts); default false")
    parser.add_argument("--extra-train", default="",
                        help="SPEAKER:N,...: N more train utterances of each named speaker (a training speaker "
                             "id or a derived one, e.g. flite_slt_m), after --num-train's; dev, test, "
                             "test_unseen and train's first --num-train utterances stay as without")
    parser.add_argument("--seed", type=int, default=0)
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("--snr-db", type=float, default=20.0, help="additive noise SNR in dB (default 20)")
    noise.add_argument("--no-noise", action="store_true", help="clean speech, no added noise")
    parser.add_argument("--jobs", type=int, default=1, help="parallel synthesis processes")
    parser.add_argument("--audio-dir", help="put FLACs under AUDIO_DIR/<split>/ instead of OUT/<split>/wav/")
    parser.add_argument("--sentences", default=DEFAULT_SENTENCES, help="normalised sentence list, one per line")
    parser.add_argument("--espeak", default="espeak-ng", help="espeak-ng executable")
    parser.add_argument("--festival", default="festival", help="festival executable")
    parser.add_argument("--flite", default="flite", help="flite executable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    for name in ("num_train", "num_dev", "num_test", "num_test_unseen"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.num_train + args.num_dev + args.num_test + args.num_test_unseen == 0:
        parser.error("nothing to synthesize: all of --num-train/--num-dev/--num-test/--num-test-unseen are 0")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if not args.no_noise and not -20.0 <= args.snr_db <= 100.0:
        parser.error(f"--snr-db {args.snr_db} is outside [-20, 100]")
    try:
        synths = SynthChoice(parse_synth_weights(args.train_synths), args.unseen_synth,
                             tuple(v.strip() for v in args.unseen_voices.split(",")) if args.unseen_voices else None,
                             derived=args.derived_voices == "true",
                             extra_train=parse_extra_train(args.extra_train))
        synths.check()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        make_corpus(args.out, args.num_train, args.num_dev, args.num_test, seed=args.seed,
                    snr_db=None if args.no_noise else args.snr_db, jobs=args.jobs, audio_dir=args.audio_dir,
                    sentences_path=args.sentences, espeak_binary=args.espeak, progress=not args.no_progress,
                    num_test_unseen=args.num_test_unseen, synths=synths,
                    binaries={"festival": args.festival, "flite": args.flite})
    except (ValueError, FileNotFoundError, RuntimeError, MissingExtraError) as exc:
        print(f"make_synthetic_corpus.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
