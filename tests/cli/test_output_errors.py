"""Output that cannot be written is one line: an --output-dir that cannot be written is refused before any work,
and an OSError from deep inside a command (a full disk, a read-only file system) is one line naming the file."""
from __future__ import annotations

import errno
import os
import types

import pytest

import asrkit.atomic
import asrkit.cli as cli
from asrkit.atomic import check_writable_dir


def _no_model_loading(monkeypatch):
    from asrkit.pipeline import Transcriber

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the output dir was checked")

    monkeypatch.setattr(Transcriber, "from_dir", refuse)


def test_transcribe_refuses_an_output_dir_under_a_file_before_any_work(tmp_path, monkeypatch, capsys):
    _no_model_loading(monkeypatch)
    (tmp_path / "exp").mkdir()
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "subs"
    assert cli.main(["transcribe", "--model", str(tmp_path / "exp"), "--output-dir", str(out), "--format", "srt",
                     str(tmp_path / "a.wav")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asrkit transcribe: --output-dir {out}: cannot write there: "), err


def test_transcribe_refuses_a_read_only_output_dir_before_any_work(tmp_path, monkeypatch, capsys):
    """Root writes into a chmod-ed directory, so the read-only file system is simulated."""
    _no_model_loading(monkeypatch)

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(asrkit.atomic.tempfile, "mkstemp", read_only)
    (tmp_path / "exp").mkdir()
    assert cli.main(["transcribe", "--model", str(tmp_path / "exp"), "--output-dir", str(tmp_path / "subs"),
                     str(tmp_path / "a.wav")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"asrkit transcribe: --output-dir {tmp_path / 'subs'}: cannot write there: {os.strerror(errno.EROFS)}"]


def test_check_writable_dir_creates_it_and_leaves_nothing(tmp_path):
    check_writable_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir() and os.listdir(tmp_path / "a" / "b") == []


def test_an_os_error_inside_a_command_is_one_line(monkeypatch, capsys):
    def main(argv):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "exp/epoch3.pt")

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: types.SimpleNamespace(main=main))
    assert cli.main(["train", "--config", "x"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "asrkit train: [Errno 28] No space left on device: 'exp/epoch3.pt'"]


def test_other_errors_keep_their_traceback(monkeypatch):
    """Only errors of the machine (OSError with an errno) are shortened; a bug stays a traceback."""
    def main(argv):
        raise KeyError("bug")

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: types.SimpleNamespace(main=main))
    with pytest.raises(KeyError):
        cli.main(["train"])
