"""``--device`` on every subcommand that takes it: CUDA asked for on a machine without it is one line on stderr
(no traceback, nothing written), and the default follows one rule, said the same way in each --help."""
from __future__ import annotations

import pytest
import torch

import asrkit.cli as cli
from asrkit.cli.device import DEVICE_HELP, DeviceError, resolve_device

SUBCOMMANDS_WITH_DEVICE = ["compute-cmvn", "decode", "export", "serve", "train", "train-lm", "transcribe",
                           "tune-fusion"]


def _argv(name: str, tmp) -> list:
    """Arguments that parse; the directories exist but hold nothing (the device is checked before they are read)."""
    d = tmp / "dir"
    d.mkdir(exist_ok=True)
    return {
        "compute-cmvn": [str(d), str(tmp / "out" / "cmvn.json")],
        "decode": ["--model", str(d), "--data", str(d), "--out", str(tmp / "out")],
        "export": ["--model", str(d), "--format", "torchscript", str(tmp / "out" / "m.ts")],
        "serve": ["--model", str(d)],
        "train": ["--config", "conf/tiny_ctc.yaml", "--train-data", str(d), "--out", str(tmp / "out")],
        "train-lm": ["--config", "conf/tiny_lm_lstm.yaml", "--text", str(d / "text"), "--out", str(tmp / "out")],
        "transcribe": ["--model", str(d), str(d / "a.wav")],
        "tune-fusion": ["--model", str(d), "--data", str(d), "--out", str(tmp / "out"), "--lm-weights", "0.5"],
    }[name]


def test_every_device_option_is_listed():
    """The list above is every subcommand with --device (a new one must join the test)."""
    import importlib
    import inspect

    have = [name for name, (module, _) in sorted(cli.SUBCOMMANDS.items())
            if "--device" in inspect.getsource(importlib.import_module(module)) or
            "add_device_option" in inspect.getsource(importlib.import_module(module))]
    assert have == SUBCOMMANDS_WITH_DEVICE


@pytest.mark.parametrize("name", SUBCOMMANDS_WITH_DEVICE)
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_one_line(name, device, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = cli.main([name, *_argv(name, tmp_path), "--device", device])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and err[0].startswith(f"asrkit {name}: --device {device}: no CUDA device is available"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [n for n in SUBCOMMANDS_WITH_DEVICE if n != "export"])
def test_help_states_the_one_default_rule(name, capsys):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    assert " ".join(DEVICE_HELP.split()) in " ".join(capsys.readouterr().out.split())


def test_export_says_why_its_default_is_the_cpu(capsys):
    """export computes nothing worth a GPU: its --device is where a TorchScript trace will be bound to run, so
    it stays cpu unless asked (a trace made on a GPU by default would not load on the CPU machines it goes to)."""
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    assert "default: cpu" in " ".join(capsys.readouterr().out.split())


def test_default_is_cuda_when_torch_sees_one_else_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"


def test_bad_names_and_indices_beyond_the_count(monkeypatch):
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(DeviceError, match="not a device name"):
        resolve_device("gpu0")
    with pytest.raises(DeviceError, match="cpu or cuda devices, not meta"):
        resolve_device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(DeviceError, match=r"^--device cuda:2: there are only 2 CUDA devices \(cuda:0 .. cuda:1\)$"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"^--device cuda:1: there is only 1 CUDA device \(cuda:0\)$"):
        resolve_device("cuda:1")
