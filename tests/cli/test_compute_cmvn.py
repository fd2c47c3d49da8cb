"""asrkit compute-cmvn end to end on a tiny data dir written in tmp_path."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio.cmvn import CMVNError, CMVNStats
from asrkit.audio.frontend import build_frontend
from asrkit.cli.compute_cmvn import compute_cmvn, main
from asrkit.config import FrontendConfig
from asrkit.data.table import read_table, write_table

SR = 16000


def _make_data_dir(root, lengths, broken=()):
    """int16 wavs of the given lengths, plus entries in ``broken`` pointing at missing/corrupt files."""
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    scp, waves = {}, {}
    for i, n in enumerate(lengths):
        t = np.arange(n) / SR
        x = 0.3 * np.sin(2 * np.pi * (150 + 40 * i) * t) + 0.05 * rng.standard_normal(n)
        path = root / f"u{i}.wav"
        sf.write(path, x, SR, subtype="PCM_16")
        scp[f"utt{i}"] = str(path)
        waves[f"utt{i}"] = torch.from_numpy(sf.read(path, dtype="float32")[0])
    for name in broken:
        scp[name] = str(root / f"{name}.wav")
        if name.startswith("corrupt"):
            (root / f"{name}.wav").write_bytes(b"RIFF not really a wav")
    write_table(data / "wav.scp", scp)
    write_table(data / "text", {u: "HELLO" for u in scp})
    write_table(data / "utt2spk", {u: "spk1" for u in scp})
    return data, waves


def _reference(waves, cfg):
    """mean/std of all frames of all utterances, features computed directly, concatenated."""
    fe = build_frontend(cfg).eval()
    frames = [fe(w[None], torch.tensor([w.numel()]))[0][0] for w in waves.values()]
    x = torch.cat(frames).double().numpy()
    return x.shape[0], x.mean(0), x.std(0)


def test_cli_writes_stats_equal_to_direct_features(tmp_path, capsys):
    data, waves = _make_data_dir(tmp_path, [8000, 5600, 12000, 300], broken=["missing1", "corrupt1"])
    out = tmp_path / "exp" / "cmvn.json"
    assert main([str(data), str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "skipping utterance missing1" in err and "skipping utterance corrupt1" in err
    assert "skipping utterance utt3: 300 samples is shorter than one analysis window" in err
    assert "3 skipped" in err
    stats = json.loads(out.read_text())
    count, mean, std = _reference({k: w for k, w in waves.items() if k != "utt3"}, FrontendConfig())
    assert stats["frame_count"] == count and stats["dim"] == 80
    assert stats["meta"]["num_utts"] == 3 and stats["meta"]["num_skipped"] == 3
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats["std"], std, rtol=1e-4)
    m, istd = CMVNStats.load(out).finalize()
    np.testing.assert_allclose(m.numpy(), mean, rtol=1e-5, atol=1e-5)


def test_config_frontend_section_and_max_utts(tmp_path):
    data, waves = _make_data_dir(tmp_path, [4000, 4800, 5600, 6400])
    conf = tmp_path / "x.yaml"
    conf.write_text("frontend:\n  kind: kaldi_fbank\n  window: povey\n  n_mels: 23\n")
    out = tmp_path / "cmvn.json"
    assert main([str(data), str(out), "--config", str(conf), "--max-utts", "2", "--no-progress"]) == 0
    stats = json.loads(out.read_text())
    cfg = FrontendConfig(kind="kaldi_fbank", window="povey", n_mels=23)
    # Two utterances evenly spread over four: utt0 and utt2.
    count, mean, _ = _reference({k: waves[k] for k in ("utt0", "utt2")}, cfg)
    assert stats["dim"] == 23 and stats["frame_count"] == count and stats["meta"]["num_utts"] == 2
    assert stats["meta"]["frontend"]["kind"] == "kaldi_fbank"
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-5, atol=1e-4)


def test_set_overrides_the_config_frontend(tmp_path, capsys):
    data, waves = _make_data_dir(tmp_path, [4000, 5600])
    conf = tmp_path / "x.yaml"
    conf.write_text("frontend:\n  n_mels: 40\n  utterance_cmn: true\n")
    out = tmp_path / "cmvn.json"
    assert main([str(data), str(out), "--config", str(conf), "--set", "frontend.n_mels=23",
                 "--set", "frontend.utterance_cmn=false", "--no-progress"]) == 0
    stats = json.loads(out.read_text())
    count, mean, _ = _reference(waves, FrontendConfig(n_mels=23))
    assert stats["dim"] == 23 and stats["meta"]["frontend"]["utterance_cmn"] is False
    np.testing.assert_allclose(stats["mean"], mean, rtol=1e-5, atol=1e-4)
    assert main([str(data), str(out), "--config", str(conf), "--set", "frontend.n_mel=23"]) == 1
    assert "frontend.n_mel" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(data), str(out), "--set", "frontend.n_mels=23"])
    assert exc.value.code == 2 and "give --config too" in capsys.readouterr().err


def test_errors(tmp_path, capsys):
    data, _ = _make_data_dir(tmp_path, [], broken=["missing1"])
    assert main([str(data), str(tmp_path / "o.json"), "--no-progress"]) == 1
    assert "no features computed (1 of 1 utterances skipped)" in capsys.readouterr().err
    with pytest.raises(CMVNError):
        compute_cmvn(data, None, progress=False)
    assert main([str(tmp_path / "nodir"), str(tmp_path / "o.json")]) == 1
    assert "not a directory" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("frontend:\n  n_mel: 40\n")
    assert main([str(data), str(tmp_path / "o.json"), "--config", str(bad)]) == 1
    assert "frontend.n_mel" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(data), str(tmp_path / "o.json"), "--max-utts", "0"])
    assert exc.value.code == 2 and "--max-utts must be >= 1" in capsys.readouterr().err


def test_an_utterance_with_nan_samples_is_skipped_not_averaged_in(tmp_path, capsys):
    """NaN samples would give NaN features and make every mean and variance NaN: the audio reader refuses
    them, and compute-cmvn skips the utterance by name."""
    data, waves = _make_data_dir(tmp_path, [8000, 5600])
    bad = np.full(4000, 0.1, dtype=np.float32)
    bad[100] = np.nan
    sf.write(tmp_path / "nan.wav", bad, 16000, subtype="FLOAT")
    scp = read_table(data / "wav.scp")
    scp["nan1"] = str(tmp_path / "nan.wav")
    write_table(data / "wav.scp", scp)
    write_table(data / "text", {**read_table(data / "text"), "nan1": "X"})
    write_table(data / "utt2spk", {**read_table(data / "utt2spk"), "nan1": "s"})
    out = tmp_path / "cmvn.json"
    assert main([str(data), str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "skipping utterance nan1" in err and "audio contains NaN or infinite samples" in err
    count, mean, _ = _reference(waves, FrontendConfig())
    stats = CMVNStats.load(out)
    assert stats.frame_count == count and torch.isfinite(stats.sum).all()
