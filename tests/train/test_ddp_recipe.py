"""Multi-process training: the mini recipe's training stage under torchrun (2 CPU processes, gloo) on data whose
batches do not divide evenly, and training from tar shards (one process, and 2 processes x 2 loader workers).
Every run must end (no rank waits for a collective the other never reaches) and leave a model that loads and
decodes. Equal batch counts per rank are also checked on the sampler itself."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import asrkit
from asrkit.data.sampler import BucketBatchSampler
from asrkit.config import load_config
from asrkit.data.shards import ShardStream, read_shard_set, write_shards
from asrkit.text.tokenizer import CharTokenizer
from trainkit import REPO, TINY, WORDS, make_data_dir

TIMEOUT = 150  # seconds: a hang fails instead of blocking CI


def clean_env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return env


def sets(extra=()) -> str:
    return " ".join(f"--set {o}" for o in list(TINY) + ["train.epochs=1", "data.max_batch_size=2"] + list(extra))


def test_sampler_gives_every_rank_the_same_number_of_batches_for_uneven_sizes():
    """Sizes and budgets that do not divide: equal counts per rank, every utterance at least once. Batches are
    split to even the count out, so nothing repeats when some batch holds two utterances; when none can (one
    utterance per batch), fewer than `ranks` single-utterance batches are repeated, never lost."""
    rng = random.Random(0)
    for _ in range(400):
        n, ranks = rng.randint(1, 40), rng.randint(2, 5)
        durs = [rng.uniform(0.2, 3.0) for _ in range(n)]
        kw = dict(max_frames=rng.choice([150, 400, 1000]), max_batch_size=rng.randint(1, 7), seed=rng.randint(0, 9))
        epoch, per_rank = rng.randint(0, 3), []
        for r in range(ranks):
            s = BucketBatchSampler(durs, num_replicas=ranks, rank=r, **kw)
            s.set_epoch(epoch)
            per_rank.append(list(s))
            assert len(s) == len(per_rank[-1])
        assert len({len(b) for b in per_rank}) == 1, (n, ranks, kw)
        seen = sorted(i for batches in per_rank for b in batches for i in b)
        assert set(seen) == set(range(n)) and len(seen) - n < ranks
        pairable = kw["max_batch_size"] >= 2 and 2 * max(round(d * 100) for d in durs) <= kw["max_frames"]
        if n >= ranks and pairable:
            assert seen == list(range(n)), (n, ranks, kw)


@pytest.fixture
def recipe_dir(tmp_path):
    """A mini-recipe work dir after stage 2 would have run: data/{train,dev} (uneven: 7 and 3 utterances of
    different lengths); the tokenizer and CMVN stats come from the recipe's own stage 2."""
    work = tmp_path / "work"
    make_data_dir(work / "data" / "train", 7, seed=1)
    make_data_dir(work / "data" / "dev", 3, seed=2)
    return work


def run_recipe_stage3_under_torchrun(work: Path, extra=()) -> subprocess.CompletedProcess:
    """recipes/mini/run.sh --stage 3 --stop-stage 3 --nproc 2: the recipe launches `asrkit train` under torchrun
    itself (the venv's `torchrun` and `asrkit` first on PATH, as `make demo` puts them)."""
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    config = str(REPO / "conf" / "tiny_ctc.yaml")
    subprocess.run([str(REPO / "recipes/mini/run.sh"), "--stage", "2", "--stop-stage", "2", "--workdir", str(work),
                    "--config", config], env=env, check=True, capture_output=True, timeout=TIMEOUT)
    return subprocess.run([str(REPO / "recipes/mini/run.sh"), "--stage", "3", "--stop-stage", "3",
                           "--workdir", str(work), "--exp", "exp/ddp", "--config", config, "--nproc", "2",
                           "--train-opts", sets(["data.num_workers=0"] + list(extra))],
                          env=env, capture_output=True, text=True, timeout=TIMEOUT)


def check_model_loads_and_decodes(exp: Path, data: Path, out: Path) -> None:
    utts = [line.split()[0] for line in (data / "wav.scp").read_text().splitlines()]
    assert callable(asrkit.load_model(str(exp)).transcribe)
    proc = subprocess.run([sys.executable, "-m", "asrkit", "decode", "--model", str(exp), "--data", str(data),
                           "--out", str(out), "--device", "cpu"], env=clean_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyps = (out / "text").read_text().splitlines()
    assert sorted(line.split(maxsplit=1)[0] for line in hyps) == sorted(utts)


def test_mini_recipe_training_stage_under_torchrun_two_processes(recipe_dir, tmp_path):
    proc = run_recipe_stage3_under_torchrun(recipe_dir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    exp = recipe_dir / "exp" / "ddp"
    log = (exp / "train.log").read_text()
    # 7 utterances in batches of <= 2: 4 batches, an even count, so 2 per rank; 1 epoch of 2 updates.
    assert "2 process(es), 2 batches per epoch per process" in log
    assert log.count("epoch 0: train loss") == 1 and "valid loss" in log
    assert (exp / "epoch0.pt").is_file()
    check_model_loads_and_decodes(exp, recipe_dir / "data" / "dev", tmp_path / "decode")


@pytest.fixture
def shard_corpus(tmp_path):
    """4 shards of 4, 4, 4 and 1 utterances: with 2 ranks x 2 workers, one shard per (rank, worker), and in batches
    of at most 2 the rank with the 1-utterance shard has 3 batches, the other 4."""
    data = make_data_dir(tmp_path / "train", 13, seed=3)
    write_shards(str(data), str(tmp_path / "shards"), utts_per_shard=4, progress=False)
    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(WORDS).save(tok)
    return {"train": data, "shards": tmp_path / "shards", "dev": make_data_dir(tmp_path / "dev", 2, seed=4),
            "tokenizer": tok}


def shard_train_args(c, out: Path, extra=()):
    args = ["--config", str(REPO / "conf/tiny_ctc.yaml"), "--train-shards", str(c["shards"]), "--out", str(out),
            "--tokenizer", str(c["tokenizer"]), "--valid-data", str(c["dev"]), "--device", "cpu"]
    return args + sets(extra).split()


def test_train_one_epoch_from_shards(shard_corpus, tmp_path):
    from asrkit.cli.train import main

    out = tmp_path / "exp"
    assert main(shard_train_args(shard_corpus, out, ["data.num_workers=0"])) == 0
    log = (out / "train.log").read_text()
    # 13 utterances in batches of at most 2 from one stream: at least 7 batches, all of them in one process.
    batches = int(log.split("1 process(es), ")[1].split()[0])
    assert 7 <= batches <= 13
    assert f"({batches} updates to step {batches}" in log
    check_model_loads_and_decodes(out, shard_corpus["dev"], tmp_path / "decode")


def test_sortagrad_with_shards_is_refused_before_training(shard_corpus, tmp_path, capsys):
    from asrkit.cli.train import main

    assert main(shard_train_args(shard_corpus, tmp_path / "exp", ["data.num_workers=0",
                                                                   "data.sortagrad_epochs=1"])) != 0
    err = capsys.readouterr().err
    assert f"data.sortagrad_epochs: {shard_corpus['shards']}: tar shards are streamed" in err
    assert not (tmp_path / "exp" / "epoch0.pt").exists()


def test_train_from_uneven_shards_under_torchrun_two_processes_two_workers(shard_corpus, tmp_path):
    """The rank with fewer batches pads its epoch with empty ones, and the run ends with as many updates as the
    other rank has batches."""
    out = tmp_path / "exp"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "asrkit", "train"] + shard_train_args(shard_corpus, out, ["data.num_workers=2"]),
                          cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out / "train.log").read_text()
    batches = int(log.split("2 process(es), ")[1].split()[0])
    assert f"({batches} updates to step {batches}" in log
    # The plan of the run (every utterance is usable): the ranks' batch counts differ, the longer one sets the steps.
    cfg = load_config(str(REPO / "conf/tiny_ctc.yaml"), list(TINY) + ["data.max_batch_size=2"])
    shard_set = read_shard_set(str(shard_corpus["shards"]))
    plan = ShardStream(shard_set, [[1]] * 13, [True] * 13, sample_rate=16000, max_frames=cfg.data.max_frames,
                       max_batch_size=2, bucket_width=cfg.data.bucket_width, buffer_size=cfg.data.shard_buffer,
                       seed=cfg.train.seed, rank=0, world_size=2, num_workers=2)
    plan.set_epoch(0)
    assert sorted(plan.batches_per_rank) == [3, 4] and batches == 4
    check_model_loads_and_decodes(out, shard_corpus["dev"], tmp_path / "decode")
