"""tools/make_synthetic_corpus.py and tools/synthesizers.py: espeak-ng, festival and flite speech in Kaldi data dirs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as AF

from asrkit.data.table import read_table
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "make_synthetic_corpus.py"
SENTENCES = REPO / "tools" / "corpus" / "sentences.txt"
TABLES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur")
SPLITS = ("train", "dev", "test", "test_unseen")
SIZES = {"train": 6, "dev": 2, "test": 3, "test_unseen": 2}
COUNTS = ["--num-train", "6", "--num-dev", "2", "--num-test", "3", "--num-test-unseen", "2"]
HAVE_ALL = all(shutil.which(p) for p in ("festival", "flite"))

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
needs_all = pytest.mark.skipif(not HAVE_ALL, reason="festival or flite is not installed (tools/install/install_system_deps.sh)")


def _load_tool():
    return load_tool("make_synthetic_corpus")


@pytest.fixture(scope="module")
def tool():
    return _load_tool()


@pytest.fixture(scope="module")
def corpora(tool, tmp_path_factory):
    """The same seed rendered three ways: noisy in-process, noisy via the CLI with 2 jobs, clean.

    Default synthesizers: espeak + festival + flite (slt, kal16, kal) for train/dev/test, flite awb/rms for
    test_unseen.
    """
    if not HAVE_ALL:
        pytest.skip("festival or flite is not installed (tools/install/install_system_deps.sh)")
    root = tmp_path_factory.mktemp("synth")
    assert tool.main(["--out", str(root / "noisy"), *COUNTS, "--seed", "3", "--snr-db", "20",
                      "--no-progress"]) == 0
    proc = subprocess.run([sys.executable, str(TOOL), "--out", str(root / "noisy2"), *COUNTS, "--seed", "3",
                           "--snr-db", "20", "--jobs", "2", "--no-progress"],
                          capture_output=True, text=True, cwd=str(root))
    assert proc.returncode == 0, proc.stderr
    assert tool.main(["--out", str(root / "clean"), *COUNTS, "--seed", "3", "--no-noise", "--no-progress"]) == 0
    return root


def _read_audio(path: str) -> np.ndarray:
    audio, sr = soundfile.read(path, dtype="float64")
    assert sr == 16000
    return audio


def test_tables_exist_sorted_and_consistent(corpora):
    for split, n in SIZES.items():
        data = corpora / "noisy" / split
        for name in TABLES:
            keys = [line.split(" ", 1)[0] for line in (data / name).read_text().splitlines()]
            assert keys == sorted(keys), f"{split}/{name} not sorted"
        utt2spk = read_table(data / "utt2spk")
        assert len(utt2spk) == n
        for name in ("wav.scp", "text", "utt2dur"):
            assert list(read_table(data / name)) == list(utt2spk), f"{split}/{name} keys differ from utt2spk"
        # Kaldi: utt ids start with the speaker id, and spk2utt is the inverse of utt2spk.
        for utt, spk in utt2spk.items():
            assert utt.startswith(spk + "-")
        spk2utt = {spk: utts.split() for spk, utts in read_table(data / "spk2utt").items()}
        assert list(spk2utt) == sorted(spk2utt)
        assert [u for utts in spk2utt.values() for u in utts] == list(utt2spk)  # same order both ways
        assert all(utt2spk[u] == spk for spk, utts in spk2utt.items() for u in utts)
        for utt, path in read_table(data / "wav.scp").items():
            assert Path(path).is_absolute() and Path(path).parent == data / "wav"
            assert Path(path).name == f"{utt}.flac" and Path(path).is_file()


def test_sentences_are_corpus_lines_and_splits_disjoint(corpora):
    corpus = set(SENTENCES.read_text().splitlines())
    texts = {split: list(read_table(corpora / "noisy" / split / "text").values()) for split in SPLITS}
    for split, sents in texts.items():
        assert set(sents) <= corpus, f"{split} has text not in {SENTENCES}"
        assert len(set(sents)) == len(sents)
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not set(texts[a]) & set(texts[b]), f"{a} and {b} share sentences"


def _synth_of(spk: str) -> str:
    return "festival" if spk.startswith("fest_") else "flite" if spk.startswith("flite_") else "espeak"


def test_speakers_and_synthesizers_per_split(corpora):
    spks = {split: set(read_table(corpora / "noisy" / split / "spk2utt")) for split in SPLITS}
    for split in ("train", "dev", "test"):
        assert {_synth_of(s) for s in spks[split]} <= {"espeak", "festival", "flite"}
        assert not spks[split] & {"flite_awb", "flite_rms"}
    assert spks["test_unseen"] and spks["test_unseen"] <= {"flite_awb", "flite_rms"}
    assert not spks["test_unseen"] & (spks["train"] | spks["dev"] | spks["test"])
    # train shares espeak:2, festival:1, flite:1: 3 + 2 + 1 of 6 (each utterance to the one furthest behind)
    synths = [_synth_of(s) for s in read_table(corpora / "noisy" / "train" / "utt2spk").values()]
    assert (synths.count("espeak"), synths.count("festival"), synths.count("flite")) == (3, 2, 1)


def test_plan_shares_heldout_rule_and_unseen_split(tool):
    """Plan a big corpus (nothing rendered) and check the guarantees at any size."""
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 3000, "dev": 50, "test": 40, "test_unseen": 30}
    # a synthesizer may train and be tested unseen: its held-out voices leave its training pool
    choice = tool.SynthChoice({"espeak": 3.0, "festival": 1.0}, "festival", ("kal_diphone",))
    plan = tool.plan_corpus(sentences, counts, seed=5, snr_db=None, out_dir="unused", synths=choice)
    assert {s.speaker.voice for split in ("train", "dev", "test") for s in plan[split]
            if s.speaker.synth == "festival"} == {"ked_diphone", "cmu_us_slt_arctic_hts"}
    assert {s.speaker.voice for s in plan["test_unseen"]} == {"kal_diphone"}
    with pytest.raises(ValueError, match="every festival voice is held out for test_unseen"):
        tool.plan_corpus(sentences, counts, seed=5, snr_db=None, out_dir="unused",
                         synths=tool.SynthChoice({"espeak": 1.0, "festival": 1.0}, "festival"))
    choice = tool.SynthChoice({"espeak": 3.0, "festival": 1.0})
    plan = tool.plan_corpus(sentences, counts, seed=5, snr_db=None, out_dir="unused", synths=choice)
    for split in ("train", "dev", "test"):
        n = counts[split]
        got = sum(s.speaker.synth == "espeak" for s in plan[split])
        assert abs(got - 0.75 * n) <= 1, f"{split}: {got} espeak of {n}"  # the share is exact, not drawn
        assert {s.speaker.synth for s in plan[split]} == {"espeak", "festival"}
    assert {s.speaker.spk_id for s in plan["train"] if s.speaker.synth == "festival"} == {"fest_kal", "fest_ked",
                                                                                          "fest_slt"}
    # half of the espeak test utterances (the even ones) have a voice or variant never in train
    train_voices = {s.speaker.voice for s in plan["train"] + plan["dev"]}
    train_variants = {s.speaker.variant for s in plan["train"] + plan["dev"] if s.speaker.synth == "espeak"}
    espeak_test = [s for s in plan["test"] if s.speaker.synth == "espeak"]
    unseen = [s for s in espeak_test if s.speaker.voice not in train_voices or s.speaker.variant not in train_variants]
    assert len(unseen) == (len(espeak_test) + 1) // 2
    # test_unseen: flite awb/rms only, speakers never in train, sentences in no other split
    assert {s.speaker.spk_id for s in plan["test_unseen"]} == {"flite_awb", "flite_rms"}
    other = {s.text for split in ("train", "dev", "test") for s in plan[split]}
    assert not {s.text for s in plan["test_unseen"]} & other
    assert len({s.text for s in plan["test_unseen"]}) == 30
    assert len({s.speaker.spk_id for s in plan["train"]}) > 20  # many train speakers
    # rate and pitch vary per utterance
    assert len({s.rate for s in plan["train"]}) > 30 and len({s.pitch for s in plan["train"]}) > 30
    # dev/test/test_unseen sentences do not depend on the number of train utterances
    plan2 = tool.plan_corpus(sentences, {**counts, "train": 10}, seed=5, snr_db=None, out_dir="x", synths=choice)
    for split in ("dev", "test", "test_unseen"):
        assert [s.text for s in plan[split]] == [s.text for s in plan2[split]]


def test_synth_sequence_matches_weights(tool):
    seq = tool.synth_sequence({"a": 2.0, "b": 1.0, "c": 1.0}, 400)
    assert (seq.count("a"), seq.count("b"), seq.count("c")) == (200, 100, 100)
    for n in range(1, 40):  # every prefix is within one utterance of its share
        prefix = seq[:n]
        assert abs(prefix.count("a") - n / 2) <= 1 and abs(prefix.count("b") - n / 4) <= 1
    assert tool.parse_synth_weights("espeak:2,festival") == {"espeak": 2.0, "festival": 1.0}
    for bad, msg in (("espeak,mbrola", "unknown synthesizer 'mbrola'"), ("espeak:0", "must be > 0"),
                     ("espeak:x", "bad weight 'x'"), ("espeak,espeak", "given twice")):
        with pytest.raises(ValueError, match=msg):
            tool.parse_synth_weights(bad)


def test_audio_is_16k_flac_matching_utt2dur(corpora):
    sox = shutil.which("soxi")
    for split in SPLITS:
        data = corpora / "noisy" / split
        durs = read_table(data / "utt2dur")
        for utt, path in read_table(data / "wav.scp").items():
            info = soundfile.info(path)
            assert (info.format, info.subtype, info.samplerate, info.channels) == ("FLAC", "PCM_16", 16000, 1)
            assert abs(info.frames / 16000 - float(durs[utt])) < 1e-3
            assert 0.5 < float(durs[utt]) < 20
            if sox:  # independent decoder
                out = subprocess.run([sox, "-D", path], capture_output=True, text=True, check=True).stdout
                assert abs(float(out) - float(durs[utt])) < 1e-3
            audio = _read_audio(path)
            assert 0.01 < np.sqrt(np.mean(audio ** 2)) and np.max(np.abs(audio)) < 1.0


def test_noise_snr_matches_request(corpora):
    for split in SPLITS:
        clean_scp = read_table(corpora / "clean" / split / "wav.scp")
        noisy_scp = read_table(corpora / "noisy" / split / "wav.scp")
        assert list(clean_scp) == list(noisy_scp)
        for utt in noisy_scp:
            clean, noisy = _read_audio(clean_scp[utt]), _read_audio(noisy_scp[utt])
            assert clean.shape == noisy.shape
            snr = 10 * np.log10(np.sum(clean ** 2) / np.sum((noisy - clean) ** 2))
            assert abs(snr - 20.0) < 1.0, f"{utt}: measured SNR {snr:.2f} dB"
            # The clean run really is clean: its leading silence is digital zero.
            assert np.max(np.abs(clean[:400])) == 0.0


def test_margins_are_the_drawn_silence_alone(tool, corpora):
    """The synthesizers' own leading / trailing silence is cut (espeak-ng appends zeros, flite and festival
    quiet frames): a clean utterance is quiet (below ``TRIM_DB`` of its loudest 10 ms frame) for its drawn
    margins, give or take one frame, not for the engine's silence on top of them."""
    plan = tool.plan_corpus(tool.load_sentences(str(SENTENCES)), SIZES, 3, None, str(corpora / "clean"))
    for specs in plan.values():
        for spec in specs:
            audio = _read_audio(spec.path)
            n = audio.size // 160
            rms = np.sqrt(np.mean(audio[:n * 160].reshape(n, 160) ** 2, axis=1))
            loud = np.flatnonzero(np.abs(audio) > rms.max() * 10 ** (tool.TRIM_DB / 20))
            lead, tail = loud[0] / 16000, (audio.size - 1 - loud[-1]) / 16000
            assert spec.lead_s - 1e-3 < lead < spec.lead_s + 0.011, (spec.utt_id, lead, spec.lead_s)
            assert spec.tail_s - 1e-3 < tail < spec.tail_s + 0.011, (spec.utt_id, tail, spec.tail_s)


def test_trim_silence_keeps_the_loud_span(tool):
    sr = 16000
    t = np.arange(sr // 2) / sr
    tone = np.sin(2 * np.pi * 440 * t)
    quiet = 10 ** (-60 / 20) * np.sin(2 * np.pi * 300 * np.arange(sr // 5) / sr)  # 60 dB down: cut
    soft = 10 ** (-35 / 20) * tone[:1600]  # a soft fricative-like tail, 35 dB down: kept
    audio = np.concatenate([np.zeros(4000), quiet, tone, soft, quiet, np.zeros(3000)])
    start = 4000 + quiet.size
    trimmed = tool.trim_silence(audio)
    np.testing.assert_array_equal(trimmed, audio[start:start + tone.size + soft.size])
    assert tool.trim_silence(np.zeros(100)).size == 100  # shorter than a frame: unchanged
    assert tool.trim_silence(np.zeros(1000)).size == 1000


def test_same_seed_is_deterministic_across_runs_and_jobs(corpora):
    for split in SPLITS:
        a, b = corpora / "noisy" / split, corpora / "noisy2" / split
        for name in ("text", "utt2spk", "spk2utt", "utt2dur"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), f"{split}/{name} differs"
        scp_a, scp_b = read_table(a / "wav.scp"), read_table(b / "wav.scp")
        assert list(scp_a) == list(scp_b)
        for utt in scp_a:
            assert np.array_equal(_read_audio(scp_a[utt]), _read_audio(scp_b[utt]))


def test_different_seed_changes_the_corpus(tool):
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 20, "dev": 5, "test": 5}
    p1 = tool.plan_corpus(sentences, counts, seed=1, snr_db=20.0, out_dir="x")
    p2 = tool.plan_corpus(sentences, counts, seed=2, snr_db=20.0, out_dir="x")
    assert [s.text for s in p1["train"]] != [s.text for s in p2["train"]]
    # dev/test sentences do not depend on how many train utterances are asked for
    p3 = tool.plan_corpus(sentences, {**counts, "train": 500}, seed=1, snr_db=20.0, out_dir="x")
    assert [s.text for s in p1["test"]] == [s.text for s in p3["test"]]
    assert p1["test_unseen"] == []


def test_espeak_alone_needs_no_other_synthesizer(tool, tmp_path, capsys):
    """--train-synths espeak --num-test-unseen 0 never looks for festival or flite."""
    out = tmp_path / "o"
    assert tool.main(["--out", str(out), "--num-train", "2", "--num-dev", "1", "--num-test", "1",
                      "--num-test-unseen", "0", "--train-synths", "espeak", "--festival", "no-such-festival",
                      "--flite", "no-such-flite", "--no-noise", "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dev", "test", "train"]
    assert all(_synth_of(s) == "espeak" for s in read_table(out / "train" / "spk2utt"))
    # a requested synthesizer that is missing is named
    assert tool.main(["--out", str(out), "--num-train", "2", "--num-dev", "1", "--num-test", "1",
                      "--festival", "no-such-festival", "--no-progress"]) == 1
    assert "festival not found ('no-such-festival')" in capsys.readouterr().err
    assert tool.main(["--out", str(out), "--num-train", "2", "--num-dev", "1", "--num-test", "1",
                      "--train-synths", "espeak", "--flite", "no-such-flite", "--no-progress"]) == 1
    assert "flite not found ('no-such-flite')" in capsys.readouterr().err


# --- the back-ends: each voice reads the words, at the rate and pitch asked --------------------------------------

@dataclass(frozen=True)
class _Req:
    utt_id: str
    text: str
    speaker: Any
    rate: float
    pitch: float
    pitch_range: float = 1.0
    word_gap: int = 0


SHORT = "THE OLD MAN WALKED HOME"
LONG = "THE OLD MAN WALKED HOME SLOWLY AFTER THE MARKET AND HIS DAUGHTER COOKED DINNER FOR THEM"


def _speech_seconds(audio: np.ndarray) -> float:
    """From the first to the last sample above 2% of the peak (engines pad with silence differently)."""
    idx = np.nonzero(np.abs(audio) > 0.02 * np.max(np.abs(audio)))[0]
    return (idx[-1] - idx[0]) / 16000


def _median_f0(audio: np.ndarray) -> float:
    f0 = AF.detect_pitch_frequency(torch.tensor(audio, dtype=torch.float32), 16000, freq_low=60, freq_high=400)
    return float(f0.median())


@pytest.fixture(scope="module")
def voice_renders(tool):
    """For one espeak voice and every festival/flite voice: short/long text, slow/fast, low/high pitch."""
    syn = tool.synthesizers
    speakers = [syn.voices("espeak")[0]]
    if HAVE_ALL:
        speakers += syn.voices("festival") + syn.voices("flite")
    programs = syn.find_programs(sorted({s.synth for s in speakers}))

    def render(spk: Any) -> Dict[str, np.ndarray]:
        reqs = [_Req("short", SHORT, spk, 1.0, 1.0), _Req("long", LONG, spk, 1.0, 1.0),
                _Req("slow", LONG, spk, 0.8, 1.0), _Req("fast", LONG, spk, 1.25, 1.0),
                _Req("low", LONG, spk, 1.0, 0.85), _Req("high", LONG, spk, 1.0, 1.18)]
        return dict(zip((r.utt_id for r in reqs), syn.synthesize(reqs, programs)))

    with ThreadPoolExecutor(4) as pool:  # the engines run as subprocesses
        return dict(zip((s.spk_id for s in speakers), pool.map(render, speakers)))


def test_every_voice_reads_the_words_at_the_rate_and_pitch_asked(voice_renders):
    if not HAVE_ALL:
        pytest.skip("festival or flite is not installed")
    assert len(voice_renders) == 1 + 3 + 5
    ref = voice_renders["enus_m1"]
    ref_ratio = _speech_seconds(ref["long"]) / _speech_seconds(ref["short"])  # espeak as the word-reading reference
    for spk, r in voice_renders.items():
        for name, audio in r.items():
            assert audio.ndim == 1 and np.sqrt(np.mean(audio ** 2)) > 0.01 * np.max(np.abs(audio)) > 0, (spk, name)
        short, long = _speech_seconds(r["short"]), _speech_seconds(r["long"])
        # 5 and 16 words: spoken words take 0.2-0.6 s each (spelt-out letters or a skipped text would not),
        # and the long sentence is about as many times longer as espeak's reading of it
        assert 0.2 < long / 16 < 0.6 and 0.15 < short / 5 < 0.6, (spk, short, long)
        assert 0.65 * ref_ratio < long / short < 1.5 * ref_ratio, (spk, long / short, ref_ratio)
        # rate 0.8 / 1.25 stretch / shrink the speech by 1.25 / 0.8 (within 5%)
        assert abs(_speech_seconds(r["slow"]) / long - 1.25) < 0.06, spk
        assert abs(_speech_seconds(r["fast"]) / long - 0.8) < 0.05, spk
        # pitch 1.18 vs 0.85 (ratio 1.39) raises the median F0 (torchaudio's detector) by 1.15-1.65x,
        # and leaves the duration alone
        f0_ratio = _median_f0(r["high"]) / _median_f0(r["low"])
        assert 1.15 < f0_ratio < 1.65, (spk, f0_ratio)
        for name in ("low", "high"):
            assert abs(_speech_seconds(r[name]) / long - 1.0) < 0.05, (spk, name)


def test_text_goes_in_lower_case(tool):
    """festival and flite read an upper-case word as letters ("A" as "ay", not "uh"): the back-ends lower-case."""
    if not HAVE_ALL:
        pytest.skip("festival or flite is not installed")
    syn = tool.synthesizers
    programs = syn.find_programs(syn.SYNTHS)
    text = "A CAT AND A DOG SAW A HAT ON A MAT"
    for spk in (syn.voices("festival")[0], syn.voices("flite")[0]):
        ours = syn.synthesize([_Req("a", text, spk, 1.0, 1.0)], programs)[0]
        lower, upper = _raw(spk, text.lower(), programs), _raw(spk, text, programs)
        assert abs(len(ours) - len(lower)) < 0.01 * len(lower) and len(upper) > 1.06 * len(lower), spk


def _raw(spk: Any, text: str, programs: Dict[str, str]) -> np.ndarray:
    """The engine's own reading of ``text`` as given (no lower-casing), 16 kHz."""
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/x.wav"
        if spk.synth == "flite":
            subprocess.run([programs["flite"], "-voice", spk.voice, "-t", text, "-o", path], check=True)
        else:
            script = f'(voice_{spk.voice})\n(utt.save.wave (SynthText "{text}") "{path}" \'riff)\n'
            subprocess.run([programs["festival"], "--pipe"], input=script.encode(), check=True, capture_output=True)
        audio, sr = soundfile.read(path, dtype="float64")
    assert sr == 16000
    return audio


def test_festival_batches_do_not_change_the_audio(tool):
    """One festival process renders many utterances: each comes out as when rendered alone."""
    if not HAVE_ALL:
        pytest.skip("festival or flite is not installed")
    syn = tool.synthesizers
    programs = syn.find_programs(["festival"])
    kal, ked, slt = syn.voices("festival")
    a, b, c = _Req("a", SHORT, slt, 1.1, 0.9), _Req("b", SHORT, kal, 0.9, 1.1), _Req("c", LONG, ked, 1.2, 1.15)
    together = syn.synthesize([b, a, c], programs)
    for req, audio in zip((b, a, c), together):
        assert np.array_equal(syn.synthesize([req], programs)[0], audio), req.utt_id


def test_pitch_by_resampling_is_a_rate_change(tool):
    """to_16k reads audio as if sampled at pitch x its rate: a 200 Hz tone at 32 kHz, shifted by 1.1, is 220 Hz."""
    syn = tool.synthesizers
    t = np.arange(32000) / 32000
    out = syn.to_16k(np.sin(2 * np.pi * 200 * t), 32000 * 1.1, "u")
    assert abs(len(out) - 16000 / 1.1) <= 1
    spec = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    assert abs(np.argmax(spec) * 16000 / len(out) - 220) < 2


def _psd_slope(noise: np.ndarray, lo: float, hi: float) -> float:
    """Least-squares slope of log10 power vs log10 frequency over [lo, hi] Hz (Welch-style average)."""
    frames = noise[: noise.size // 1024 * 1024].reshape(-1, 1024) * np.hanning(1024)
    psd = np.mean(np.abs(np.fft.rfft(frames, axis=1)) ** 2, axis=0)
    freqs = np.fft.rfftfreq(1024, d=1 / 16000)
    keep = (freqs >= lo) & (freqs <= hi)
    return float(np.polyfit(np.log10(freqs[keep]), np.log10(psd[keep]), 1)[0])


def test_noise_colours(tool):
    slopes = {}
    for kind in ("white", "pink", "brown"):
        noise = tool.make_noise(kind, 16000 * 8 + 37, np.random.default_rng(0))  # a length with no fast FFT
        assert noise.shape == (16000 * 8 + 37,)
        assert abs(np.mean(noise ** 2) - 1.0) < 1e-6
        slopes[kind] = _psd_slope(noise, 300, 6000)
    assert abs(slopes["white"]) < 0.15
    assert abs(slopes["pink"] + 1.0) < 0.15
    assert abs(slopes["brown"] + 2.0) < 0.2


def test_bad_input_gives_clear_errors(tool, tmp_path, capsys):
    bad = tmp_path / "sentences.txt"
    bad.write_text("A GOOD SENTENCE\nthis one is lower case\n")
    assert tool.main(["--out", str(tmp_path / "o"), "--num-train", "1", "--num-dev", "0", "--num-test", "0",
                      "--sentences", str(bad), "--no-progress"]) == 1
    assert re.search(r"sentences\.txt:2: not an upper-case sentence", capsys.readouterr().err)

    dup = tmp_path / "dup.txt"
    dup.write_text("ONE TWO\nTHREE FOUR\nONE TWO\n")
    with pytest.raises(ValueError, match=r"dup\.txt:3: duplicate sentence \(first on line 1\)"):
        tool.load_sentences(str(dup))

    assert tool.main(["--out", str(tmp_path / "o"), "--num-train", "1", "--num-dev", "2", "--num-test", "1",
                      "--sentences", str(SENTENCES), "--train-synths", "espeak", "--num-test-unseen", "0",
                      "--no-progress", "--espeak", "no-such-espeak-binary"]) == 1
    assert "espeak-ng not found ('no-such-espeak-binary')" in capsys.readouterr().err

    small = tmp_path / "small.txt"
    small.write_text("ONE TWO\nTHREE FOUR\nFIVE SIX\n")
    with pytest.raises(ValueError, match="distinct sentences"):
        tool.plan_corpus(tool.load_sentences(str(small)), {"train": 1, "dev": 1, "test": 1, "test_unseen": 1},
                         0, None, "x")

    with pytest.raises(SystemExit):
        tool.main(["--out", "x", *COUNTS, "--snr-db", "10", "--no-noise"])
    assert "not allowed with argument" in capsys.readouterr().err
    for args, msg in ((["--unseen-synth", "festival"], "every festival voice is held out for test_unseen"),
                      (["--unseen-voices", "awb,bob"], "unknown flite voice"),
                      (["--train-synths", "espeak,mbrola"], "unknown synthesizer 'mbrola'"),
                      (["--num-test-unseen", "-1"], "--num-test-unseen must be >= 0")):
        with pytest.raises(SystemExit):
            tool.main(["--out", "x", "--num-train", "1", "--num-dev", "0", "--num-test", "0", *args])
        assert msg in capsys.readouterr().err, args


def test_without_the_synth_extra_the_tool_says_which_in_one_line(tool, not_installed, tmp_path, capsys):
    """scipy resamples the synthesizers' speech: a core install without it gets the extra's name, not a traceback."""
    not_installed("scipy")
    assert tool.main(["--out", str(tmp_path / "data"), "--num-train", "1", "--num-dev", "0", "--num-test", "0",
                      "--num-test-unseen", "0", "--train-synths", "espeak", "--no-progress"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "make_synthetic_corpus.py: error: synthesizing speech needs scipy, which is not installed: "
        "pip install -e '.[synth]' (in the asrkit checkout)"]
    assert not (tmp_path / "data").exists()


# --- the training voices: every voice the installed engines offer, except the held-out ones ----------------------

def _installed_espeak_variants() -> set:
    """The variant files of the installed espeak-ng (in the data folder it names), the reference for 'every variant'."""
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    data = re.search(r"Data at: (.+)", out).group(1).strip()
    return set(os.listdir(os.path.join(data, "voices", "!v")))


def test_training_uses_every_installed_espeak_variant_but_the_held_out(tool):
    syn = tool.synthesizers
    installed = _installed_espeak_variants()
    assert len(installed) > 50  # espeak-ng 1.51 has 101
    assert set(syn.ESPEAK_TRAIN_VARIANTS) == installed - set(syn.ESPEAK_HELDOUT_VARIANTS)
    assert not set(syn.ESPEAK_TRAIN_VARIANTS) & set(syn.ESPEAK_HELDOUT_VARIANTS)
    speakers = syn.voices("espeak")
    assert speakers[0].spk_id == "enus_m1"
    ids = [s.spk_id for s in speakers]
    assert len(set(ids)) == len(ids) == len(syn.ESPEAK_TRAIN_VOICES) * len(installed - set(syn.ESPEAK_HELDOUT_VARIANTS))
    assert all(re.fullmatch(r"[a-z]+_[A-Za-z0-9]+", i) for i in ids), [i for i in ids if " " in i]


@needs_all
def test_training_uses_every_flite_voice_but_the_held_out_and_the_talking_clock(tool):
    """flite -lv names its voices; awb_time only reads times of day (a limited-domain voice)."""
    listed = subprocess.run(["flite", "-lv"], capture_output=True, text=True).stdout.split(":", 1)[1].split()
    choice = tool.SynthChoice(dict(tool.DEFAULT_TRAIN_SYNTHS))
    assert {s.voice for s in choice.train_pool("flite")} == set(listed) - {"awb", "rms", "awb_time"}
    assert {s.voice for s in choice.unseen_pool()} == {"awb", "rms"}


def test_no_held_out_voice_in_train_dev_or_test(tool):
    """The default corpus: flite awb/rms only in test_unseen; espeak's held-out voices and variants only in test;
    and test_unseen is the same whatever the training synthesizers are (comparable with earlier corpora)."""
    syn = tool.synthesizers
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 4000, "dev": 100, "test": 100, "test_unseen": 100}
    plan = tool.plan_corpus(sentences, counts, seed=1, snr_db=25.0, out_dir="unused")
    heldout_espeak = {s.spk_id for s in syn.espeak_heldout_speakers()}
    for split in ("train", "dev", "test"):
        assert not [s.utt_id for s in plan[split] if s.speaker.synth == "flite" and s.speaker.voice in ("awb", "rms")]
    for split in ("train", "dev"):
        assert not {s.speaker.spk_id for s in plan[split]} & heldout_espeak
    assert {s.speaker.spk_id for s in plan["test_unseen"]} == {"flite_awb", "flite_rms"}
    assert {s.speaker.synth for s in plan["train"]} == {"espeak", "festival", "flite"}
    assert {s.speaker.voice for s in plan["train"] if s.speaker.synth == "flite"} == {"slt", "kal16", "kal"}
    # espeak speakers in train: hundreds (5 voices x ~98 variants), most of them used at 4000 utterances
    assert len({s.speaker.spk_id for s in plan["train"] if s.speaker.synth == "espeak"}) > 350
    old = tool.plan_corpus(sentences, counts, seed=1, snr_db=25.0, out_dir="unused",
                           synths=tool.SynthChoice({"espeak": 1.0, "festival": 1.0}))
    assert plan["test_unseen"] == old["test_unseen"]


def test_espeak_draws_its_whole_rate_and_pitch_scales_and_intonation_range(tool):
    sentences = tool.load_sentences(str(SENTENCES))
    plan = tool.plan_corpus(sentences, {"train": 3000, "dev": 0, "test": 0}, seed=2, snr_db=None, out_dir="x")
    espeak = [s for s in plan["train"] if s.speaker.synth == "espeak"]
    others = [s for s in plan["train"] if s.speaker.synth != "espeak"]
    wpm, pitch = zip(*(tool.synthesizers.espeak_settings(s.rate, s.pitch) for s in espeak))
    assert min(pitch) <= 3 and max(pitch) >= 96  # espeak-ng's 0-99 pitch scale, nearly all of it
    assert min(wpm) <= 125 and max(wpm) >= 225
    assert all(tool.RATE[0] <= s.rate <= tool.RATE[1] and tool.PITCH[0] <= s.pitch <= tool.PITCH[1] for s in others)
    ranges = [s.pitch_range for s in espeak]
    assert min(ranges) < 0.6 and max(ranges) > 1.9 and {s.word_gap for s in espeak} == {0, 1, 2, 3}


def test_espeak_word_gap_and_pitch_range_reach_the_engine(tool):
    syn = tool.synthesizers
    programs = syn.find_programs(["espeak"])
    spk = syn.voices("espeak")[0]
    plain, gap, flat, wide = syn.synthesize([_Req("a", LONG, spk, 1.0, 1.0), _Req("b", LONG, spk, 1.0, 1.0, 1.0, 3),
                                             _Req("c", LONG, spk, 1.0, 1.0, 0.5), _Req("d", LONG, spk, 1.0, 1.0, 2.0)],
                                            programs)
    # 15 gaps between 16 words, 30 ms each at the default speed
    assert 0.3 < _speech_seconds(gap) - _speech_seconds(plain) < 0.9
    # the intonation range: the spread of F0 (10th to 90th percentile) is wider at 200% than at 50%
    def spread(audio):
        f0 = AF.detect_pitch_frequency(torch.tensor(audio, dtype=torch.float32), 16000, freq_low=60, freq_high=300)
        return float(np.percentile(f0.numpy(), 90) - np.percentile(f0.numpy(), 10))
    assert abs(_speech_seconds(flat) - _speech_seconds(wide)) < 0.1 * _speech_seconds(plain)
    assert spread(wide) > spread(flat)


# --- derived speakers (--derived-voices true): a training voice moved to the other sex's F0 and vocal tract ------

DERIVED_IDS = {"flite_slt_m": ("flite", "slt"), "fest_slt_m": ("festival", "cmu_us_slt_arctic_hts"),
               "fest_kal_f": ("festival", "kal_diphone"), "fest_ked_f": ("festival", "ked_diphone")}


def _log_spectrum(audio: np.ndarray, n: int = 1024) -> np.ndarray:
    """The long-term log power spectrum of the loud frames, smoothed over ~400 Hz so that formants, not
    harmonics, shape it."""
    frames = np.lib.stride_tricks.sliding_window_view(audio, n)[::256] * np.hanning(n)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    energy = power.sum(axis=1)
    log = np.log(power[energy > 0.01 * energy.max()].mean(axis=0) + 1e-12)
    return np.convolve(log, np.ones(25) / 25, mode="same")


def _spectral_warp(base: np.ndarray, derived: np.ndarray) -> float:
    """The factor k (grid 0.01) under which derived's spectrum at f best matches base's at f / k, 300-5000 Hz."""
    freqs = np.fft.rfftfreq(1024, d=1 / 16000)
    ref, got = _log_spectrum(base), _log_spectrum(derived)
    keep = (freqs >= 300) & (freqs <= 5000)
    errors = {}
    for k in np.round(np.arange(0.7, 1.31, 0.01), 2):
        diff = got[keep] - np.interp(freqs[keep] / k, freqs, ref)
        errors[float(k)] = float(np.var(diff))  # the variance: a level difference is no mismatch
    return min(errors, key=errors.get)


def test_derived_speaker_ids_are_unique_stable_and_off_by_default(tool):
    syn = tool.synthesizers
    derived = syn.derived_voices("flite") + syn.derived_voices("festival")
    assert {s.spk_id: (s.synth, s.voice) for s in derived} == DERIVED_IDS
    assert syn.derived_voices("espeak") == []
    base_ids = {s.spk_id for synth in syn.SYNTHS for s in syn.voices(synth)}
    assert not base_ids & set(DERIVED_IDS) and len(base_ids | set(DERIVED_IDS)) == len(base_ids) + 4
    # female -> male: lower F0 and a longer vocal tract; male -> female: the other way
    for s in derived:
        assert (s.f0 * s.shift < 0.9 and s.shift < 1) if s.spk_id.endswith("_m") else (s.f0 * s.shift > 1.4 and s.shift > 1)
        if (s.synth, s.voice) in syn.PITCH_BY_RESAMPLING:
            assert s.f0 == 1.0  # the engine takes no F0 setting: the shift alone moves its F0
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 2000, "dev": 100, "test": 100, "test_unseen": 100}
    default = tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x")
    off = tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x",
                           synths=tool.SynthChoice(dict(tool.DEFAULT_TRAIN_SYNTHS), derived=False))
    assert default == off
    assert not {s.speaker.spk_id for split in tool.SPLITS for s in default[split]} & set(DERIVED_IDS)


def test_derived_speakers_train_like_any_voice_but_never_in_test_unseen(tool):
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 2000, "dev": 100, "test": 100, "test_unseen": 100}
    on = tool.SynthChoice(dict(tool.DEFAULT_TRAIN_SYNTHS), derived=True)
    plan = tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x", synths=on)
    assert plan == tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x", synths=on)  # reproducible
    assert plan != tool.plan_corpus(sentences, counts, seed=5, snr_db=None, out_dir="x", synths=on)
    assert {s.speaker.spk_id for s in plan["train"]} >= set(DERIVED_IDS)
    assert {s.speaker.spk_id for s in plan["dev"] + plan["test"]} & set(DERIVED_IDS)
    for split in ("train", "dev", "test"):
        assert not [s for s in plan[split] if s.speaker.synth == "flite" and s.speaker.voice in ("awb", "rms")]
    off = tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x")
    assert plan["test_unseen"] == off["test_unseen"]
    assert {s.speaker.spk_id for s in plan["test_unseen"]} == {"flite_awb", "flite_rms"}
    # a voice held out for test_unseen takes its derived speaker out of training too
    held = tool.SynthChoice({"espeak": 1.0, "festival": 1.0}, "festival", ("kal_diphone",), derived=True)
    plan = tool.plan_corpus(sentences, counts, seed=4, snr_db=None, out_dir="x", synths=held)
    festival = {s.speaker.spk_id for split in ("train", "dev", "test") for s in plan[split] if s.speaker.synth == "festival"}
    assert festival == {"fest_ked", "fest_slt", "fest_slt_m", "fest_ked_f"}


def test_derived_voices_option_reaches_the_corpus_and_a_bad_value_is_refused(tool, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        tool.main(["--out", "x", *COUNTS, "--derived-voices", "yes"])
    assert "--derived-voices: invalid choice: 'yes'" in capsys.readouterr().err
    asked = []
    monkeypatch.setattr(tool, "make_corpus", lambda *args, synths, **kw: asked.append(synths.derived))
    for flag in ([], ["--derived-voices", "false"], ["--derived-voices", "true"]):
        assert tool.main(["--out", "x", *COUNTS, *flag]) == 0
    assert asked == [False, False, True]


def test_extra_train_adds_train_utterances_of_the_named_speakers_and_leaves_the_rest(tool):
    sentences = tool.load_sentences(str(SENTENCES))
    counts = {"train": 300, "dev": 20, "test": 20, "test_unseen": 20}
    base = tool.plan_corpus(sentences, counts, seed=4, snr_db=20.0, out_dir="x")
    extra = tool.SynthChoice(dict(tool.DEFAULT_TRAIN_SYNTHS), extra_train=(("flite_slt_m", 5), ("fest_kal", 3)))
    plan = tool.plan_corpus(sentences, counts, seed=4, snr_db=20.0, out_dir="x", synths=extra)
    assert plan == tool.plan_corpus(sentences, counts, seed=4, snr_db=20.0, out_dir="x", synths=extra)
    for split in ("dev", "test", "test_unseen"):
        assert plan[split] == base[split]
    assert plan["train"][:300] == base["train"]
    added = plan["train"][300:]
    assert [s.speaker.spk_id for s in added] == ["flite_slt_m"] * 5 + ["fest_kal"] * 3
    assert [s.utt_id for s in added] == [f"{s.speaker.spk_id}-train{i:06d}" for i, s in enumerate(added, 300)]
    assert added[0].speaker.shift == 0.85 and added[0].speaker.f0 == 0.8  # the derived speaker, not flite's slt
    train_sentences = {s.text for s in base["train"]} | {s.text for s in added}
    assert not train_sentences & {s.text for split in ("dev", "test", "test_unseen") for s in base[split]}
    # each added utterance draws its own settings and noise, as a drawn one does
    assert len({(s.rate, s.pitch, s.peak) for s in added}) == 8 and len({s.noise_seed for s in plan["train"]}) == 308
    assert all(tool.RATE[0] <= s.rate <= tool.RATE[1] and tool.PITCH[0] <= s.pitch <= tool.PITCH[1] for s in added)
    # extra utterances alone need train sentences too: every sentence held out leaves them none
    held_all = {"train": 0, "dev": len(sentences) - 40, "test": 20, "test_unseen": 20}
    with pytest.raises(ValueError, match="leave none for train"):
        tool.plan_corpus(sentences, held_all, seed=4, snr_db=None, out_dir="x", synths=extra)
    assert tool.plan_corpus(sentences, held_all, seed=4, snr_db=None, out_dir="x")["train"] == []


def test_extra_train_refuses_bad_items_and_voices_it_must_not_train(tool, capsys):
    assert tool.parse_extra_train("") == ()
    assert tool.parse_extra_train(" flite_slt_m:400, fest_kal:1 ") == (("flite_slt_m", 400), ("fest_kal", 1))
    for bad, says in (("flite_slt_m", "expected SPEAKER:N with N > 0"), ("flite_slt_m:0", "with N > 0"),
                      ("flite_slt_m:x", "bad --extra-train item 'flite_slt_m:x'"), ("a:1,a:2", "'a' given twice")):
        with pytest.raises(ValueError, match=re.escape(says)):
            tool.parse_extra_train(bad)
    default = dict(tool.DEFAULT_TRAIN_SYNTHS)
    for synths, spk in ((tool.SynthChoice(default, extra_train=(("nobody", 1),)), "nobody"),
                        (tool.SynthChoice(default, extra_train=(("flite_awb", 1),)), "flite_awb"),  # held out
                        (tool.SynthChoice({"espeak": 1.0}, extra_train=(("flite_slt", 1),)), "flite_slt"),
                        (tool.SynthChoice({"espeak": 1.0, "festival": 1.0}, "festival", ("kal_diphone",),
                                          extra_train=(("fest_kal_f", 1),)), "fest_kal_f")):  # derived from held out
        with pytest.raises(ValueError, match=f"'{spk}' is not a speaker of the training synthesizers"):
            synths.check()
    with pytest.raises(SystemExit):
        tool.main(["--out", "x", *COUNTS, "--extra-train", "flite_rms:10"])
    assert "'flite_rms' is not a speaker of the training synthesizers" in capsys.readouterr().err


@needs_all
def test_derived_speakers_have_the_intended_f0_formants_and_duration(tool):
    """Each derived speaker against its base voice on the same sentence, rate and pitch: median F0 (torchaudio's
    detector) moves by f0 x shift, the long-term spectrum is the base's warped by shift (formants), and the
    speech lasts as long (within 10%): the rendering rate undoes the resampling's stretch."""
    syn = tool.synthesizers
    programs = syn.find_programs(["festival", "flite"])
    derived = syn.derived_voices("flite") + syn.derived_voices("festival")
    bases = {(s.synth, s.voice): s for synth in ("flite", "festival") for s in syn.voices(synth)}
    audio = {}
    for synth in ("flite", "festival"):  # one festival process for all its voices
        spks = [s for s in derived if s.synth == synth]
        reqs = [_Req(s.spk_id, LONG, s, 1.0, 1.0) for s in spks]
        reqs += [_Req(f"{s.spk_id}_base", LONG, bases[(s.synth, s.voice)], 1.0, 1.0) for s in spks]
        audio.update(zip((r.utt_id for r in reqs), syn.synthesize(reqs, programs)))
    f0 = {name: _median_f0(a) for name, a in audio.items()}
    for s in derived:
        base, got = audio[f"{s.spk_id}_base"], audio[s.spk_id]
        f0_ratio = f0[s.spk_id] / f0[f"{s.spk_id}_base"]
        # within 10%, or up to 15% under: festival's diphone voices scale the mean of their F0 contour, not its
        # spread in Hz, so the median moves a little less (kal 0.93, ked 0.91 of the factor, measured)
        assert 0.85 < f0_ratio / (s.f0 * s.shift) < 1.1, (s.spk_id, f0_ratio, s.f0 * s.shift)
        assert abs(_spectral_warp(base, got) - s.shift) <= 0.03, (s.spk_id, _spectral_warp(base, got), s.shift)
        assert abs(_speech_seconds(got) / _speech_seconds(base) - 1) < 0.1, s.spk_id
    # the male slt lands in a male F0 range, the female kal and ked in a female one
    assert 95 < f0["flite_slt_m"] < 135 and 160 < min(f0["fest_kal_f"], f0["fest_ked_f"]) < 230, f0
