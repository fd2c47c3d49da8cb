"""tools/*data_dir*.py, combine_data.py, utt2spk_to_spk2utt.py, compute_utt2dur.py: thin CLIs over asrkit.data.datadir."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrkit.data.datadir import read_data_dir
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
SR = 16000


def tool(name: str):
    return load_tool(name)


def make_dir(d: Path, utts, spk=lambda u: u[:2], audio_dir: Path | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    wav = {}
    for i, u in enumerate(utts):
        if audio_dir is not None:
            path = audio_dir / f"{u}.wav"
            sf.write(path, np.zeros(1600 * (i + 1), np.float32), SR, subtype="PCM_16")
            wav[u] = str(path)
        else:
            wav[u] = f"/x/{u}.wav"
    (d / "wav.scp").write_text("".join(f"{u} {wav[u]}\n" for u in sorted(utts)))
    (d / "text").write_text("".join(f"{u} WORDS OF {u.upper()}\n" for u in sorted(utts)))
    (d / "utt2spk").write_text("".join(f"{u} {spk(u)}\n" for u in sorted(utts)))
    tool("utt2spk_to_spk2utt").main([str(d / "utt2spk"), str(d / "spk2utt")])
    return d


def test_every_tool_has_a_usage_docstring_and_main():
    for name in ("validate_data_dir", "fix_data_dir", "subset_data_dir", "combine_data", "utt2spk_to_spk2utt",
                 "compute_utt2dur"):
        mod = tool(name)
        assert "usage: tools/" in mod.__doc__ and callable(mod.main), name


def test_utt2spk_to_spk2utt(tmp_path, capsys):
    (tmp_path / "utt2spk").write_text("s2-b s2\ns1-a s1\ns2-a s2\n")
    assert tool("utt2spk_to_spk2utt").main([str(tmp_path / "utt2spk")]) == 0
    assert capsys.readouterr().out == "s1 s1-a\ns2 s2-a s2-b\n"
    (tmp_path / "bad").write_text("u1 s1\nu1 s2\n")
    assert tool("utt2spk_to_spk2utt").main([str(tmp_path / "bad")]) == 1
    assert "bad:2: duplicate key 'u1' (first seen on line 1)" in capsys.readouterr().err


def test_validate_then_fix_then_validate(tmp_path, capsys):
    d = make_dir(tmp_path / "d", ["aa1", "aa2", "bb1", "bb2"])
    validate, fix = tool("validate_data_dir"), tool("fix_data_dir")
    assert validate.main([str(d)]) == 0
    with open(d / "text", "a") as fh:
        fh.write("zz9 ORPHAN\n")
    (d / "utt2spk").write_text("bb2 bb\naa1 aa\naa2 aa\nbb1 bb\n")
    capsys.readouterr()
    assert validate.main([str(d)]) == 1
    err = capsys.readouterr().err
    assert f"{d}/text:5: utt 'zz9' is not in wav.scp" in err
    assert f"{d}/utt2spk:2: not sorted: 'aa1' comes after 'bb2'" in err
    assert fix.main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "kept 4 of 5 utterances, dropped 1" in out and "dropped zz9: not in wav.scp; not in utt2spk" in out
    assert (d / ".backup" / "text").read_text().endswith("zz9 ORPHAN\n")
    assert validate.main([str(d)]) == 0


def test_subset_and_combine(tmp_path, capsys):
    src = make_dir(tmp_path / "src", ["aa1", "aa2", "aa3", "bb1", "bb2"])
    subset = tool("subset_data_dir")
    assert subset.main(["--first", "2", str(src), str(tmp_path / "first")]) == 0
    assert read_data_dir(tmp_path / "first").audio_utts() == ["aa1", "aa2"]
    (tmp_path / "spks").write_text("bb\n")
    assert subset.main(["--spk-list", str(tmp_path / "spks"), str(src), str(tmp_path / "bb")]) == 0
    assert (tmp_path / "bb" / "spk2utt").read_text() == "bb bb1 bb2\n"
    assert subset.main(["--random", "3", "--seed", "4", str(src), str(tmp_path / "r1")]) == 0
    assert subset.main(["--random", "3", "--seed", "4", str(src), str(tmp_path / "r2")]) == 0
    assert (tmp_path / "r1" / "text").read_text() == (tmp_path / "r2" / "text").read_text()
    assert len(read_data_dir(tmp_path / "r1").audio_utts()) == 3
    (tmp_path / "list").write_text("bb2\naa3 whatever\nnope\n")
    assert subset.main(["--utt-list", str(tmp_path / "list"), str(src), str(tmp_path / "l")]) == 0
    assert read_data_dir(tmp_path / "l").audio_utts() == ["aa3", "bb2"]
    assert "1 ids of" in capsys.readouterr().err
    assert subset.main(["--last", "9", str(src), str(tmp_path / "x")]) == 1
    assert "asked for 9 utterances but the data dir has 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        subset.main(["--first", "1", "--last", "1", str(src), str(tmp_path / "x")])

    combine = tool("combine_data")
    assert combine.main([str(tmp_path / "all"), str(tmp_path / "first"), str(tmp_path / "bb")]) == 0
    assert read_data_dir(tmp_path / "all").audio_utts() == ["aa1", "aa2", "bb1", "bb2"]
    assert tool("validate_data_dir").main([str(tmp_path / "all")]) == 0
    assert combine.main([str(tmp_path / "dup"), str(tmp_path / "first"), str(src)]) == 1
    err = capsys.readouterr().err
    assert f"'aa1' is in both {tmp_path / 'first'} and {src}" in err


def test_compute_utt2dur(tmp_path, capsys):
    audio = tmp_path / "audio"
    audio.mkdir()
    d = make_dir(tmp_path / "d", ["u1", "u2", "u3"], audio_dir=audio)
    assert tool("compute_utt2dur").main([str(d)]) == 0
    assert (d / "utt2dur").read_text() == "u1 0.1\nu2 0.2\nu3 0.3\n"
    os.remove(audio / "u2.wav")
    assert tool("compute_utt2dur").main(["--nj", "2", str(d)]) == 1
    assert f"utt u2: {audio / 'u2.wav'}: file not found" in capsys.readouterr().err
    assert (d / "utt2dur").read_text() == "u1 0.1\nu3 0.3\n"


def test_script_runs_standalone(tmp_path, capsys):
    d = make_dir(tmp_path / "d", ["aa1", "bb1"])
    run = subprocess.run([sys.executable, str(REPO / "tools" / "validate_data_dir.py"), str(d)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == f"{d}: OK", run.stderr
    with pytest.raises(SystemExit) as exit_:
        tool("fix_data_dir").main(["--help"])
    assert exit_.value.code == 0 and "usage: fix_data_dir.py" in capsys.readouterr().out
