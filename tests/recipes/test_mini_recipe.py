"""recipes/mini/run.sh end to end at toy size: synthesis -> tokenizer/CMVN -> train -> LM -> tuning on dev -> decode
(greedy, LM) -> score."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asrkit.config import load_decode_config
from asrkit.data.table import read_table

REPO = Path(__file__).resolve().parents[2]
TINY_TRAIN = ("--set train.epochs=1 --set model.encoder.d_model=32 --set model.encoder.num_heads=2 "
              "--set model.encoder.ffn_dim=64 --set model.encoder.num_layers=1 --set data.num_workers=0")


def test_mini_recipe_runs_every_stage(tmp_path):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    cmd = ["bash", str(REPO / "recipes" / "mini" / "run.sh"), "--workdir", str(tmp_path), "--num-train", "8",
           "--num-dev", "2", "--num-test", "2", "--num-test-unseen", "2", "--jobs", "1", "--train-opts", TINY_TRAIN,
           "--lm-config", str(REPO / "conf" / "tiny_lm_lstm.yaml"), "--lm-opts", "--set train.epochs=1"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for stage in range(8):
        assert f"[stage {stage}]" in run.stdout
    assert "validating data/test_unseen" in run.stdout and len(read_table(tmp_path / "data/test_unseen/text")) == 2
    assert "decode_test: %WER" in run.stdout and "decode_test_lm: %WER" in run.stdout
    exp = tmp_path / "exp" / "tiny_ctc"
    refs = read_table(tmp_path / "data" / "test" / "text")
    for d in ("decode_test", "decode_test_lm"):
        assert set(read_table(exp / d / "text")) == set(refs)
    used = load_decode_config(exp / "decode_test_lm" / "decode.yaml")
    assert used == load_decode_config(exp / "tune_dev" / "decode.yaml")  # the setting chosen on dev
    # the LM path is written absolute: the decode.yaml works from any directory
    assert used.mode == "ctc_prefix" and used.lm == str(tmp_path / "exp" / "lm_lstm") and used.lm_weight in (0.4, 0.8, 1.2)
    assert len((exp / "tune_dev" / "results.tsv").read_text().splitlines()) == 1 + 3 * 2
    assert (tmp_path / "exp" / "lm_lstm" / "model.pt").is_file()

    # a stage re-runs on its own (restartable), in the same work dir
    again = subprocess.run(cmd + ["--stage", "7"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "[stage 6]" not in again.stdout and "decode_test_lm: %WER" in again.stdout
