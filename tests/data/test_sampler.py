"""asrkit.data.sampler.BucketBatchSampler: budgets, coverage, sharding, reshuffling and resume."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from asrkit.data.sampler import BucketBatchSampler

MAX_FRAMES, MAX_BS = 3000, 16


def durations(n: int = 500, seed: int = 0):
    return list(np.random.default_rng(seed).uniform(0.3, 12.0, n))


def frames(durs):
    return [max(1, round(d * 100)) for d in durs]  # the spec's 10 ms frames


def make(durs, **kw):
    kw.setdefault("seed", 7)
    return BucketBatchSampler(durs, max_frames=kw.pop("max_frames", MAX_FRAMES),
                              max_batch_size=kw.pop("max_batch_size", MAX_BS), **kw)


def epoch(sampler, e):
    sampler.set_epoch(e)
    return list(sampler)


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_respect_the_padded_frame_budget_and_size(shuffle):
    durs = durations()
    f = frames(durs)
    batches = epoch(make(durs, shuffle=shuffle), 0)
    for b in batches:
        assert len(b) <= MAX_BS
        assert len(b) * max(f[i] for i in b) <= MAX_FRAMES
    # greedy packing is not wasteful: batches are mostly full
    assert len(batches) < 1.3 * sum(f) / MAX_FRAMES + 5
    if not shuffle:  # validation order: by length
        flat = [f[i] for b in batches for i in b]
        assert flat == sorted(flat)


def test_similar_lengths_are_batched_together():
    durs = durations(2000)
    f = np.array(frames(durs))
    batches = epoch(make(durs), 0)
    padded = sum(len(b) * f[b].max() for b in batches)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(f))
    sizes = np.cumsum([len(b) for b in batches])[:-1]
    random_padded = sum(len(b) * f[b].max() for b in np.split(perm, sizes))  # same sizes, random members
    assert padded / f.sum() < 1.1
    assert random_padded / f.sum() > 1.4


@pytest.mark.parametrize("replicas", [1, 2, 3, 7])
def test_every_utterance_once_per_epoch_and_equal_batches_per_rank(replicas):
    durs = durations(301)
    for e in (0, 1):
        per_rank = [epoch(make(durs, num_replicas=replicas, rank=r), e) for r in range(replicas)]
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1, f"ranks got {[len(b) for b in per_rank]} batches"
        assert len(make(durs, num_replicas=replicas, rank=0)) == counts.pop()
        union = sorted(i for batches in per_rank for b in batches for i in b)
        assert union == list(range(len(durs)))


def test_more_ranks_than_utterances_pads_by_repeating():
    per_rank = [epoch(make([1.0, 2.0], num_replicas=4, rank=r), 0) for r in range(4)]
    assert all(len(b) == 1 for b in per_rank)
    assert sorted(i for batches in per_rank for b in batches for i in b) == [0, 0, 1, 1]


def test_reshuffle_per_epoch_is_deterministic():
    durs = durations()
    a, b = make(durs, seed=1), make(durs, seed=1)
    e0, e1 = epoch(a, 0), epoch(a, 1)
    assert e0 != e1
    assert sorted(map(sorted, e0)) != sorted(map(sorted, e1))  # batch membership changes too, not just order
    assert epoch(b, 1) == e1 and epoch(b, 0) == e0
    assert epoch(make(durs, seed=2), 0) != e0


@pytest.mark.parametrize("replicas", [1, 2])
def test_sortagrad_epochs_go_shortest_bucket_first_then_shuffle(replicas):
    durs = durations(800)
    f = frames(durs)
    bucket = 50  # the default 0.5 s buckets, in frames

    def longest_buckets(batches):
        return [max(f[i] for i in b) // bucket for b in batches]

    samplers = [make(durs, sortagrad_epochs=2, num_replicas=replicas, rank=r) for r in range(replicas)]
    plain = [make(durs, num_replicas=replicas, rank=r) for r in range(replicas)]
    for e in (0, 1):
        for s in samplers:
            order = longest_buckets(epoch(s, e))
            assert order == sorted(order), f"epoch {e}: not shortest first"
            assert order[0] < order[-1]
        # the same batches as the shuffled epoch, only in another order: nothing lost or repeated
        got = sorted(sorted(b) for s in samplers for b in epoch(s, e))
        assert got == sorted(sorted(b) for p in plain for b in epoch(p, e))
        assert sorted(i for b in got for i in b) == list(range(len(durs)))
    # from epoch 2 on, exactly the plain sampler's shuffled order
    for s, p in zip(samplers, plain):
        got = epoch(s, 2)
        assert got == epoch(p, 2)
        order = longest_buckets(got)
        assert order != sorted(order)


def test_sortagrad_off_by_default_shuffles_the_first_epoch():
    f = frames(durations(800))
    order = [max(f[i] for i in b) // 50 for b in epoch(make(durations(800)), 0)]  # 0.5 s buckets
    assert order != sorted(order)


def test_sortagrad_orders_buckets_not_utterances():
    """Within a 0.5 s bucket the utterances stay in random order (the bucket, not the exact length, is the key)."""
    durs = durations(800)
    f = frames(durs)
    flat = [f[i] for b in epoch(make(durs, sortagrad_epochs=1), 0) for i in b]
    assert [x // 50 for x in flat] == sorted(x // 50 for x in flat)
    assert flat != sorted(flat)
    # 10 ms buckets: the exact length is the key
    flat = [f[i] for b in epoch(make(durs, sortagrad_epochs=1, bucket_width=0.01), 0) for i in b]
    assert flat == sorted(flat)


def test_defaults_seed_0_and_epoch_0():
    durs = durations(300)
    plain = BucketBatchSampler(durs, max_frames=MAX_FRAMES, max_batch_size=MAX_BS)
    assert plain.state_dict()["batches_consumed"] == 0 and plain.state_dict()["epoch"] == 0
    assert list(plain) == epoch(make(durs, seed=0), 0)  # iterated without set_epoch: epoch 0, seed 0


def test_each_epoch_is_seeded_by_seed_plus_epoch():
    durs = durations(300)
    assert epoch(make(durs, seed=5), 3) == epoch(make(durs, seed=6), 2) == epoch(make(durs, seed=8), 0)


def test_a_batch_may_fill_max_frames_exactly():
    assert epoch(make([1.0, 1.0], max_frames=200, shuffle=False), 0) == [[0, 1]]
    assert epoch(make([1.0, 1.01], max_frames=200, shuffle=False), 0) == [[0], [1]]
    # a duration under one frame counts as one frame
    assert epoch(make([0.001, 0.001], max_frames=2, shuffle=False), 0) == [[0, 1]]


def test_length_after_the_whole_epoch_was_consumed_is_zero():
    s = make(durations(100))
    full = epoch(s, 1)
    s.load_state_dict({"epoch": 1, "batches_consumed": len(full), "seed": 7, "num_replicas": 1})
    s.set_epoch(1)
    assert len(s) == 0 and list(s) == []


def test_resume_mid_epoch_continues_with_the_next_batch():
    durs = durations()
    ref = make(durs, num_replicas=2, rank=1)
    full = epoch(ref, 3)
    run = make(durs, num_replicas=2, rank=1)
    run.set_epoch(3)
    it = iter(run)
    consumed = [next(it) for _ in range(5)]
    state = run.state_dict()
    assert state["epoch"] == 3 and state["batches_consumed"] == 5 and consumed == full[:5]

    resumed = make(durs, num_replicas=2, rank=1, seed=123)  # the seed comes from the checkpoint
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the trainer's usual call at the top of the epoch keeps the resume point
    assert len(resumed) == len(full) - 5
    assert list(resumed) == full[5:]
    assert epoch(resumed, 4) == epoch(ref, 4)  # and later epochs are unaffected
    # an explicit count (what the training loop really used, with prefetching workers) wins
    assert run.state_dict(batches_consumed=2)["batches_consumed"] == 2
    with pytest.raises(ValueError, match="cannot resume mid-epoch with 4 ranks"):
        make(durs, num_replicas=4, rank=0).load_state_dict(state)


def test_utterance_longer_than_max_frames_is_alone_and_warned_once(caplog):
    durs = [1.0] * 20 + [45.0, 50.0]  # 4500, 5000 frames > 3000
    with caplog.at_level(logging.WARNING, logger="asrkit.data"):
        s = make(durs)
        for e in range(3):
            batches = epoch(s, e)
            assert [20] in batches and [21] in batches
            assert sorted(i for b in batches for i in b) == list(range(22))
    warnings = [r for r in caplog.records if "longer than max_frames" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].getMessage() == ("2 utterances are longer than max_frames=3000 (longest 5000 frames); each "
                                        "forms a batch of its own")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asrkit.data"):
        make([30.0, 1.0])  # exactly max_frames fits
    assert not caplog.records


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank 2 is not in"):
        make([1.0], num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="must be positive"):
        make([1.0], max_frames=0)
    with pytest.raises(ValueError, match="sortagrad_epochs must be >= 0, got -1"):
        make([1.0], sortagrad_epochs=-1)
    with pytest.raises(ValueError, match="must be positive"):
        make([1.0], max_batch_size=0)
    assert epoch(make([0.01], max_frames=1, max_batch_size=1), 0) == [[0]]  # the smallest valid budget
