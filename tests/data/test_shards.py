"""Tar shards: written faithfully (checked with the standard tarfile module and soundfile), planned so every
utterance is read exactly once per epoch by one (rank, worker) pair, equal batch counts per rank, resume."""
from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import soundfile as sf

from asrkit.data.sampler import FRAMES_PER_SECOND
from asrkit.data.shards import (ShardError, ShardStream, assign_shards, read_shard_set, round_robin_skips,
                                write_shards)
from asrkit.data.table import write_table
from asrkit.extras import MissingExtraError
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
SR = 16000


def make_dir(root: Path, n: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """A Kaldi dir of ``n`` noise utterances of 0.2-1.5 s (ids with a dot, to test keying); returns the audio."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    audio, scp, text = {}, {}, {}
    for i in range(n):
        utt = f"spk{i % 3}.utt{i:03d}"
        x = (0.2 * rng.standard_normal(int(rng.uniform(0.2, 1.5) * SR))).astype(np.float32)
        sf.write(root / f"{i}.wav", x, SR, subtype="PCM_16")
        audio[utt], _ = sf.read(root / f"{i}.wav", dtype="float32")
        scp[utt], text[utt] = str(root / f"{i}.wav"), f"WORD{i} X"
    write_table(root / "wav.scp", scp)
    write_table(root / "text", text)
    return audio


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    audio = make_dir(root / "data", 23)
    write_shards(str(root / "data"), str(root / "out"), utts_per_shard=4, progress=False)  # 6 shards: 5 x 4 + 3
    return {"dir": root / "out", "audio": audio, "data": root / "data"}


def stream(shard_dir: Path, rank: int, world: int, workers: int, keep=None, **kw) -> ShardStream:
    s = read_shard_set(str(shard_dir))
    n = sum(len(x.entries) for x in s.shards)
    opts = dict(sample_rate=SR, max_frames=300, max_batch_size=3, bucket_width=0.2, buffer_size=5, seed=7)
    opts.update(kw)
    return ShardStream(s, [[1, 2]] * n, keep or [True] * n, rank=rank, world_size=world, num_workers=workers,
                       **opts)


def read_epoch(shard_dir: Path, rank: int, world: int, workers: int, epoch: int, skip: int = 0, **kw) -> List[list]:
    """Batches (lists of utt ids) one rank's ShardLoader yields, read by a real DataLoader with ``workers``."""
    from asrkit.train.loader import ShardLoader

    st = stream(shard_dir, rank, world, workers, **kw)
    loader = ShardLoader(st, workers, False, seed=0)
    if skip:
        loader.batch_sampler.load_state_dict({"epoch": epoch, "batches_consumed": skip, "seed": 7,
                                              "num_replicas": world, "num_workers": max(workers, 1)})
    loader.batch_sampler.set_epoch(epoch)
    batches = [list(b["utts"]) for b in loader]
    assert len(batches) == len(loader.batch_sampler)
    return batches


def test_shards_hold_the_data_dir_faithfully(shards):
    """Read with the standard library's tarfile, not WebDataset: FLAC audio within 16-bit rounding, texts, ids."""
    index = json.loads((shards["dir"] / "shards.json").read_text())
    assert [len(s["utts"]) for s in index["shards"]] == [4, 4, 4, 4, 4, 3]
    seen = {}
    for s in index["shards"]:
        with tarfile.open(shards["dir"] / s["name"]) as tar:
            names = tar.getnames()
            assert names == [f"{k}.{ext}" for k, *_ in s["utts"] for ext in ("flac", "json")]
            for key, utt, samples, text in s["utts"]:
                meta = json.loads(tar.extractfile(f"{key}.json").read())
                assert meta == {"utt": utt, "text": text}
                wav, rate = sf.read(io.BytesIO(tar.extractfile(f"{key}.flac").read()), dtype="float32")
                assert rate == SR and len(wav) == samples
                seen[utt] = (wav, text)
    assert set(seen) == set(shards["audio"])
    for utt, ref in shards["audio"].items():
        np.testing.assert_allclose(seen[utt][0], ref, atol=1 / 32768 + 1e-7)
        assert seen[utt][1] == f"WORD{int(utt[-3:])} X"


@pytest.mark.parametrize("num_shards,world,workers", [(6, 2, 2), (7, 2, 2), (5, 3, 2), (9, 4, 3), (2, 2, 4)])
def test_each_shard_goes_to_exactly_one_rank_and_worker(num_shards, world, workers):
    for epoch in range(3):
        plan = assign_shards(num_shards, epoch, seed=1, world_size=world, num_workers=workers)
        flat = [s for rank in plan for worker in rank for s in worker]
        assert sorted(flat) == list(range(num_shards))
        sizes = [sum(len(w) for w in rank) for rank in plan]
        assert max(sizes) - min(sizes) <= 1
    assert assign_shards(9, 0, 1, 2, 2) != assign_shards(9, 1, 1, 2, 2)  # reshuffled per epoch


def test_round_robin_skips_match_a_simulated_loader():
    rng = random.Random(0)
    for _ in range(200):
        counts = [rng.randint(0, 6) for _ in range(rng.randint(1, 4))]
        order = []  # reference: the worker of each batch as a DataLoader takes them in turn
        for r in range(max(counts, default=0)):
            order += [w for w, c in enumerate(counts) if r < c]
        k = rng.randint(0, len(order) + 2)
        skips, first = round_robin_skips(counts, k)
        assert skips == [order[:k].count(w) for w in range(len(counts))]
        if 0 < k < len(order):  # the rest, taken in turn from worker `first` on, is what the loader would give
            left = [c - s for c, s in zip(counts, skips)]
            rest = []
            for r in range(max(left)):
                rest += [(first + i) % len(counts) for i in range(len(counts)) if r < left[(first + i) % len(counts)]]
            assert rest == order[k:]


@pytest.mark.parametrize("world,workers", [(2, 2), (3, 2), (2, 0)])
def test_one_epoch_reads_every_utterance_once_with_equal_batches_per_rank(shards, world, workers):
    """6 shards over 2 ranks x 2 workers (and 3 x 2: uneven; 2 x main process): the union of all ranks' batches is
    the data dir, each utterance once; every rank yields the same number of batches (padding with empty ones)."""
    frames = {u: max(1, round(len(a) / SR * FRAMES_PER_SECOND)) for u, a in shards["audio"].items()}
    for epoch in (0, 1):
        per_rank = [read_epoch(shards["dir"], r, world, workers, epoch) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1
        utts = [u for batches in per_rank for b in batches for u in b]
        assert sorted(utts) == sorted(shards["audio"])
        for batches in per_rank:
            for b in batches:
                assert len(b) <= 3
                assert not b or len(b) * max(frames[u] for u in b) <= 300 or len(b) == 1
        assert sum(not b for batches in per_rank for b in batches) == (
            max(map(len, per_rank)) * world - sum(sum(1 for b in batches if b) for batches in per_rank))
    assert read_epoch(shards["dir"], 0, world, workers, 0) != read_epoch(shards["dir"], 0, world, workers, 1)


def test_left_out_utterances_are_not_read(shards):
    keep = [i % 4 != 0 for i in range(23)]
    st = stream(shards["dir"], 0, 1, 0, keep=keep)
    st.set_epoch(0)
    got = sorted(u for b in st for u in b["utts"])
    entries = [e.utt for s in st.shard_set.shards for e in s.entries]
    assert got == sorted(u for u, k in zip(entries, keep) if k)


def test_batches_carry_audio_and_tokens(shards):
    st = stream(shards["dir"], 0, 1, 0)
    st.set_epoch(0)
    batch = next(iter(st))
    for b, utt in enumerate(batch["utts"]):
        n = int(batch["wav_lens"][b])
        np.testing.assert_allclose(batch["wav"][b, :n].numpy(), shards["audio"][utt], atol=1 / 32768 + 1e-7)
        assert batch["tokens"][b].tolist() == [1, 2] and batch["texts"][b] == f"WORD{int(utt[-3:])} X"


@pytest.mark.parametrize("skip", [1, 2, 3, 6])
def test_resume_mid_epoch_continues_with_the_next_batch(shards, skip):
    full = read_epoch(shards["dir"], 1, 2, 2, epoch=1)
    assert read_epoch(shards["dir"], 1, 2, 2, epoch=1, skip=skip) == full[skip:]


def test_brace_pattern_selects_shards_and_errors_name_the_problem(shards, tmp_path):
    two = read_shard_set(str(shards["dir"] / "shard-{000001..000002}.tar"))
    assert [Path(s.url).name for s in two.shards] == ["shard-000001.tar", "shard-000002.tar"]
    with pytest.raises(ShardError, match="shard-000009.tar"):
        read_shard_set(str(shards["dir"] / "shard-{000008..000009}.tar"))
    with pytest.raises(ShardError, match="no shard index"):
        read_shard_set(str(tmp_path))
    with pytest.raises(ShardError, match="2 shards for 3 processes"):
        ShardStream(two, [[1]] * 8, [True] * 8, sample_rate=SR, max_frames=300, max_batch_size=3, bucket_width=0.2,
            buffer_size=5, seed=0, rank=0, world_size=3, num_workers=0)


def test_a_shard_missing_an_indexed_utterance_is_an_error_naming_it(shards, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    index = json.loads((shards["dir"] / "shards.json").read_text())
    index["shards"] = index["shards"][:1]
    (bad / "shards.json").write_text(json.dumps(index))
    with tarfile.open(shards["dir"] / "shard-000000.tar") as src, tarfile.open(bad / "shard-000000.tar", "w") as dst:
        for m in src.getmembers()[:-2]:  # drop the last utterance
            dst.addfile(m, src.extractfile(m))
    st = stream(bad, 0, 1, 0)
    st.set_epoch(0)
    last = index["shards"][0]["utts"][-1][1]
    with pytest.raises(ShardError, match=f"utt {last}.*not in the shard"):
        list(st)


def test_make_shards_tool(shards, tmp_path, capsys):
    tool = load_tool("make_shards")
    out = tmp_path / "out"
    assert tool.main(["--utts-per-shard", "10", "--no-progress", str(shards["data"]), str(out)]) == 0
    assert "3 shards, 23 utterances" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar",
                                                       "shards.json"]
    assert tool.main([str(tmp_path / "nope"), str(out)]) == 1
    assert "nope" in capsys.readouterr().err


def test_without_the_shards_extra_writing_and_reading_are_one_line_naming_it(shards, not_installed, tmp_path,
                                                                             capsys):
    not_installed("webdataset")
    with pytest.raises(MissingExtraError,
                       match=r"^writing shards needs webdataset, .*'\.\[shards\]' \(in the asrkit checkout\)$"):
        write_shards(str(shards["data"]), str(tmp_path / "w"), utts_per_shard=4, progress=False)
    assert not (tmp_path / "w").exists()
    assert load_tool("make_shards").main(["--no-progress", str(shards["data"]), str(tmp_path / "t")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "make_shards.py: writing shards needs webdataset, which is not installed: "
        "pip install -e '.[shards]' (in the asrkit checkout)"]
    with pytest.raises(MissingExtraError,
                       match=r"^reading shards needs webdataset, .*'\.\[shards\]' \(in the asrkit checkout\)$"):
        stream(shards["dir"], 0, 1, 0)  # built before the loader starts, so training fails at once
