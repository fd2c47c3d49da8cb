"""Speech synthesizer back-ends for tools/make_synthetic_corpus.py: espeak-ng, festival and flite.

Every back-end turns a batch of requests (text, speaker, speaking-rate factor, pitch factor) into 16 kHz
float64 waveforms. The factors mean the same for every synthesizer: ``rate`` 1.1 speaks 10% faster than
the voice's default, ``pitch`` 1.1 raises its mean F0 by 10%. How each engine is told:

* espeak-ng: ``-s round(175 * rate)`` words per minute, ``-p round(50 + 150 * (pitch - 1))`` (its 0-99
  pitch scale, 50 = default; the map is approximate, as the scale is not in Hz); two more per-utterance
  settings only espeak-ng takes: the intonation range (SSML ``<prosody range="P%">``, 100% = the voice's own;
  the engine caps it at 200%) and ``-g`` extra pauses between words (units of 10 ms at the default speed).
* festival diphone voices (kal, ked): the voice's ``Duration_Stretch`` / rate and its ``target_f0_mean``
  in ``int_lr_params`` times ``pitch``. One festival process renders a whole batch from one Scheme script.
* festival's HTS voice (slt) ignores both (measured): its own duration and F0 models run, so the rate goes
  to hts_engine's ``-r`` and the pitch is applied by resampling (below).
* flite: ``--setf duration_stretch=1/rate`` and ``--setf int_f0_target_mean=<voice mean> * pitch``; rms
  ignores the F0 target (measured), so its pitch is applied by resampling.
* "Pitch by resampling": the engine renders at rate ``rate / pitch`` and the waveform is read as if
  sampled at ``pitch`` times its true rate, which raises F0 (and the formants, like a shorter vocal tract)
  by ``pitch`` and brings the duration back to ``1 / rate`` of the default.
* Derived speakers (``derived_voices``; make_synthetic_corpus ``--derived-voices true``): a voice moved to the
  other sex by a speaker transform: its F0 setting times ``Speaker.f0`` and a vocal-tract shift by resampling
  as above (formants and F0 times ``Speaker.shift``; the engine renders at ``rate / shift``, so the duration
  stays ``1 / rate`` of the default). flite's and festival's slt (female) become male speakers, festival's
  kal and ked (male) female ones; each is a speaker id of its own.

Text goes to every engine in lower case: festival and flite spell out upper-case words ("IT" as "I T").
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import soundfile

SAMPLE_RATE = 16000
SYNTHS = ("espeak", "festival", "flite")
PROGRAMS: Dict[str, str] = {"espeak": "espeak-ng", "festival": "festival", "flite": "flite"}
PACKAGES: Dict[str, str] = {"espeak": "espeak-ng", "festival": "festival festvox-kallpc16k festvox-kdlpc16k "
                            "festvox-us-slt-hts", "flite": "flite"}

# The voices are every English voice these Debian packages offer (Debian 12: espeak-ng 1.51, festival 2.5,
# flite 2.2), less the held-out ones. Not available: espeak-ng's mbrola voices (en1, us1-3) need mbrola, which
# Debian does not ship; festival's other English voices (kal and ked at 8 kHz) are packages that conflict
# with the 16 kHz ones and are the same speakers; flite's awb_time only reads times of day.
# espeak-ng voice -> short speaker-id code (letters only, so "-" sorts before every code character
# and utterance ids sort speaker by speaker).
ESPEAK_TRAIN_VOICES: Dict[str, str] = {
    "en-us": "enus",
    "en-gb": "engb",
    "en-gb-x-rp": "enrp",
    "en-gb-scotland": "ensc",
    "en-029": "encb",
}
ESPEAK_HELDOUT_VOICES: Dict[str, str] = {
    "en-us-nyc": "enny",
    "en-gb-x-gbclan": "enla",
    "en-gb-x-gbcwmd": "enwm",
}
# Every variant of espeak-ng 1.51 (espeak-ng --voices=variant: formant sets, Klatt synthesis, whisper, croak,
# robotic and named voices) but the held-out ones; the first eleven were the only ones trained on until issue 34.
ESPEAK_TRAIN_VARIANTS: Tuple[str, ...] = (
    "m1", "m2", "m3", "m4", "m6", "f1", "f2", "f3", "f4", "klatt", "klatt3",
    "adam", "Alex", "Alicia", "Andrea", "Andy", "anika", "anikaRobot", "Annie", "announcer", "antonio", "AnxiousAndy",
    "aunty", "belinda", "benjamin", "boris", "caleb", "croak", "david", "Demonic", "Denis", "Diogo", "ed", "edward",
    "edward2", "fast", "Gene", "Gene2", "grandma", "grandpa", "gustave", "Henrique", "Hugo", "iven", "iven2", "iven3",
    "iven4", "Jacky", "john", "kaukovalta", "klatt4", "klatt5", "klatt6", "Lee", "linda", "m5", "m8", "marcelo",
    "Marco", "Mario", "max", "Michael", "michel", "miguel", "Mike", "Mr serious", "Nguyen", "norbert", "pablo", "paul",
    "pedro", "quincy", "RicishayMax", "RicishayMax2", "RicishayMax3", "rob", "robert", "robosoft", "robosoft2",
    "robosoft3", "robosoft4", "robosoft5", "robosoft6", "robosoft7", "robosoft8", "sandro", "shelby", "steph",
    "steph2", "steph3", "Storm", "travis", "Tweaky", "UniRobot", "victor", "whisper", "whisperf", "zac")
ESPEAK_HELDOUT_VARIANTS: Tuple[str, ...] = ("m7", "f5", "klatt2")
ESPEAK_DEFAULT_WPM = 175

# festival / flite voice -> speaker-id code. flite's slt, kal16 and kal (kal at 8 kHz) are the same recordings
# as festival's slt and kal (other engines), so they are not new speakers for festival-trained models.
FESTIVAL_VOICES: Dict[str, str] = {"kal_diphone": "fest_kal", "ked_diphone": "fest_ked",
                                   "cmu_us_slt_arctic_hts": "fest_slt"}
FLITE_VOICES: Dict[str, str] = {"awb": "flite_awb", "rms": "flite_rms", "slt": "flite_slt", "kal16": "flite_kal",
                                "kal": "flite_kal8"}
SAME_SPEAKER: Dict[Tuple[str, str], Tuple[str, str]] = {
    ("flite", "slt"): ("festival", "cmu_us_slt_arctic_hts"), ("flite", "kal16"): ("festival", "kal_diphone"),
    ("flite", "kal"): ("festival", "kal_diphone")}
# flite's default int_f0_target_mean per voice (found by matching outputs byte for byte).
FLITE_F0_MEAN: Dict[str, int] = {"awb": 132, "slt": 172, "kal16": 95, "kal": 95}
# Voices whose engine ignores the F0 setting: their pitch is applied by resampling.
PITCH_BY_RESAMPLING = {("festival", "cmu_us_slt_arctic_hts"), ("flite", "rms")}
# Derived speakers: synthesizer -> (base voice, speaker id, F0 factor, vocal-tract shift). The male slt: F0
# 172 Hz x 0.8 x 0.85 = 117 Hz (flite's awb 116 Hz, rms 100 Hz, measured by median) and formants x 0.85, about
# the male/female ratio of vocal-tract lengths; festival's slt (HTS) takes no F0 setting (nor hts_engine's -fm,
# measured), so the shift alone moves it (median 159 -> 142 Hz, measured). kal and ked (~105 Hz) become ~190 Hz
# with formants x 1.17: diphone pitch marks stay clean at a 1.6x F0 change.
DERIVED_VOICES: Dict[str, Tuple[Tuple[str, str, float, float], ...]] = {
    "flite": (("slt", "flite_slt_m", 0.8, 0.85),),
    "festival": (("cmu_us_slt_arctic_hts", "fest_slt_m", 1.0, 0.85), ("kal_diphone", "fest_kal_f", 1.6, 1.17),
                 ("ked_diphone", "fest_ked_f", 1.6, 1.17)),
}


@dataclass(frozen=True)
class Speaker:
    """A synthesizer voice (+ espeak variant); ``spk_id`` is the Kaldi speaker id."""

    synth: str
    voice: str
    variant: str
    spk_id: str
    f0: float = 1.0      # derived speakers: factor on the engine's F0 setting, on top of each utterance's pitch
    shift: float = 1.0   # derived speakers: vocal-tract factor, by resampling: formants and F0 scale by it

    @property
    def engine_voice(self) -> str:
        """The voice name the engine takes (espeak: ``voice+variant``)."""
        return f"{self.voice}+{self.variant}" if self.variant else self.voice


class SynthRequest(Protocol):
    """What a back-end needs of an utterance (make_synthetic_corpus.UttSpec has these fields)."""

    utt_id: str
    text: str
    speaker: Speaker
    rate: float
    pitch: float
    pitch_range: float   # espeak-ng only: intonation range factor, 1 = the voice's own
    word_gap: int        # espeak-ng only: extra pause between words, in 10 ms units


def voices(synth: str) -> List[Speaker]:
    """Every speaker of a synthesizer (espeak: training voices x training variants only)."""
    if synth == "espeak":
        return espeak_speakers(ESPEAK_TRAIN_VOICES, ESPEAK_TRAIN_VARIANTS)
    table = {"festival": FESTIVAL_VOICES, "flite": FLITE_VOICES}.get(synth)
    if table is None:
        raise ValueError(f"unknown synthesizer '{synth}' (expected one of {', '.join(SYNTHS)})")
    return [Speaker(synth, voice, "", code) for voice, code in table.items()]


def derived_voices(synth: str) -> List[Speaker]:
    """The derived speakers of a synthesizer (``DERIVED_VOICES``; none for espeak)."""
    return [Speaker(synth, voice, "", code, f0, shift) for voice, code, f0, shift in DERIVED_VOICES.get(synth, ())]


def espeak_speakers(voice_codes: Dict[str, str], variants: Sequence[str]) -> List[Speaker]:
    # a speaker id holds letters and digits only ("Mr serious" -> "Mrserious")
    return [Speaker("espeak", v, var, f"{code}_{re.sub('[^A-Za-z0-9]', '', var)}")
            for v, code in voice_codes.items() for var in variants]


def espeak_heldout_speakers() -> List[Speaker]:
    """espeak speakers with a voice or a variant that ``voices("espeak")`` never has."""
    return (espeak_speakers(ESPEAK_HELDOUT_VOICES, ESPEAK_TRAIN_VARIANTS + ESPEAK_HELDOUT_VARIANTS)
            + espeak_speakers(ESPEAK_TRAIN_VOICES, ESPEAK_HELDOUT_VARIANTS))


def find_programs(synths: Sequence[str], binaries: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Absolute paths of the programs for ``synths``; a missing one is an error naming it and its packages."""
    found = {}
    for synth in synths:
        name = (binaries or {}).get(synth, PROGRAMS[synth])
        path = shutil.which(name)
        if path is None:
            raise FileNotFoundError(f"{PROGRAMS[synth]} not found ('{name}'), needed for the {synth} synthesizer; "
                                    f"install it (apt-get install {PACKAGES[synth]}, or tools/install/install_system_deps.sh) "
                                    f"or leave {synth} out of --train-synths/--unseen-synth")
        found[synth] = path
    return found


def to_16k(audio: np.ndarray, sr: float, utt_id: str) -> np.ndarray:
    """Resample (T,) audio from ``sr`` Hz (any rate with at most 3 decimals) to 16 kHz."""
    num, den = SAMPLE_RATE * 1000, int(round(sr * 1000))
    if den == num:
        return audio
    if den <= 0:
        raise RuntimeError(f"utterance {utt_id}: bad sample rate {sr}")
    from scipy.signal import resample_poly  # the synth extra (make_synthetic_corpus.make_corpus requires it)

    g = np.gcd(num, den)
    return resample_poly(audio, num // g, den // g)


def _check_audio(audio: np.ndarray, utt_id: str, what: str) -> np.ndarray:
    if audio.ndim != 1 or audio.size == 0 or not np.any(audio):
        raise RuntimeError(f"utterance {utt_id}: {what} returned no (or silent) mono audio")
    return audio


def espeak(text: str, voice: str, rate: int, pitch: int, utt_id: str, binary: str = "espeak-ng",
           range_percent: int = 100, word_gap: int = 0) -> Tuple[np.ndarray, int]:
    """Run espeak-ng (``rate`` in words per minute, ``pitch`` 0-99, the intonation range in percent of the
    voice's, ``word_gap`` in 10 ms units); return (waveform float64 (T,), sample rate)."""
    # Lower case: espeak reads all-caps words as abbreviations ("IT" -> "I T", "AM" -> "a.m.").
    # A range goes as SSML (-m), its only way in (the text is letters, apostrophes and spaces: valid XML); at
    # 100% the text goes plain, as before ranges were drawn (SSML mode alone changes the audio slightly).
    said = text.lower() if range_percent == 100 else \
        f'<speak><prosody range="{range_percent}%">{text.lower()}</prosody></speak>'
    cmd = [binary, *(["-m"] if range_percent != 100 else []), "-v", voice, "-s", str(rate), "-p", str(pitch),
           "-g", str(word_gap), "--stdout", "--", said]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0 or not proc.stdout:
        raise RuntimeError(f"utterance {utt_id}: espeak-ng failed (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()} [{' '.join(cmd)}]")
    audio, sr = soundfile.read(io.BytesIO(proc.stdout), dtype="float64")
    return _check_audio(audio, utt_id, f"espeak-ng [{' '.join(cmd)}]"), sr


def espeak_settings(rate: float, pitch: float) -> Tuple[int, int]:
    """(words per minute, 0-99 pitch) for espeak-ng from the rate and pitch factors."""
    return round(ESPEAK_DEFAULT_WPM * rate), int(np.clip(round(50 + 150 * (pitch - 1.0)), 0, 99))


def _engine_rate_and_shift(req: SynthRequest) -> Tuple[float, float]:
    """(rate the engine renders at, factor the sample rate is then reinterpreted by)."""
    shift = req.speaker.shift * (req.pitch if _pitch_by_resampling(req) else 1.0)
    return req.rate / shift, shift


def _pitch_by_resampling(req: SynthRequest) -> bool:
    return (req.speaker.synth, req.speaker.voice) in PITCH_BY_RESAMPLING


def flite(req: SynthRequest, binary: str = "flite") -> np.ndarray:
    """Render one utterance with flite: 16 kHz float64 (T,)."""
    rate, shift = _engine_rate_and_shift(req)
    cmd = [binary, "-voice", req.speaker.voice, "--setf", f"duration_stretch={1.0 / rate:.4f}"]
    if req.speaker.voice in FLITE_F0_MEAN and not _pitch_by_resampling(req):
        f0 = FLITE_F0_MEAN[req.speaker.voice] * req.pitch * req.speaker.f0
        cmd += ["--setf", f"int_f0_target_mean={f0:.2f}"]
    with tempfile.TemporaryDirectory(prefix="flite") as tmp:
        path = os.path.join(tmp, "out.wav")
        cmd += ["-t", req.text.lower(), "-o", path]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0 or not os.path.isfile(path):
            raise RuntimeError(f"utterance {req.utt_id}: flite failed (exit {proc.returncode}): "
                               f"{proc.stderr.decode(errors='replace').strip()} [{' '.join(cmd)}]")
        audio, sr = soundfile.read(path, dtype="float64")
    return to_16k(_check_audio(audio, req.utt_id, f"flite [{' '.join(cmd)}]"), sr * shift, req.utt_id)


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Scale the current voice's target F0 mean (int_lr_params is rebuilt by each voice selection, so the
# scaling never compounds from one utterance to the next).
_FESTIVAL_PRELUDE = """(define (asrkit_scale_f0 factor)
  (set! int_lr_params
        (mapcar (lambda (p) (if (eq? (car p) 'target_f0_mean) (list 'target_f0_mean (* factor (car (cdr p)))) p))
                int_lr_params)))
"""


def festival_script(reqs: Sequence[SynthRequest], paths: Sequence[str]) -> str:
    """The Scheme script that renders ``reqs[i]`` into the RIFF file ``paths[i]``."""
    lines = [_FESTIVAL_PRELUDE]
    for req, path in zip(reqs, paths):
        if req.speaker.voice not in FESTIVAL_VOICES:
            raise ValueError(f"utterance {req.utt_id}: unknown festival voice '{req.speaker.voice}'")
        rate, shift = _engine_rate_and_shift(req)
        lines.append(f"(voice_{req.speaker.voice})")  # selecting it resets every voice parameter
        if req.speaker.voice == "cmu_us_slt_arctic_hts":
            lines.append(f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {rate:.4f}))))')
        else:
            # relative to the voice's own stretch (kal_diphone sets 1.1)
            lines.append(f"(Parameter.set 'Duration_Stretch (/ (Parameter.get 'Duration_Stretch) {rate:.4f}))")
            lines.append(f"(asrkit_scale_f0 {req.pitch * req.speaker.f0:.4f})")
        lines.append(f"(utt.save.wave (SynthText {_scheme_string(req.text.lower())}) {_scheme_string(path)} 'riff)")
    return "\n".join(lines) + "\n"


def festival(reqs: Sequence[SynthRequest], binary: str = "festival") -> List[np.ndarray]:
    """Render a batch with one festival process: 16 kHz float64 (T,) per request."""
    if not reqs:
        return []
    with tempfile.TemporaryDirectory(prefix="festival") as tmp:
        paths = [os.path.join(tmp, f"{i}.wav") for i in range(len(reqs))]
        script = os.path.join(tmp, "batch.scm")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(festival_script(reqs, paths))
        proc = subprocess.run([binary, "--batch", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)
        out = []
        for req, path in zip(reqs, paths):
            if proc.returncode != 0 or not os.path.isfile(path):
                ids = ", ".join(r.utt_id for r in reqs)
                raise RuntimeError(f"utterance {req.utt_id}: festival wrote no audio (exit {proc.returncode}; "
                                   f"batch {ids}): {proc.stderr.decode(errors='replace').strip()[-2000:]}")
            audio, sr = soundfile.read(path, dtype="float64")
            audio = _check_audio(audio, req.utt_id, f"festival voice {req.speaker.voice}")
            out.append(to_16k(audio, sr * _engine_rate_and_shift(req)[1], req.utt_id))
    return out


def synthesize(reqs: Sequence[SynthRequest], programs: Dict[str, str]) -> List[np.ndarray]:
    """Render requests of one synthesizer (festival: in one process): 16 kHz float64 (T,) each."""
    synths = {r.speaker.synth for r in reqs}
    if len(synths) > 1:
        raise ValueError(f"one synthesizer per batch, got {sorted(synths)}")
    if not reqs:
        return []
    synth = synths.pop()
    if synth == "festival":
        return festival(reqs, programs["festival"])
    if synth == "flite":
        return [flite(r, programs["flite"]) for r in reqs]
    if synth == "espeak":
        out = []
        for r in reqs:
            wpm, pitch = espeak_settings(r.rate, r.pitch)
            audio, sr = espeak(r.text, r.speaker.engine_voice, wpm, pitch, r.utt_id, programs["espeak"],
                               round(100 * r.pitch_range), r.word_gap)
            out.append(to_16k(audio, sr, r.utt_id))
        return out
    raise ValueError(f"unknown synthesizer '{synth}' (expected one of {', '.join(SYNTHS)})")
