"""tools/make_synthetic_corpus.py: real espeak-ng speech in Kaldi data dirs."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.data.table import read_table

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "make_synthetic_corpus.py"
SENTENCES = REPO / "tools" / "corpus" / "sentences.txt"
TABLES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur")
SPLITS = ("train", "dev", "test")
COUNTS = ["--num-train", "6", "--num-dev", "2", "--num-test", "3"]

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


def _load_tool():
    spec = importlib.util.spec_from_file_location("make_synthetic_corpus", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _load_tool()


@pytest.fixture(scope="module")
def corpora(tool, tmp_path_factory):
    """The same seed rendered three ways: noisy in-process, noisy via the CLI with 2 jobs, clean."""
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
    for split, n in zip(SPLITS, (6, 2, 3)):
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
        assert sorted(u for utts in spk2utt.values() for u in utts) == sorted(utt2spk)
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
    assert not set(texts["train"]) & set(texts["dev"])
    assert not set(texts["train"]) & set(texts["test"])
    assert not set(texts["dev"]) & set(texts["test"])


def test_test_split_has_unseen_voice_or_variant(corpora, tool):
    def parts(spk):  # speaker id = <voice code>_<variant>
        voice, variant = spk.split("_")
        return voice, variant

    train = [parts(s) for s in read_table(corpora / "noisy" / "train" / "spk2utt")]
    test = [parts(s) for s in read_table(corpora / "noisy" / "test" / "spk2utt")]
    assert any(v not in {t[0] for t in train} or var not in {t[1] for t in train} for v, var in test)

    # The guarantee holds for any size: plan a big corpus (nothing rendered) and check it.
    sentences = tool.load_sentences(str(SENTENCES))
    plan = tool.plan_corpus(sentences, {"train": 3000, "dev": 50, "test": 40}, seed=5, snr_db=None,
                            out_dir="unused")
    train_voices = {s.speaker.voice for s in plan["train"]} | {s.speaker.voice for s in plan["dev"]}
    train_variants = {s.speaker.variant for s in plan["train"]} | {s.speaker.variant for s in plan["dev"]}
    unseen = [s for s in plan["test"] if s.speaker.voice not in train_voices or s.speaker.variant not in train_variants]
    assert len(unseen) == 20  # every other test utterance
    assert len({s.speaker.spk_id for s in plan["train"]}) > 20  # many train speakers
    # rate and pitch vary per utterance
    assert len({s.rate for s in plan["train"]}) > 30 and len({s.pitch for s in plan["train"]}) > 30


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
        noise = tool.make_noise(kind, 16000 * 8, np.random.default_rng(0))
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
                      "--sentences", str(SENTENCES),
                      "--no-progress", "--espeak", "no-such-espeak-binary"]) == 1
    assert "espeak-ng not found" in capsys.readouterr().err

    small = tmp_path / "small.txt"
    small.write_text("ONE TWO\nTHREE FOUR\n")
    with pytest.raises(ValueError, match="distinct sentences"):
        tool.plan_corpus(tool.load_sentences(str(small)), {"train": 1, "dev": 1, "test": 1}, 0, None, "x")

    with pytest.raises(SystemExit):
        tool.main(["--out", "x", *COUNTS, "--snr-db", "10", "--no-noise"])
    assert "not allowed with argument" in capsys.readouterr().err
