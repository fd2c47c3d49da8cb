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
    one, two = tmp_path / "one", tmp_path / "two"
    train(tiny_config(EXACT + ["data.max_batch_size=4"]), str(one), str(equal_lengths["train"]), None,
          str(equal_lengths["tokenizer"]), device="cpu")
    # With batches of at most 3, the 4 utterances split 3 + 1: one batch per rank, so the ranks'
    # losses must be weighted 3/4 and 1/4 (plain DDP averaging would give 1/2 and 1/2).
    args = cli_args(equal_lengths, two, EXACT + ["data.max_batch_size=3"], valid=False)
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

    big, ddp = first_moment(one), first_moment(two)
    for k in big:
        assert float((ddp[k] - big[k]).norm()) <= 1e-5 * float(big[k].norm()) + 1e-9, k
    loss_one = read_step_log(str(one / "steps.tsv"))[0]["loss"]
    assert read_step_log(str(two / "steps.tsv"))[0]["loss"] == pytest.approx(loss_one, rel=1e-6)
