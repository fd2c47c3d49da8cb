"""CMVN statistics against numpy on the concatenated valid frames; JSON round trip; the module."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asrkit.audio.cmvn import DEFAULT_VAR_FLOOR, CMVNError, CMVNStats, GlobalCMVN


def _padded_batches(seed=0, dim=5):
    """Batches of (feats, lens) with garbage in the padding, plus the valid frames concatenated (numpy)."""
    g = torch.Generator().manual_seed(seed)
    batches, valid = [], []
    for lengths in ([7, 3, 5], [1, 9], [4]):
        feats = torch.randn(len(lengths), max(lengths), dim, generator=g) * 3 + 100  # large offset: precision
        lens = torch.tensor(lengths)
        for b, n in enumerate(lengths):
            feats[b, n:] = 1e6  # would wreck the stats if padding were counted
            valid.append(feats[b, :n].double().numpy())
        batches.append((feats, lens))
    return batches, np.concatenate(valid)


def test_stats_equal_numpy_on_concatenated_valid_frames():
    batches, ref = _padded_batches()
    stats = CMVNStats()
    for feats, lens in batches:
        stats.update(feats, lens)
    mean, istd = stats.finalize()
    assert stats.frame_count == ref.shape[0] == 29 and stats.dim == 5
    np.testing.assert_allclose(mean.numpy(), ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(1 / istd.double().numpy(), ref.std(0), rtol=1e-5)
    assert mean.dtype == istd.dtype == torch.float32


def test_streaming_merge_and_unbatched_update_agree():
    batches, ref = _padded_batches(seed=1)
    whole = CMVNStats()
    for feats, lens in batches:
        whole.update(feats, lens)
    a, b = CMVNStats(), CMVNStats(5)
    a.update(*batches[0])
    for feats, lens in batches[1:]:
        for i in range(feats.size(0)):  # (F, D) one utterance at a time
            b.update(feats[i, :int(lens[i])])
    a.merge(b)
    assert a.frame_count == whole.frame_count
    torch.testing.assert_close(a.sum, whole.sum)
    torch.testing.assert_close(a.sum_squares, whole.sum_squares)


def test_variance_floor_and_errors():
    stats = CMVNStats()
    feats = torch.randn(1, 50, 3)
    feats[..., 1] = -23.0  # a constant dimension (e.g. a mel bin above the corpus band limit)
    stats.update(feats, torch.tensor([50]))
    mean, istd = stats.finalize()
    assert mean[1] == -23.0 and istd[1] == pytest.approx(DEFAULT_VAR_FLOOR ** -0.5)
    assert stats.finalize(var_floor=0.25)[1][1] == pytest.approx(2.0)
    with pytest.raises(CMVNError, match="dimension 3"):
        stats.update(torch.zeros(1, 2, 4), torch.tensor([2]))
    with pytest.raises(CMVNError, match="empty"):
        CMVNStats(3).finalize()


def test_json_round_trip_is_exact_and_readable(tmp_path):
    batches, ref = _padded_batches(seed=2)
    stats = CMVNStats(meta={"frontend": {"n_mels": 5}})
    for feats, lens in batches:
        stats.update(feats, lens)
    path = tmp_path / "cmvn.json"
    stats.save(path)
    data = json.loads(path.read_text())
    assert data["frame_count"] == 29 and data["dim"] == 5 and data["meta"] == {"frontend": {"n_mels": 5}}
    np.testing.assert_allclose(data["mean"], ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(data["std"], ref.std(0), rtol=1e-5)
    back = CMVNStats.load(path)
    assert back.frame_count == 29 and torch.equal(back.sum, stats.sum)
    assert torch.equal(back.sum_squares, stats.sum_squares)
    for x, y in zip(back.finalize(), stats.finalize()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("sum_squares"), "missing key 'sum_squares'"),
    (lambda d: d.update(sum=d["sum"][:-1]), "'sum' must be a list of 5"),
    (lambda d: d.update(frame_count=0), "positive integers"),
    (lambda d: d.update(format="other"), "not an asrkit CMVN"),
])
def test_load_rejects_malformed_files_naming_them(tmp_path, edit, message):
    stats = CMVNStats()
    stats.update(torch.randn(1, 4, 5), torch.tensor([4]))
    data = stats.to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CMVNError, match=message) as err:
        CMVNStats.load(path)
    assert str(path) in str(err.value)


def test_load_reports_bad_json_and_missing_file(tmp_path):
    (tmp_path / "x.json").write_text("{\n  oops")
    with pytest.raises(CMVNError, match=r"x.json: invalid JSON at line 2"):
        CMVNStats.load(tmp_path / "x.json")
    with pytest.raises(CMVNError, match="cannot read"):
        CMVNStats.load(tmp_path / "missing.json")


def test_global_cmvn_normalises_valid_frames_only():
    mean, istd = torch.randn(4), torch.rand(4) + 0.1
    cmvn = GlobalCMVN(mean, istd)
    feats = torch.randn(2, 6, 4)
    lens = torch.tensor([6, 2])
    out, out_lens = cmvn(feats, lens)
    assert torch.equal(out_lens, lens)
    torch.testing.assert_close(out[0], (feats[0] - mean) * istd)
    torch.testing.assert_close(out[1, :2], (feats[1, :2] - mean) * istd)
    assert torch.all(out[1, 2:] == 0)
    assert set(cmvn.state_dict()) == {"mean", "istd"}
    with pytest.raises(CMVNError, match="dimension 4"):
        cmvn(torch.zeros(1, 2, 3), torch.tensor([2]))


def test_global_cmvn_from_stats_whitens_the_training_frames():
    batches, ref = _padded_batches(seed=3)
    stats = CMVNStats()
    for feats, lens in batches:
        stats.update(feats, lens)
    normed = [GlobalCMVN.from_stats(stats)(f, n)[0][b, :int(n[b])] for f, n in batches for b in range(len(n))]
    x = torch.cat(normed).double()
    torch.testing.assert_close(x.mean(0), torch.zeros(5, dtype=torch.float64), atol=1e-4, rtol=0)
    torch.testing.assert_close(x.std(0, unbiased=False), torch.ones(5, dtype=torch.float64), atol=1e-4, rtol=0)
