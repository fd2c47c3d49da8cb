"""Resuming after kill -9 mid-epoch continues the loss curve exactly as an uninterrupted run."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import torch

from asrkit.cli.train import main as train_main
from asrkit.checkpoint import CheckpointIndex, load_checkpoint
from asrkit.train.steplog import read_step_log
from trainkit import REPO, cli_args

# 8 utterances in batches of 2: 4 updates per epoch, 12 in all; a checkpoint every 3 updates and at
# each epoch end. Dropout and SpecAugment stay on (the RNG state must be restored), and a loader
# worker prefetches batches (the sampler position must be the consumed one, not the fetched one).
# Waveform augmentation of every kind is on: its draws must follow the epoch and the utterance, not the process.
SETTINGS = ["train.epochs=3", "train.save_every_steps=3", "data.num_workers=1", "train.keep_best=1",
            "augment.reverb.prob=0.5", "augment.reverb.num_rooms=4", "augment.reverb.max_order=3",
            "augment.noise.prob=0.7", "augment.noise.babble_utts=[1, 2]", "augment.band.prob=0.3",
            "augment.gain.prob=0.5", "augment.vtlp.prob=0.5"]

# Runs `asrkit train`, and SIGKILLs itself when update number KILL_AT is about to start.
KILLER = """
import os, signal, sys
from asrkit.train import trainer
kill_at, calls, update = int(sys.argv[1]), [0], trainer.Trainer._update
def killing_update(self, group):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return update(self, group)
trainer.Trainer._update = killing_update
from asrkit.cli.train import main
sys.exit(main(sys.argv[2:]))
"""


def epoch_losses(exp) -> dict:
    """epoch -> (train loss, what augmentation applied), from train.log's epoch lines."""
    found = re.findall(r"(epoch \d+): train loss ([\d.]+) .*?, augmented (\d+ utts \([a-z0-9 ,]+\))",
                       (exp / "train.log").read_text())
    return {epoch: (loss, augmented) for epoch, loss, augmented in found}


def test_kill_9_mid_epoch_then_resume_matches_an_uninterrupted_run(corpus, tmp_path):
    ref, exp = tmp_path / "ref", tmp_path / "exp"
    assert train_main(cli_args(corpus, ref, SETTINGS)) == 0

    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-c", KILLER, "8"] + cli_args(corpus, exp, SETTINGS), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    # Killed during update 8: steps 1-7 are logged, the latest checkpoint is mid-epoch 1 at step 6.
    assert len(read_step_log(str(exp / "steps.tsv"))) == 7
    index = CheckpointIndex(str(exp))
    assert index.latest == "step6.pt"
    assert load_checkpoint(exp / "step6.pt")["batches_done"] == 2

    assert train_main(cli_args(corpus, exp, SETTINGS)) == 0  # resumes by itself
    assert "resumed from" in (exp / "train.log").read_text()
    got, want = read_step_log(str(exp / "steps.tsv")), read_step_log(str(ref / "steps.tsv"))
    assert [r["step"] for r in got] == list(range(1, 13)) == [r["step"] for r in want]
    for g, w in zip(got, want):
        for key in ("loss", "lr", "grad_norm"):
            assert abs(g[key] - w[key]) <= 1e-6 * max(1.0, abs(w[key])), (g, w)
    assert epoch_losses(exp) == epoch_losses(ref)  # the interrupted epoch's totals were restored too
    assert len(epoch_losses(ref)) == 3 and all("noise" in a for _, a in epoch_losses(ref).values())
    final, final_ref = load_checkpoint(exp / "epoch2.pt")["model"], load_checkpoint(ref / "epoch2.pt")["model"]
    for name in final_ref:
        torch.testing.assert_close(final[name], final_ref[name], rtol=1e-6, atol=1e-7)
