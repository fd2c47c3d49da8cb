"""The run-directory lock: a live holder refuses a second run with a message naming it, a released or killed
holder's lock is taken, and asrkit train / decode take it on their output dirs (issue 28 item 18)."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asrkit.rundir_lock import LOCK_FILE, RunDirBusy, RunDirLock

REPO = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; from asrkit.rundir_lock import RunDirLock; lock = RunDirLock(sys.argv[1]); "
        "lock.acquire(); print('held', flush=True); time.sleep(60)")


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/out (killed at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    first = RunDirLock(tmp_path / "run")
    with first:
        assert (tmp_path / "run").is_dir()
        with pytest.raises(RunDirBusy) as err:
            RunDirLock(tmp_path / "run").acquire()  # another open file: refused even in one process
        msg = str(err.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg and "\n" not in msg
        assert str(tmp_path / "run" / LOCK_FILE) in msg
    assert not (tmp_path / "run").exists()  # created by the lock, nothing written: removed again
    (tmp_path / "kept").mkdir()
    with RunDirLock(tmp_path / "kept"):
        (tmp_path / "kept" / "text").write_text("x")
    with RunDirLock(tmp_path / "kept"):  # released: the next run takes it
        pass
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["text"]  # the lock file went with its holder


def test_a_disabled_lock_takes_nothing(tmp_path):
    with RunDirLock(tmp_path / "a") as outer, RunDirLock(tmp_path / "a", enabled=False):
        assert outer.enabled
    assert not (tmp_path / "a").exists()


def test_another_process_holds_it_until_killed_then_it_is_reclaimed(tmp_path, holder, caplog):
    with pytest.raises(RunDirBusy, match=f"pid {holder.pid} on host .*: -c {tmp_path / 'out'}\\)"):
        RunDirLock(tmp_path / "out").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "out" / LOCK_FILE).read_text().startswith(f"pid {holder.pid} ")  # left behind: stale
    with caplog.at_level(logging.INFO, logger="asrkit"), RunDirLock(tmp_path / "out"):
        assert (tmp_path / "out" / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")
    assert f"reclaimed the stale lock of pid {holder.pid}" in caplog.text


def test_a_lock_file_the_holder_removed_after_another_opened_it_is_not_taken(tmp_path, monkeypatch):
    """The release race: B opens the file, A removes it and lets go, B's flock succeeds on a file no longer at
    the path. B must lock the file that is there now (else a third run C could hold a lock beside it)."""
    import asrkit.rundir_lock as mod

    a = RunDirLock(tmp_path)
    a.acquire()
    real_flock, calls = mod.fcntl.flock, []

    def flock_after_release(fd, op):
        if not calls:
            a.release()  # between B's open and B's flock
        calls.append(fd)
        return real_flock(fd, op)

    monkeypatch.setattr(mod.fcntl, "flock", flock_after_release)
    with RunDirLock(tmp_path):
        assert len(calls) == 2  # the first file was gone: locked the new one
        assert os.path.samestat(os.fstat(calls[1]), os.stat(tmp_path / LOCK_FILE))


def test_train_into_a_directory_another_run_holds_is_refused_before_writing(tmp_path, holder, capsys):
    sys.path.insert(0, str(REPO / "tests" / "train"))
    from asrkit.cli.train import main
    from asrkit.text.tokenizer import CharTokenizer
    from trainkit import WORDS, cli_args, make_data_dir

    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(WORDS).save(tok)
    data = {"train": make_data_dir(tmp_path / "train", 2, seed=1), "tokenizer": tok}
    assert main(cli_args(data, tmp_path / "out", ["train.epochs=1"], valid=False)) == 2
    err = capsys.readouterr().err
    assert f"is in use by another run (pid {holder.pid} on host" in err and err.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_FILE]  # no config.yaml, no weights


def test_decode_into_a_directory_another_run_holds_is_refused_before_writing(tmp_path, holder, capsys):
    sys.path.insert(0, str(REPO / "tests" / "train"))
    from asrkit.cli.decode import main
    from asrkit.cli.train import main as train_main
    from asrkit.text.tokenizer import CharTokenizer
    from trainkit import WORDS, cli_args, make_data_dir

    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(WORDS).save(tok)
    data = {"train": make_data_dir(tmp_path / "train", 2, seed=1), "tokenizer": tok}
    assert train_main(cli_args(data, tmp_path / "exp", ["train.epochs=1"], valid=False)) == 0
    capsys.readouterr()
    assert main(["--model", str(tmp_path / "exp"), "--data", str(data["train"]), "--out", str(tmp_path / "out"),
                 "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert f"is in use by another run (pid {holder.pid} on host" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_FILE]  # no decode.yaml, no text
    assert main(["--model", str(tmp_path / "exp"), "--data", str(data["train"]), "--out", str(tmp_path / "own"),
                 "--device", "cpu"]) == 0
    assert sorted(p.name for p in (tmp_path / "own").iterdir()) == ["decode.yaml", "text"]  # lock file gone


def test_a_file_system_without_locks_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
    import errno

    import asrkit.rundir_lock as mod

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(mod.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="asrkit"), RunDirLock(tmp_path / "d"):
        (tmp_path / "d" / "text").write_text("x")
    assert "cannot lock .asrkit.lock (No locks available): a second run" in caplog.text
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["text"]
