"""Two CPU processes (torchrun, gloo) take the same update as one process over both ranks' batches."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asrkit.train.steplog import read_step_log
from asrkit.train.trainer import train
from trainkit import EXACT, REPO, cli_args, first_moment, tiny_config


def test_two_gloo_processes_average_gradients_like_one_big_batch(equal_lengths, tmp_path):
    """Waveform augmentation on (a gain and a VTLP warp for every utterance, drawn from the utterance id, so one
    process and two draw the same): the gradients still match, and train.log counts both ranks' utterances."""
    one, two = tmp_path / "one", tmp_path / "two"
    augment = ["augment.gain.prob=1", "augment.vtlp.prob=1"]
    train(tiny_config(EXACT + augment + ["data.max_batch_size=4"]), str(one), str(equal_lengths["train"]), None,
          str(equal_lengths["tokenizer"]), device="cpu")
    # With batches of at most 3, the 4 utterances split 3 + 1: one batch per rank, so the ranks'
    # losses must be weighted 3/4 and 1/4 (plain DDP averaging would give 1/2 and 1/2).
    args = cli_args(equal_lengths, two, EXACT + augment + ["data.max_batch_size=3"], valid=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "asrkit", "train"] + args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (two / "train.log").read_text()
    assert "2 process(es), 1 batches per epoch per process" in log
    assert log.count("epoch 0: train loss") == 1  # only rank 0 logs
    # the epoch's counts are both ranks' (3 + 1 utterances), as in one process
    assert "augmented 4 utts (gain 4, vtlp 4)" in (one / "train.log").read_text()
    assert "augmented 4 utts (gain 4, vtlp 4)" in log

    big, ddp = first_moment(one), first_moment(two)
    for k in big:
        assert float((ddp[k] - big[k]).norm()) <= 1e-5 * float(big[k].norm()) + 1e-9, k
    loss_one = read_step_log(str(one / "steps.tsv"))[0]["loss"]
    assert read_step_log(str(two / "steps.tsv"))[0]["loss"] == pytest.approx(loss_one, rel=1e-6)


THREADS_AFTER = """
import os, sys
from asrkit.cli.train import main
rc = main(sys.argv[1:])
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
# one file per rank: the ranks' prints share torchrun's stdout and can interleave mid-line
with open(os.path.join(os.environ["THREADS_DIR"], "rank" + os.environ["RANK"]), "w") as fh:
    fh.write(repr(sorted(n for n in names if "gloo" in n)))
sys.exit(rc)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists threads through /proc")
def test_no_gloo_thread_outlives_a_distributed_run(equal_lengths, tmp_path):
    """Issue 28 item 7: gloo's threads (gloo_tcp_loop, pt_gloo_runloop) left running after destroy_process_group
    were torn down at interpreter exit while the peer closed its sockets, and a rank aborted ("terminate called
    without an active exception"). When asrkit train returns, its process group is gone with its threads.
    One utterance is unreadable, in rank 1's batch (batches of 2, one per rank): train.log, which rank 0 writes,
    counts it (the epoch line sums the ranks')."""
    (equal_lengths["train"] / "eq_001.wav").write_bytes(b"RIFF not really a wav file" * 10)
    script = tmp_path / "train_then_list_threads.py"
    script.write_text(THREADS_AFTER)
    args = cli_args(equal_lengths, tmp_path / "exp", EXACT + ["data.max_batch_size=2"], valid=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "THREADS_DIR": str(tmp_path)}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)] + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = {r: (tmp_path / f"rank{r}").read_text() for r in (0, 1)}
    assert left == {0: "[]", 1: "[]"}, left
    assert "1 unreadable utts skipped" in (tmp_path / "exp" / "train.log").read_text()
