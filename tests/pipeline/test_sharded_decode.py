"""Sharded decoding: ``asrkit decode --nj N`` and torchrun give the same files as one process; finished shards
are kept and reused; a failed shard is named with its log; a corrupt wav is listed in OUT/failed.

The model is an untrained tiny CTC model (its greedy output is deterministic and not empty on tones), the data
9 utterances: 8 tones of 0.4 to 1.45 s and one corrupt wav.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrkit.cli import main
from asrkit.config import DecodeConfig
from asrkit.data.datadir import DataDirError, read_data_dir
from asrkit.data.split import balanced_ranges, split_data_dir
from asrkit.data.table import read_table
from asrkit.pipeline.sharded import DecodeJob, Shard, decode_sharded, die_with_parent, merge_shards, plan_shards
from tests.pipeline.tiny_exp import make_tiny_exp

REPO = Path(__file__).resolve().parents[2]
DURATIONS = [0.4 + 0.15 * i for i in range(8)]  # utt0 .. utt7


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(exp dir, data dir, reference output dir of a plain one-process decode)."""
    root = tmp_path_factory.mktemp("sharded")
    exp = make_tiny_exp(root / "exp")

    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    wav = {}
    for i, dur in enumerate(DURATIONS):
        t = np.arange(int(16000 * dur)) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.05 * rng.standard_normal(t.size)
        sf.write(data / f"u{i}.wav", x.astype(np.float32), 16000)
        wav[f"utt{i}"] = str(data / f"u{i}.wav")
    (data / "bad.wav").write_bytes(b"RIFF, but not a wav file")
    wav["utt3b"] = str(data / "bad.wav")
    (data / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(wav.items())))
    (data / "utt2spk").write_text("".join(f"{k} {k}\n" for k in sorted(wav)))

    ref = root / "nj1"
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(ref), "--batch-size", "1"]) == 0
    hyps = read_table(ref / "text")
    assert set(hyps) == {f"utt{i}" for i in range(8)}
    assert sum(len(h) for h in hyps.values()) > 8  # the untrained model says something: the comparisons can fail
    return exp, data, ref


def _args(exp, data, out, *more):
    return ["decode", "--model", str(exp), "--data", str(data), "--out", str(out), "--batch-size", "1", *more]


def _same_files(a: Path, b: Path) -> None:
    for name in ("text", "failed", "decode.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_corrupt_wav_is_listed_in_failed_and_the_rest_decoded(setup):
    _, _, ref = setup
    failed = read_table(ref / "failed")
    assert list(failed) == ["utt3b"] and "bad.wav" in failed["utt3b"]


def test_nj2_equals_nj1_and_a_rerun_decodes_only_what_is_missing(setup, tmp_path, capsys):
    exp, data, ref = setup
    out = tmp_path / "nj2"
    assert main(_args(exp, data, out, "--nj", "2")) == 0
    _same_files(out, ref)
    shards = [out / "split2" / "1", out / "split2" / "2"]
    for k, s in enumerate(shards, 1):
        done = json.loads((s / ".done").read_text())
        assert done["utterances"] == len(read_table(s / "wav.scp"))
        assert (out / "log" / f"decode.{k}.log").read_text().startswith(f"# shard {k} of 2")
    # balanced by duration (the corrupt utt counts as the mean): utt0..utt4 (4.43 s) | utt5..utt7 (3.9 s)
    assert list(read_table(shards[0] / "wav.scp")) == ["utt0", "utt1", "utt2", "utt3", "utt3b", "utt4"]

    # The same command again: nothing to decode.
    logs = {k: (out / "log" / f"decode.{k}.log").stat().st_mtime_ns for k in (1, 2)}
    text_1 = (shards[0] / "decode" / "text").stat().st_mtime_ns
    assert main(_args(exp, data, out, "--nj", "2")) == 0
    assert {k: (out / "log" / f"decode.{k}.log").stat().st_mtime_ns for k in (1, 2)} == logs
    _same_files(out, ref)

    # Shard 2 interrupted (no marker), and its output dir cannot be created: the command fails naming shard 2
    # and its log, keeps shard 1, and writes no merge.
    (shards[1] / ".done").unlink()
    (out / "text").unlink()
    blocker = shards[1] / "decode"
    for f in blocker.iterdir():
        f.unlink()
    blocker.rmdir()
    blocker.write_text("not a directory\n")
    capsys.readouterr()
    assert main(_args(exp, data, out, "--nj", "2")) == 1
    err = capsys.readouterr().err
    assert "shard 2 " in err and str(out / "log" / "decode.2.log") in err and "shard 1 " not in err
    assert "Traceback" in (out / "log" / "decode.2.log").read_text()
    assert (shards[0] / ".done").is_file() and not (shards[1] / ".done").exists() and not (out / "text").exists()

    # Fixed: the rerun decodes shard 2 only (shard 1's log and text untouched) and the merge equals nj 1.
    blocker.unlink()
    assert main(_args(exp, data, out, "--nj", "2")) == 0
    assert (out / "log" / "decode.1.log").stat().st_mtime_ns == logs[1]
    assert (shards[0] / "decode" / "text").stat().st_mtime_ns == text_1
    assert (out / "log" / "decode.2.log").stat().st_mtime_ns != logs[2]
    assert (shards[1] / ".done").is_file()
    _same_files(out, ref)


def test_fingerprints_follow_the_settings_and_each_shards_data(setup, tmp_path):
    exp, data, _ = setup
    job = DecodeJob(str(exp), DecodeConfig())
    a = [s for s, _ in plan_shards(job, str(data), str(tmp_path), 2)]
    assert [s for s, _ in plan_shards(job, str(data), str(tmp_path), 2)] == a  # deterministic
    other = [s for s, _ in plan_shards(DecodeJob(str(exp), DecodeConfig(batch_size=3)), str(data), str(tmp_path), 2)]
    assert all(x.fingerprint != y.fingerprint for x, y in zip(a, other))
    other = [s for s, _ in plan_shards(DecodeJob(str(exp), DecodeConfig(), max_seconds=2.0), str(data), str(tmp_path),
                                       2)]
    assert all(x.fingerprint != y.fingerprint for x, y in zip(a, other))  # long utterances decode differently
    # one recording of shard 2 moves: only shard 2's fingerprint changes
    moved = tmp_path / "data"
    moved.mkdir()
    wav = read_table(data / "wav.scp")
    os.symlink(wav["utt7"], moved / "u7.wav")  # the same audio under another path
    wav["utt7"] = str(moved / "u7.wav")
    (moved / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(wav.items())))
    b = [s for s, _ in plan_shards(job, str(moved), str(tmp_path), 2)]
    assert b[0].fingerprint == a[0].fingerprint and b[1].fingerprint != a[1].fingerprint


def test_balanced_ranges_against_a_reference_property():
    rnd = random.Random(0)
    for trial in range(200):
        m = rnd.randint(1, 40)
        n = rnd.randint(1, m)
        utts = [f"u{i:03d}" for i in range(m)]
        dur = {u: rnd.uniform(0.1, 20.0) for u in utts}
        ranges = balanced_ranges(utts, dur, n)
        assert len(ranges) == n and all(ranges) and [u for r in ranges for u in r] == utts
        if n <= m // 4:  # no shard forced to a single utterance: each total is within one utterance of the share
            total, longest = sum(dur.values()), max(dur.values())
            for r in ranges:
                assert abs(sum(dur[u] for u in r) - total / n) <= longest + 1e-9, (trial, n, m)
    assert balanced_ranges(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, 3) == [["a"], ["b"], ["c"]]
    with pytest.raises(DataDirError, match="3 utterances into 4"):
        balanced_ranges(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, 4)


def test_split_keeps_every_table_of_each_shard(setup):
    _, data, _ = setup
    dd = read_data_dir(data)
    subs = split_data_dir(dd, 3)
    assert [u for s in subs for u in s.all_utts()] == dd.all_utts()
    for s in subs:
        assert set(s.utt2spk) == set(s.wav_scp) == set(s.all_utts())
    with pytest.raises(DataDirError, match="9 utterances into 10"):
        split_data_dir(dd, 10)


def test_nj_under_torchrun_must_match_the_world_size(setup, tmp_path, monkeypatch, capsys):
    exp, data, _ = setup
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit):
        main(_args(exp, data, tmp_path / "x", "--nj", "3"))
    assert "WORLD_SIZE 2" in capsys.readouterr().err


def test_torchrun_two_ranks_equal_one_process(setup, tmp_path):
    exp, data, ref = setup
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = tmp_path / "torchrun"
    try:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               "-m", "asrkit"] + _args(exp, data, out), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("torchrun did not finish in 120 s on this machine")
    if proc.returncode != 0 and "rendezvous" in proc.stderr.lower() and not (out / "split2").exists():
        pytest.skip(f"torchrun cannot start here: {proc.stderr[-500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _same_files(out, ref)
    assert sorted(os.listdir(out / "log")) == ["decode.1.log", "decode.2.log"]


def test_merge_puts_text_nbest_and_failed_in_utterance_order(tmp_path):
    """Shards' N-best lines interleave by utterance id after the merge; a stale OUT/failed is removed."""
    shards = []
    lines = {1: [("a", 1, "X"), ("a", 2, "Y"), ("c", 1, "Z")], 2: [("b", 1, "P"), ("d", 1, "Q"), ("d", 2, "R")]}
    for k in (1, 2):
        s = Shard(k, 2, str(tmp_path / "split2" / str(k)), str(tmp_path / "log" / f"decode.{k}.log"), 2, "fp")
        os.makedirs(s.out_dir)
        (Path(s.out_dir) / "decode.yaml").write_text("mode: greedy\n")
        (Path(s.out_dir) / "text").write_text("".join(f"{u} {t}\n" for u, r, t in lines[k] if r == 1))
        (Path(s.out_dir) / "nbest.jsonl").write_text(
            "".join(json.dumps({"utt": u, "rank": r, "text": t}) + "\n" for u, r, t in lines[k]))
        shards.append(s)
    out = tmp_path / "out"
    out.mkdir()
    (out / "failed").write_text("old stale\n")
    assert merge_shards(shards, str(out)) == {"decoded": 4, "failed": 0}
    assert (out / "text").read_text() == "a X\nb P\nc Z\nd Q\n"
    merged = [json.loads(line) for line in (out / "nbest.jsonl").read_text().splitlines()]
    assert [(m["utt"], m["rank"]) for m in merged] == sorted((u, r) for k in lines for u, r, _ in lines[k])
    assert not (out / "failed").exists() and (out / "decode.yaml").read_text() == "mode: greedy\n"


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (one whose parent died is reaped by init, or waits as Z)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _decode_nj2(job: DecodeJob, data: str, out: str) -> None:
    """The parent of the shards' processes: ``asrkit decode --nj 2`` without the interpreter's start-up."""
    os.setpgrp()  # its own group, so that the test can end whatever is left of it
    decode_sharded(job, data, out, 2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_parent_ends_its_shard_processes(setup, tmp_path):
    """The shard processes die with the parent (``asrkit decode --nj 2``) when it is killed with SIGKILL (no
    handler runs), instead of decoding on as orphans beside the rerun. Each shard's audio comes from a pipe that
    sleeps, so that the shards are surely still running when the parent is killed."""
    import multiprocessing as mp

    exp, data, _ = setup
    wav = read_table(data / "wav.scp")
    slow = tmp_path / "data"
    slow.mkdir()
    (slow / "wav.scp").write_text("".join(f"{u} sleep 120; cat {wav[u]} |\n" for u in ("utt0", "utt1")))
    (slow / "utt2spk").write_text("utt0 utt0\nutt1 utt1\n")
    (slow / "utt2dur").write_text("utt0 0.4\nutt1 0.55\n")  # the split reads no audio
    out = tmp_path / "out"
    parent = mp.get_context("fork").Process(target=_decode_nj2, args=(DecodeJob(str(exp), DecodeConfig()),
                                                                      str(slow), str(out)))
    parent.start()
    try:
        pids: dict = {}
        deadline = time.monotonic() + 120
        while len(pids) < 2:
            assert parent.is_alive() and time.monotonic() < deadline, "the shards did not start"
            for k in (1, 2):
                log = out / "log" / f"decode.{k}.log"
                found = re.search(r", pid (\d+)$", log.read_text(), re.M) if log.is_file() else None
                if found:
                    pids[k] = int(found.group(1))
            time.sleep(0.05)
        assert all(_alive(p) for p in pids.values())
        os.kill(parent.pid, signal.SIGKILL)
        parent.join()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [k for k, p in pids.items() if _alive(p)], "shard processes outlived their parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)  # whatever is left of its group: orphans, the pipes' sleeps
        parent.join()


def _middle(platform: str, pid_file: str) -> None:
    """A parent whose child arms die_with_parent (with ``sys.platform`` as given) and then waits forever."""
    child = os.fork()
    if child == 0:
        sys.platform = platform  # "darwin": the polling thread instead of PR_SET_PDEATHSIG
        die_with_parent(os.getppid())
        with open(pid_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        while True:
            time.sleep(1)
    time.sleep(120)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_die_with_parent_by_signal_and_by_polling(platform, tmp_path):
    import multiprocessing as mp

    pid_file = str(tmp_path / "child.pid")
    middle = mp.get_context("fork").Process(target=_middle, args=(platform, pid_file))
    middle.start()
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(pid_file):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        child = int(Path(pid_file).read_text())
        assert _alive(child)
        os.kill(middle.pid, signal.SIGKILL)
        middle.join()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(child)
    finally:
        middle.kill()
        middle.join()
        if os.path.exists(pid_file):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(Path(pid_file).read_text()), signal.SIGKILL)
