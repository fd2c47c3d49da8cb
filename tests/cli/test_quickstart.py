"""README's quick start, run as written: the commands of ``docs/snippets/quickstart.sh`` (the file the docs
show) in order, in a fresh directory holding only tiny data dirs, audio files and tiny versions of the configs
the commands name (so that the run takes seconds). Nothing is created beforehand that a command writes
(``data/lang/``, ``exp/``, ``subs/``): each command makes its own output's parent directories."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import List

import numpy as np
import soundfile as sf
import yaml

from asrkit.cli import main
from asrkit.config import load_config, load_lm_config, save_config
from asrkit.data.table import read_table
from tests.tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "docs" / "snippets" / "quickstart.sh"
TINY_ASR = ["model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
            "model.encoder.num_layers=1", "model.encoder.conv_channels=8", "frontend.n_mels=20", "train.epochs=1",
            "train.warmup_steps=2", "train.log_interval=1", "data.num_workers=0", "specaug.enabled=false"]
TINY_LM = ["model.embed_dim=16", "model.hidden_size=16", "model.num_layers=1", "train.epochs=1",
           "train.warmup_steps=1", "train.log_interval=1"]
SENTENCES = ["A CAB", "BAD CAB", "A DAB", "CAB BAD", "DAD", "A BAD DAD"]


def commands(script: Path) -> List[List[str]]:
    """The script's commands as argument lists: comments dropped, backslash continuations joined."""
    joined = script.read_text(encoding="utf-8").replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _tone(path: Path, seconds: float, freq: float) -> None:
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 16000)


def _data_dir(root: Path, name: str, sentences: List[str]) -> None:
    d = root / "data" / name
    d.mkdir(parents=True)
    utts = [f"{name}{i}" for i in range(len(sentences))]
    for i, utt in enumerate(utts):
        _tone(d / f"{utt}.wav", 0.5 + 0.1 * i, 200 + 40 * i)
    (d / "wav.scp").write_text("".join(f"{u} {d / u}.wav\n" for u in utts))
    (d / "text").write_text("".join(f"{u} {s}\n" for u, s in zip(utts, sentences)))
    (d / "utt2spk").write_text("".join(f"{u} {u}\n" for u in utts))
    (d / "spk2utt").write_text("".join(f"{u} {u}\n" for u in utts))


def _workdir(root: Path) -> None:
    """Tiny data dirs, the audio the transcribe line names, and tiny copies of the configs."""
    _data_dir(root, "train", SENTENCES[:4])
    _data_dir(root, "dev", SENTENCES[4:5])
    _data_dir(root, "test", SENTENCES[4:])
    _tone(root / "some.wav", 0.7, 300)
    t = np.arange(16000) / 16000
    sf.write(root / "other.flac", (0.3 * np.sin(2 * np.pi * 350 * t)).astype(np.float32), 16000, format="FLAC")
    (root / "recordings").mkdir()
    _tone(root / "recordings" / "r1.wav", 0.6, 400)
    conf = root / "conf"
    conf.mkdir()
    save_config(load_config(REPO / "conf" / "tiny_ctc.yaml", TINY_ASR), conf / "tiny_ctc.yaml")
    save_config(load_lm_config(REPO / "conf" / "lm_lstm_small.yaml", TINY_LM), conf / "lm_lstm_small.yaml")
    (conf / "decode_ctc_prefix_lm.yaml").write_text((REPO / "conf" / "decode_ctc_prefix_lm.yaml").read_text())


def test_quickstart_runs_as_written_on_a_tiny_data_dir(tmp_path, monkeypatch, capsys):
    _workdir(tmp_path)
    monkeypatch.chdir(tmp_path)
    cmds = commands(QUICKSTART)
    assert [c[:2] for c in cmds][:3] == [["python", "tools/validate_data_dir.py"], ["asrkit", "train-tokenizer"],
                                         ["asrkit", "compute-cmvn"]]
    for cmd in cmds:
        if cmd[0] == "python":
            assert cmd[1].startswith("tools/") and cmd[1].endswith(".py"), cmd
            rc = load_tool(cmd[1][len("tools/"):-len(".py")]).main(cmd[2:])
        else:
            assert cmd[0] == "asrkit", cmd
            rc = main(cmd[1:])
        assert rc == 0, f"{shlex.join(cmd)}: exit status {rc}\n{capsys.readouterr().err[-2000:]}"
    test_utts = set(read_table(tmp_path / "data" / "test" / "text"))
    for out in ("decode_test", "decode_test_lm"):
        assert set(read_table(tmp_path / "exp" / "tiny_ctc" / out / "text")) == test_utts, out
    assert yaml.safe_load((tmp_path / "exp" / "tiny_ctc" / "decode_test_lm" / "decode.yaml").read_text())["lm"] == \
        str(tmp_path / "exp" / "lm_lstm")
    assert sorted(p.name for p in (tmp_path / "subs").iterdir()) == ["other.srt", "r1.srt", "some.srt"]
