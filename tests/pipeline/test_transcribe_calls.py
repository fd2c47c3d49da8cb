"""How transcription is called and fed: one input or many (whisper's and NeMo's call shape), numpy waveforms at
any rate, per-call search options, results written as they finish, audio on standard input, wav.scp lists only
by an explicit option, and a flat count of file descriptors over thousands of small inputs.

The model is a tiny untrained CTC model: what is checked is how inputs reach it and results leave it, compared
with the same audio given another way (its scores are deterministic), not what it recognises.
"""
from __future__ import annotations

import io
import json
import os
import resource
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF

import asrkit
from asrkit.cli import main
from asrkit.config import ConfigError
from asrkit.pipeline import AudioInput, Result
from asrkit.pipeline import stream as stream_module
from asrkit.pipeline.inputs import starts_like_audio
from tests.pipeline.tiny_exp import make_tiny_exp

SR = 16000


@pytest.fixture(scope="module")
def tiny_exp(tmp_path_factory) -> Path:
    """An experiment dir with a tiny untrained CTC model (seeded)."""
    return make_tiny_exp(tmp_path_factory.mktemp("tiny") / "exp")


def _noise(seconds: float, seed: int, rate: int = SR) -> np.ndarray:
    """Speech-band noise in bursts (so voice activity finds something), float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    envelope = (np.sin(np.arange(n) * 2 * np.pi * 3 / rate) > -0.2).astype(np.float32)
    return (0.3 * rng.standard_normal(n) * envelope).clip(-1, 1).astype(np.float32)


def _signature(r: Result):
    return r.text, [(a.text, round(a.score, 4)) for a in r.nbest], r.duration


# ------------------------------------------------------------------ item 9: the call shape

def test_a_single_path_is_one_input_and_returns_one_result(tiny_exp, tmp_path):
    model = asrkit.load_model(str(tiny_exp))
    wav = _noise(1.5, 0)
    sf.write(tmp_path / "a.wav", wav, SR)
    one = model.transcribe(str(tmp_path / "a.wav"))
    assert isinstance(one, Result) and one.ok, one
    assert one.name == str(tmp_path / "a.wav") and one.duration == pytest.approx(1.5)
    assert _signature(model.transcribe(tmp_path / "a.wav")) == _signature(one)  # a PathLike too
    many = model.transcribe([str(tmp_path / "a.wav")])
    assert isinstance(many, list) and [_signature(r) for r in many] == [_signature(one)]
    # A waveform (tensor or numpy array) is one input as well, with the file's result.
    assert _signature(model.transcribe(torch.from_numpy(wav))) == _signature(one)
    assert _signature(model.transcribe(wav)) == _signature(one)
    assert [_signature(r) for r in model.transcribe((wav, torch.from_numpy(wav)))] == [_signature(one)] * 2
    assert [_signature(r) for r in model.transcribe(iter([str(tmp_path / "a.wav")]))] == [_signature(one)]


def test_a_numpy_waveform_at_another_rate_is_resampled(tiny_exp):
    model = asrkit.load_model(str(tiny_exp))
    wav8k = _noise(2.0, 1, rate=8000)
    reference = AF.resample(torch.from_numpy(wav8k), 8000, SR)  # independent of asrkit's reader
    got = model.transcribe(wav8k, sample_rate=8000)
    assert got.duration == pytest.approx(2.0)
    assert _signature(got) == _signature(model.transcribe(reference))
    assert _signature(got) != _signature(model.transcribe(wav8k))  # taken at the model's rate: other audio


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 1600), np.float32), "1-D"),
    (np.zeros(1600, np.int16), "float"),
])
def test_a_waveform_that_is_not_mono_float_is_refused(tiny_exp, bad, message):
    model = asrkit.load_model(str(tiny_exp))
    with pytest.raises(ValueError, match=message):
        model.transcribe(bad)


def test_per_call_search_options_apply_to_that_call_only(tiny_exp):
    model = asrkit.load_model(str(tiny_exp))
    wav = _noise(1.5, 2)
    greedy = model.transcribe(wav)
    assert len(greedy.nbest) == 1
    beam = model.transcribe(wav, mode="ctc_prefix", beam=4, nbest=3)
    assert len(beam.nbest) == 3 and beam.nbest[0].score >= beam.nbest[2].score
    # The reference: a model loaded with that search.
    from asrkit.config import DecodeConfig

    loaded = asrkit.load_model(str(tiny_exp), decode=DecodeConfig(mode="ctc_prefix", beam=4, nbest=3))
    assert _signature(beam) == _signature(loaded.transcribe(wav))
    assert _signature(model.transcribe(wav)) == _signature(greedy)  # nothing leaked into the next call
    assert model.decode_cfg == DecodeConfig()


@pytest.mark.parametrize("options, named", [
    ({"beem": 4}, "beem"),
    ({"beam": "wide"}, "beam"),
    ({"mode": "ctc_prefix", "nbest": 9, "beam": 2}, "nbest"),
    ({"attention_window": 5}, "attention_window"),
])
def test_bad_per_call_options_are_refused_naming_the_key(tiny_exp, options, named):
    model = asrkit.load_model(str(tiny_exp))
    with pytest.raises(ConfigError, match=named):
        model.transcribe(_noise(0.5, 3), **options)


# ------------------------------------------------------------------ item 12: results as they finish

def _write_files(folder: Path, count: int, seconds: float = 0.4) -> list:
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        paths.append(str(folder / f"f{i:03d}.wav"))
        sf.write(paths[-1], _noise(seconds, 10 + i), SR)
    return paths


def _when_reading(monkeypatch, path: str, snapshot) -> list:
    """Call ``snapshot()`` when transcription starts reading ``path``; returns the list of its values."""
    seen = []
    real = stream_module.audio_info

    def audio_info(source, **kw):
        if source == path:
            seen.append(snapshot())
        return real(source, **kw)

    monkeypatch.setattr(stream_module, "audio_info", audio_info)
    return seen


def test_results_reach_stdout_before_the_last_input_is_read(tiny_exp, tmp_path, monkeypatch):
    paths = _write_files(tmp_path / "in", 4)
    out_path = tmp_path / "out.jsonl"
    out = open(out_path, "w", encoding="utf-8", buffering=1 << 20)  # a file, block-buffered, as stdout to a file
    monkeypatch.setattr(sys, "stdout", out)
    seen = _when_reading(monkeypatch, paths[-1], out_path.read_text)
    try:
        status = main(["transcribe", "--model", str(tiny_exp), "--no-progress", "--num-workers", "0",
                       "--batch-seconds", "0.2", "--format", "jsonl", *paths])
    finally:
        out.close()
    assert status == 0
    lines = out_path.read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == paths
    assert len(seen) == 1 and seen[0].splitlines() == lines[:3]  # on disk, whole lines, before the last input


def test_output_files_are_written_one_by_one_and_whole(tiny_exp, tmp_path, monkeypatch):
    paths = _write_files(tmp_path / "in", 3)
    out_dir = tmp_path / "out"
    seen = _when_reading(monkeypatch, paths[-1], lambda: sorted(os.listdir(out_dir)) if out_dir.exists() else [])
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "--num-workers", "0",
                 "--batch-seconds", "0.2", "--format", "vtt", "--output-dir", str(out_dir), *paths]) == 0
    assert seen == [["f000.vtt", "f001.vtt"]]
    assert sorted(os.listdir(out_dir)) == ["f000.vtt", "f001.vtt", "f002.vtt"]
    assert all((out_dir / f).read_text().startswith("WEBVTT\n") for f in os.listdir(out_dir))


def test_subtitles_of_a_directory_to_stdout_are_refused_before_any_work(tiny_exp, tmp_path, monkeypatch, capsys):
    _write_files(tmp_path / "in", 2)
    seen = _when_reading(monkeypatch, str(tmp_path / "in" / "f000.wav"), lambda: True)
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "--format", "srt",
                 str(tmp_path / "in")]) == 2
    captured = capsys.readouterr()
    assert seen == [] and captured.out == "" and "--output-dir" in captured.err


def test_progress_counts_seconds_of_audio(tiny_exp, tmp_path, capsys):
    paths = _write_files(tmp_path / "in", 2, seconds=1.5)
    model = asrkit.load_model(str(tiny_exp))
    model.transcribe(paths + [_noise(2.0, 5)], progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any("5.0/5.0" in line and "s/s" in line for line in bar), bar[-3:]


# ------------------------------------------------------------------ item 13: audio on standard input

def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.mark.parametrize("head", [
    b"RIFF\x24\x08\x00\x00WAVEfmt \x10\x00\x00\x00", b"RF64\xff\xff\xff\xffWAVEds64\x1c\x00\x00\x00",
    b"fLaC\x00\x00\x00\x22", b"fLaC\x80\x00\x00\x22", b"OggS\x00\x02", b"ID3\x04\x00\x00", b"\xff\xfb\x90\x64"])
def test_audio_signatures(head):
    assert starts_like_audio(head)


@pytest.mark.parametrize("text", ["RIFF.wav\n", "RIFF1234WAVEfmt 1234.wav\n", "ID3\x04 x.mp3\n", "fLaC.flac\n",
                                  "OggS/a.ogg\n", "ID3 tags.mp3\n", "/data/a.wav\n", "\ufeffa.wav\n", ""])
def test_lists_of_paths_never_look_like_audio(text):
    assert not starts_like_audio(text.encode("utf-8")[:20])


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG", "MP3"])
def test_audio_bytes_on_stdin_are_transcribed(tiny_exp, tmp_path, monkeypatch, capsys, fmt):
    wav = _noise(1.2, 7)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(path, wav, SR, format=fmt)
    expected = asrkit.load_model(str(tiny_exp)).transcribe(str(path))
    _stdin(monkeypatch, path.read_bytes())
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "--format", "jsonl", "-"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    got = json.loads(line)
    assert got["name"] == "stdin" and got["text"] == expected.text
    assert got["duration"] == pytest.approx(1.2) and got["nbest"][0]["score"] == pytest.approx(expected.nbest[0].score)


def test_binary_stdin_that_is_not_audio_is_refused_in_one_line(tiny_exp, monkeypatch, capsys):
    _stdin(monkeypatch, bytes(range(256)) * 40)
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "-"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "'-' reads a list of paths" in line and "\x00" not in line


def test_a_list_of_paths_on_stdin_still_works(tiny_exp, tmp_path, monkeypatch, capsys):
    paths = _write_files(tmp_path / "in", 2)
    _stdin(monkeypatch, "".join(p + "\n" for p in paths).encode())
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "-"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == paths


# ------------------------------------------------------------------ item 17: pipes only from --scp

def test_an_scp_among_the_inputs_runs_no_command(tiny_exp, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    sf.write(inbox / "a.wav", _noise(1.0, 8), SR)
    (inbox / "notes.scp").write_text(f"x touch {tmp_path / 'pwned'}; cat {inbox / 'a.wav'} |\n")
    status = main(["transcribe", "--model", str(tiny_exp), "--no-progress", str(inbox / "a.wav"),
                   str(inbox / "notes.scp")])  # what `inbox/*` expands to
    captured = capsys.readouterr()
    assert not (tmp_path / "pwned").exists()
    assert status == 1 and "notes.scp" in captured.err and "--scp" in captured.err
    assert [line.split("\t")[0] for line in captured.out.splitlines()] == [str(inbox / "a.wav")]
    # Named with --scp, the list is trusted: its pipe runs.
    assert main(["transcribe", "--model", str(tiny_exp), "--no-progress", "--scp", str(inbox / "notes.scp"),
                 str(inbox / "a.wav")]) == 0
    assert (tmp_path / "pwned").exists()
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [name for name, _ in lines] == ["x", str(inbox / "a.wav")]
    assert lines[0][1] == lines[1][1]


def test_the_python_api_reads_an_scp_name_as_a_file(tiny_exp, tmp_path):
    (tmp_path / "list.scp").write_text(f"x touch {tmp_path / 'pwned'} |\n")
    result = asrkit.load_model(str(tiny_exp)).transcribe(str(tmp_path / "list.scp"))
    assert not result.ok and not (tmp_path / "pwned").exists()
    assert AudioInput("x", scp_source="true |").scp_source == "true |"  # trusted only when built on purpose


# ------------------------------------------------------------------ item 21: file descriptors stay flat

def test_hundreds_of_small_files_under_a_low_descriptor_limit(tiny_exp, tmp_path):
    paths = _write_files(tmp_path / "small", 200, seconds=0.2)
    model = asrkit.load_model(str(tiny_exp))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))  # new descriptors take the lowest free numbers
    # Room for the loader's pipes and its read-ahead (16 items a worker), not for one descriptor per input
    # (before the fix: one per buffered segment, over 200 for these files: "Too many open files").
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 120, hard))
    try:
        results = model.transcribe(paths, num_workers=2)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [r.name for r in results] == paths and all(r.ok for r in results)
