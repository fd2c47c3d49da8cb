"""Additive noise: the SNR measured after mixing, coloured noise spectra, noise files and directories, babble."""
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio import noise as noise_module
from asrkit.audio.io import AudioError
from asrkit.audio.noise import (NoiseSource, babble, coloured_noise, fit_length, list_noise_files, mix_at_snr,
                                read_noise)
from asrkit.config import GENERATED_NOISES, ConfigError, NoiseConfig

RATE = 16000


def _snr(clean: np.ndarray, mixed: np.ndarray) -> float:
    """The SNR of ``mixed`` against ``clean`` in dB, measured: 10 log10(sum clean^2 / sum (mixed - clean)^2)."""
    return 10 * math.log10(np.sum(clean.astype(np.float64) ** 2)
                           / np.sum((mixed.astype(np.float64) - clean.astype(np.float64)) ** 2))


@pytest.mark.parametrize("kind", ["white", "pink", "brown"])
@pytest.mark.parametrize("snr", [-5.0, 0.0, 7.3, 20.0, 35.0])
def test_the_measured_snr_of_mixed_noise_is_the_drawn_one(kind, snr):
    rng = np.random.default_rng(1)
    speech = torch.from_numpy((0.3 * np.sin(np.arange(8000) * 0.05) * rng.uniform(0.2, 1, 8000)).astype(np.float32))
    noise = coloured_noise(kind, 8000, rng) * 0.01
    mixed = mix_at_snr(speech, noise, snr)
    assert mixed.shape == speech.shape and mixed.dtype == torch.float32
    added = mixed.double() - speech.double()  # the noise itself, scaled (not subtracted or reshaped)
    assert torch.allclose(added / added.norm(), noise.double() / noise.double().norm(), atol=1e-4)
    assert abs(_snr(speech.numpy(), mixed.numpy()) - snr) < 0.5
    assert abs(_snr(speech.numpy(), mixed.numpy()) - snr) < 0.01  # float32 rounding only


def test_mixing_silence_is_refused_with_none_and_shapes_must_agree():
    x = torch.ones(10)
    assert mix_at_snr(torch.zeros(10), x, 10.0) is None
    assert mix_at_snr(x, torch.zeros(10), 10.0) is None
    with pytest.raises(ValueError, match="noise of shape"):
        mix_at_snr(x, torch.ones(9), 10.0)


@pytest.mark.parametrize("kind, slope", [("white", 0.0), ("pink", -1.0), ("brown", -2.0)])
def test_coloured_noise_has_unit_power_and_its_spectral_slope(kind, slope):
    x = coloured_noise(kind, 64 * 1024, np.random.default_rng(3))
    assert x.dtype == torch.float32 and x.numel() == 64 * 1024
    assert float(x.double().square().mean()) == pytest.approx(1.0, rel=1e-5)
    assert abs(float(x.double().mean())) < 0.05 * float(x.double().std()) or kind == "brown"
    # Averaged periodograms of 1024-sample segments; log power against log frequency over bins 4..400.
    segs = x.double().numpy().reshape(64, 1024)
    psd = (np.abs(np.fft.rfft(segs, axis=1)) ** 2).mean(axis=0)
    f = np.arange(4, 400)
    fitted = np.polyfit(np.log(f), np.log(psd[f]), 1)[0]
    assert fitted == pytest.approx(slope, abs=0.15)


def test_coloured_noise_is_drawn_from_the_generator():
    a = coloured_noise("pink", 501, np.random.default_rng(5))
    assert a.numel() == 501  # an odd length too
    assert torch.equal(a, coloured_noise("pink", 501, np.random.default_rng(5)))
    assert not torch.equal(a, coloured_noise("pink", 501, np.random.default_rng(6)))
    white = np.random.default_rng(5).standard_normal(64)
    ref = torch.from_numpy((white / np.sqrt(np.mean(white.astype(np.float32).astype(np.float64) ** 2)))
                           .astype(np.float32))
    assert torch.allclose(coloured_noise("white", 64, np.random.default_rng(5)), ref, atol=1e-6)  # unshaped
    for kind in ("pink", "brown"):
        x = coloured_noise(kind, 64, np.random.default_rng(1))
        assert abs(float(x.double().mean())) < 1e-6  # no DC
        assert torch.equal(coloured_noise(kind, 1, np.random.default_rng(0)), torch.zeros(1))  # all DC: removed


def test_fit_length_repeats_and_cuts():
    assert fit_length(torch.tensor([1.0, 2.0, 3.0]), 7).tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert fit_length(torch.tensor([1.0, 2.0, 3.0]), 2).tolist() == [1, 2]
    assert fit_length(torch.tensor([1.0, 2.0, 3.0]), 3).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="^cannot fit an empty signal to a length$"):
        fit_length(torch.zeros(0), 3)


def test_babble_sums_rolled_unit_power_utterances():
    a, b = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 3.0, 3.0])
    out = babble([a, b, torch.zeros(5)], 6, np.random.default_rng(2))
    rng = np.random.default_rng(2)
    ref = torch.roll(fit_length(a, 6).double() / math.sqrt(2 / 6), int(rng.integers(6)))
    ref += torch.roll(fit_length(b, 6).double() / math.sqrt(36 / 6), int(rng.integers(6)))
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, atol=1e-6)


def _wav(path, samples, rate=RATE):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.asarray(samples, dtype=np.float32), rate, subtype="FLOAT" if path.suffix == ".wav" else None)
    return str(path)


def test_noise_files_are_listed_per_directory_recursively(tmp_path):
    musan = tmp_path / "musan"
    _wav(musan / "noise" / "free-sound" / "b.wav", [0.1] * 10)
    _wav(musan / "noise" / "a.wav", [0.1] * 10)
    _wav(musan / "music" / "x" / "c.flac", [0.1] * 10)
    (musan / "music" / "README").write_text("not audio")
    _wav(tmp_path / "elsewhere" / "d.ogg", [0.1] * 10)
    (musan / "music" / "linked").symlink_to(tmp_path / "elsewhere")  # a folder linked in is followed
    found = list_noise_files([str(musan / "noise"), str(musan / "music")])
    assert found == [[str(musan / "noise" / "a.wav"), str(musan / "noise" / "free-sound" / "b.wav")],
                     [str(musan / "music" / "linked" / "d.ogg"), str(musan / "music" / "x" / "c.flac")]]


def test_a_missing_or_empty_noise_dir_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^augment.noise.dirs: .*nowhere: no such directory$"):
        list_noise_files([str(tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"^augment.noise.dirs: .*empty: no audio files \(.wav, .flac, .ogg\)"):
        list_noise_files([str(tmp_path / "empty")])


def test_read_noise_takes_a_contiguous_segment_from_a_drawn_offset(tmp_path):
    samples = np.random.default_rng(0).uniform(-0.5, 0.5, 1000).astype(np.float32)
    path = _wav(tmp_path / "n.wav", samples)
    starts = set()
    for seed in range(30):
        out = read_noise(path, 300, RATE, np.random.default_rng(seed)).numpy()
        start = int(np.flatnonzero(samples == out[0])[0])
        np.testing.assert_array_equal(out, samples[start:start + 300])
        starts.add(start)
    assert min(starts) >= 0 and max(starts) <= 700 and len(starts) > 20


def test_read_noise_repeats_a_short_file_and_resamples(tmp_path):
    short = _wav(tmp_path / "short.wav", [0.1, 0.2, 0.3])
    assert read_noise(short, 8, RATE, np.random.default_rng(0)).tolist() == pytest.approx(
        [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.1, 0.2])
    slow = _wav(tmp_path / "8k.wav", np.sin(np.arange(4000) * 0.1) * 0.3, rate=8000)
    assert read_noise(slow, 5000, RATE, np.random.default_rng(1)).numel() == 5000


def test_read_noise_errors_name_the_noise_file(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF junk")
    with pytest.raises(AudioError, match=f"^utt noise: {bad}: "):
        read_noise(str(bad), 10, RATE, np.random.default_rng(0))
    nan = _wav(tmp_path / "nan.wav", [0.1, float("nan"), 0.2])  # a readable header, samples that are not
    with pytest.raises(AudioError, match=f"^utt noise: {nan}: audio contains NaN or infinite samples$"):
        read_noise(nan, 10, RATE, np.random.default_rng(0))


def test_read_noise_reads_only_its_segment_and_never_runs_a_command(tmp_path, monkeypatch):
    path = _wav(tmp_path / "long.wav", np.full(16000, 0.1))
    calls = []
    real = noise_module.load_audio
    monkeypatch.setattr(noise_module, "load_audio", lambda *a, **k: calls.append(k) or real(*a, **k))
    assert read_noise(path, 800, RATE, np.random.default_rng(0)).numel() == 800
    assert calls[0]["end"] - calls[0]["start"] == pytest.approx(800 / RATE)  # a minute of music is not all read
    marker = tmp_path / "ran"
    with pytest.raises(AudioError, match=r"\|: file not found$"):
        read_noise(f"touch {marker} |", 10, RATE, np.random.default_rng(0))
    assert not marker.exists()
    odd = str(tmp_path / "odd name |")  # a file whose name ends like a pipe is a file
    (tmp_path / "odd name |").write_bytes(Path(_wav(tmp_path / "odd.wav", np.full(100, 0.3))).read_bytes())
    assert torch.allclose(read_noise(odd, 50, RATE, np.random.default_rng(0)), torch.full((50,), 0.3))


def test_noise_source_draws_every_source(tmp_path):
    noise_dir = tmp_path / "noise"
    _wav(noise_dir / "a.wav", np.full(50, 0.25))
    calls = []

    def others(k, rng):
        assert isinstance(rng, np.random.Generator)  # babble's picks are drawn from the utterance's generator
        calls.append(k)
        return [torch.ones(7)] * k

    source = NoiseSource(NoiseConfig(prob=1.0, dirs=(str(noise_dir),), generated=GENERATED_NOISES,
                                     babble_utts=(2, 3)), RATE)
    assert source.names == (str(noise_dir),) + GENERATED_NOISES
    outs = [source.draw(100, np.random.default_rng(s), others) for s in range(60)]
    assert all(o.shape == (100,) for o in outs)
    assert any(torch.allclose(o, torch.full((100,), 0.25)) for o in outs)  # the file
    assert set(calls) == {2, 3}  # babble of 2 or 3 others
    assert any(torch.allclose(o, torch.full((100,), float(k))) for o in outs for k in (2, 3))


def test_noise_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^augment.noise.prob must be in \[0, 1\], got 1.5$"):
        NoiseConfig(prob=1.5)
    with pytest.raises(ConfigError, match=r"^augment.noise.snr must be a range \[low, high\] with low <= high, "
                                          r"got \[20.0, 5.0\]$"):
        NoiseConfig(snr=(20.0, 5.0))
    with pytest.raises(ConfigError, match=r"^augment.noise.generated: 'purple' is unknown \(choose from: white, "
                                          r"pink, brown, babble\)$"):
        NoiseConfig(generated=("white", "purple"))
    with pytest.raises(ConfigError, match=r"^augment.noise.prob is 0.5 but there is no noise source"):
        NoiseConfig(prob=0.5, generated=())
    with pytest.raises(ConfigError, match=r"^augment.noise.babble_utts must lie within \[1, inf\], got \[0, 2\]$"):
        NoiseConfig(babble_utts=(0, 2))
