"""tools/make_reverb_noise_set.py: test_reverb_noise, the test sentences through held-out rooms and noises.

References: the training ranges are asrkit.config's augment defaults and the recipes' configs (read here, not
copied); the SNR is measured on the tool's own parts (reverberated speech = asrkit.audio.reverb.reverberate of the
clean input with the drawn room's response, noise = mixture minus that); spectra are fitted by least squares.
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from asrkit.config import GENERATED_NOISES, ExperimentConfig, load_config
from asrkit.data.datadir import read_data_dir, validate_data_dir
from asrkit.data.table import read_table
from tool_loader import load_tool

pytest.importorskip("pyroomacoustics")
REPO = Path(__file__).resolve().parents[2]
SR = 16000


@pytest.fixture(scope="module")
def tool():
    return load_tool("make_reverb_noise_set")


def _overlap(a, b) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _training_reverb_configs():
    """The augment.reverb ranges training draws from: the defaults and every recipe config's."""
    cfgs = [ExperimentConfig().augment.reverb]
    for name in ("mini_small.yaml", "mini_medium.yaml", "mini_small_joint.yaml", "transformer.yaml",
                 "conformer.yaml"):
        cfgs.append(load_config(REPO / "conf" / name).augment.reverb)
    return cfgs


def test_held_out_rooms_are_outside_every_training_range(tool):
    """A held-out room differs from every training room in its size and in its walls (and, as drawn, its distance)."""
    for train in _training_reverb_configs():
        for name, held in tool.ROOM_CLASSES.items():
            for key in ("room_length", "room_width", "room_height", "absorption", "distance"):
                assert not _overlap(getattr(held, key), getattr(train, key)), (name, key)


def test_held_out_noises_are_none_of_trainings_kinds(tool):
    assert not set(tool.NOISE_KINDS) & set(GENERATED_NOISES)
    for name in ("mini_small.yaml", "mini_medium.yaml"):
        assert not set(tool.NOISE_KINDS) & set(load_config(REPO / "conf" / name).augment.noise.generated)


def test_every_class_and_kind_is_drawn_and_the_draws_depend_on_seed_and_utterance_only(tool):
    conds = {u: tool.draw_condition(tool.utterance_rng(1, u), (5.0, 20.0)) for u in (f"u{i:03d}" for i in range(200))}
    assert {c.room_class for c in conds.values()} == set(tool.ROOM_CLASSES)
    assert {c.noise for c in conds.values()} == set(tool.NOISE_KINDS)
    snrs = [c.snr_db for c in conds.values()]
    assert 5.0 <= min(snrs) < 6.0 and 19.0 < max(snrs) <= 20.0
    for c in conds.values():  # each room inside its class's ranges
        cfg = tool.ROOM_CLASSES[c.room_class]
        for value, bounds in zip(c.room.size, (cfg.room_length, cfg.room_width, cfg.room_height)):
            assert bounds[0] <= value <= bounds[1]
        assert cfg.absorption[0] <= c.room.absorption <= cfg.absorption[1]
        assert c.room.distance <= cfg.distance[1] + 1e-9
    again = tool.draw_condition(tool.utterance_rng(1, "u007"), (5.0, 20.0))
    assert again == conds["u007"]
    assert tool.draw_condition(tool.utterance_rng(2, "u007"), (5.0, 20.0)) != conds["u007"]


def _slope(x: np.ndarray, lo: float, hi: float) -> float:
    frames = x[: x.size // 1024 * 1024].reshape(-1, 1024) * np.hanning(1024)
    psd = np.mean(np.abs(np.fft.rfft(frames, axis=1)) ** 2, axis=0)
    f = np.fft.rfftfreq(1024, d=1 / SR)
    keep = (f >= lo) & (f <= hi)
    return float(np.polyfit(np.log10(f[keep]), np.log10(psd[keep]), 1)[0])


def test_held_out_noise_kinds(tool):
    rng = np.random.default_rng(0)
    n = SR * 6 + 11
    for kind, slope in (("blue", 1.0), ("violet", 2.0)):
        x = tool.held_out_noise(kind, n, rng).numpy()
        assert x.shape == (n,) and float(np.mean(x.astype(np.float64) ** 2)) == pytest.approx(1.0, rel=1e-4)
        assert abs(_slope(x, 200, 7000) - slope) < 0.15, kind
    hum = tool.held_out_noise("hum", n, rng).numpy()
    spec = np.abs(np.fft.rfft(hum)) ** 2
    f = np.fft.rfftfreq(n, d=1 / SR)
    f0 = 50.0 if spec[np.argmin(abs(f - 50))] > spec[np.argmin(abs(f - 60))] else 60.0
    near = sum(spec[np.abs(f - k * f0) < 1.0].sum() for k in range(1, 9))
    assert near > 0.99 * spec.sum()  # all its power on the mains frequency and its harmonics
    bursty = tool.held_out_noise("bursty", n, rng).numpy()
    env = np.sqrt(np.mean(bursty[: n // 160 * 160].reshape(-1, 160) ** 2, axis=1))  # 10 ms frames
    on = env > 0.05 * env.max()
    assert 0.15 < on.mean() < 0.6 and np.count_nonzero(np.diff(on.astype(int)) == 1) >= 5  # several bursts
    spec = np.abs(np.fft.rfft(bursty)) ** 2
    f = np.fft.rfftfreq(n, d=1 / SR)
    assert spec[(f >= 1000) & (f <= 4000)].sum() > 0.98 * spec.sum()  # the gate's edges leak a little
    with pytest.raises(ValueError, match="unknown held-out noise kind 'pink'"):
        tool.held_out_noise("pink", n, rng)


def _speechlike(seconds: float = 2.0, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    t = np.arange(int(SR * seconds)) / SR
    x = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(t.size)
    return torch.from_numpy((0.3 * x).astype(np.float32))


def test_the_mixture_has_the_drawn_snr_and_the_rooms_response(tool):
    from asrkit.audio.reverb import reverberate, simulate_rir

    wav = _speechlike()
    for utt in ("a", "b", "c", "d", "e", "f"):
        out, cond = tool.corrupt(wav, utt, 1, (5.0, 20.0))
        assert out.shape == wav.shape and out.dtype == torch.float32
        speech = reverberate(wav, simulate_rir(cond.room, SR, tool.MAX_ORDER)).double()
        assert float(out.abs().max()) < tool.PEAK  # quiet enough not to be scaled: out = speech + noise
        noise = out.double() - speech
        snr = 10 * math.log10(float(speech.square().mean()) / float(noise.square().mean()))
        assert snr == pytest.approx(cond.snr_db, abs=0.05), utt
        assert torch.equal(tool.corrupt(wav, utt, 1, (5.0, 20.0))[0], out)  # the same seed: the same audio


def test_a_loud_mixture_is_scaled_below_full_scale(tool):
    wav = _speechlike() * 3.2  # peaks near 1: with noise on top it would clip
    out, cond = tool.corrupt(wav, "loud", 1, (5.0, 5.0))
    assert float(out.abs().max()) == pytest.approx(tool.PEAK, abs=1e-6)
    assert cond.snr_db == 5.0


def _src_dir(root: Path) -> Path:
    src = root / "test"
    (src / "wav").mkdir(parents=True)
    utts = {"spk1-u1": "HELLO WORLD", "spk1-u2": "GOOD MORNING", "spk2-u3": "A QUIET NIGHT"}
    for i, utt in enumerate(utts):
        soundfile.write(src / "wav" / f"{utt}.flac", _speechlike(1.0 + 0.5 * i, i).numpy(), SR, subtype="PCM_16")
    (src / "wav.scp").write_text("".join(f"{u} {src / 'wav' / u}.flac\n" for u in utts))
    (src / "text").write_text("".join(f"{u} {t}\n" for u, t in utts.items()))
    (src / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in utts))
    return src


def test_command_writes_a_valid_data_dir_of_the_same_utterances(tool, tmp_path, capsys, monkeypatch):
    src = _src_dir(tmp_path)
    out = tmp_path / "test_reverb_noise"
    monkeypatch.chdir(tmp_path)
    assert tool.main(["--src", str(src), "--out", "test_reverb_noise", "--seed", "4"]) == 0  # in-process: no JIT again
    assert "3 utterances; rooms: " in capsys.readouterr().err
    validate_data_dir(out)
    assert read_table(out / "text") == read_table(src / "text")
    assert read_table(out / "utt2spk") == read_table(src / "utt2spk")
    dd = read_data_dir(out)
    for utt, path in dd.wav_scp.items():
        audio, sr = soundfile.read(path, dtype="float32")
        clean, _ = soundfile.read(src / "wav" / f"{utt}.flac", dtype="float32")
        assert sr == SR and audio.shape == clean.shape and Path(path).is_absolute()
        assert dd.utt2dur[utt] == pytest.approx(audio.size / SR, abs=1e-4)
        # what the command wrote is corrupt() of the clean file, to 16-bit precision
        want, cond = tool.corrupt(torch.from_numpy(clean), utt, 4, (5.0, 20.0))
        assert np.max(np.abs(audio - want.numpy())) < 2e-4
        assert read_table(out / "conditions")[utt] == cond.describe()
    with pytest.raises(SystemExit):
        tool.main(["--src", str(src), "--out", str(tmp_path / "x"), "--snr", "20,5"])
    assert capsys.readouterr().err.strip().endswith("--snr '20,5': LOW is above HIGH")


def test_a_missing_audio_file_is_one_line_naming_it(tool, tmp_path, capsys):
    src = _src_dir(tmp_path)
    (src / "wav" / "spk1-u1.flac").unlink()
    assert tool.main(["--src", str(src), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("make_reverb_noise_set.py: error: ") and "spk1-u1" in err and err.count("\n") == 1, err


def test_the_script_runs_from_anywhere(tmp_path):
    """As the recipe calls it: its usage from --help, no install needed (asrkit from the checkout)."""
    res = subprocess.run([sys.executable, str(REPO / "tools" / "make_reverb_noise_set.py"), "--help"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and "held-out set" in res.stdout
