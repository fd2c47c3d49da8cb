import importlib

import pytest

import asrkit.cli as cli


def test_help_lists_every_subcommand_and_each_has_a_main(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (module, _) in cli.SUBCOMMANDS.items():
        assert f"  {name} " in out
        assert callable(importlib.import_module(module).main)


def test_unknown_command(capsys):
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_subcommand_help_exits_cleanly():
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--help"])
    assert exc.value.code == 0


def test_cpu_only_torch_with_cuda_torchaudio_gives_one_clear_line(monkeypatch, capsys):
    def broken(name):
        raise OSError("libc10_cuda.so: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    assert cli.main(["decode", "--help"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchaudio cannot load" in err[0] and "pip install" in err[0]


def test_reader_closing_the_pipe_stops_quietly(tmp_path):
    """`asrkit score ... | head -n 1`: no BrokenPipeError traceback; the exit status is SIGPIPE's (141)."""
    import subprocess
    import sys

    ref = tmp_path / "ref"
    ref.write_text("".join(f"u{i} A B C\n" for i in range(3)))
    proc = subprocess.Popen([sys.executable, "-m", "asrkit", "score", "--ref", str(ref), "--hyp", str(ref),
                             "--out", str(tmp_path / "sc")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err
