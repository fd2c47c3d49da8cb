"""CMVN statistics against numpy on the concatenated valid frames; JSON round trip; the module."""
from __future__ import annotations

import json
import re

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
    with pytest.raises(CMVNError, match="^CMVN stats are empty: no frames were accumulated$"):
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
    (lambda d: d.update(version=2), r"unsupported CMVN stats version 2 \(expected 1\)"),
    # NaN/inf sums (e.g. from NaN features) would make every normalised feature NaN.
    (lambda d: d["sum"].__setitem__(2, float("nan")), "'sum' must be a list of 5 finite numbers"),
    (lambda d: d["sum_squares"].__setitem__(0, float("inf")), "'sum_squares' must be a list of 5 finite numbers"),
    (lambda d: d["sum"].__setitem__(1, "1.5"), "'sum' must be a list of 5 finite numbers"),
    # Only the negative entry is named (0 is a legal sum of squares).
    (lambda d: d.update(sum_squares=[0.0, 1.0, 1.0, -1.0, 1.0]),
     r"'sum_squares' has negative entries \(at dimensions \[3\]\)"),
    (lambda d: d.update(dim=0, sum=[], sum_squares=[]), "positive integers, got 0, 4"),
    (lambda d: d.update(dim="5"), "positive integers, got '5', 4"),
    (lambda d: d.update(frame_count=2.5), "positive integers, got 5, 2.5"),
    (lambda d: d.update(frame_count=-4), "positive integers, got 5, -4"),
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
    assert str(err.value).startswith(f"{path}: ")  # the message names the file first


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
    with pytest.raises(CMVNError, match="^CMVN has dimension 4, got features of dimension 3$"):
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


def test_loaded_stats_keep_accumulating(tmp_path):
    # Stats loaded from a file must keep their dimension: a loader that forgets it (dim None) makes the next
    # update() start from zero sums, silently dropping everything in the file.
    batches, ref = _padded_batches(seed=4)
    first = CMVNStats()
    first.update(*batches[0])
    first.save(tmp_path / "part.json")
    stats = CMVNStats.load(tmp_path / "part.json")
    assert stats.dim == 5
    for feats, lens in batches[1:]:
        stats.update(feats, lens)
    mean, istd = stats.finalize()
    assert stats.frame_count == ref.shape[0] == 29
    np.testing.assert_allclose(mean.numpy(), ref.mean(0), rtol=1e-6)
    np.testing.assert_allclose(1 / istd.double().numpy(), ref.std(0), rtol=1e-5)
    with pytest.raises(CMVNError, match="dimension 5, got features of dimension 4"):
        stats.update(torch.zeros(1, 2, 4), torch.tensor([2]))


@pytest.mark.parametrize("dim", [None, 3])  # the dimension fixed by the first update, or given up front
def test_sums_are_float64_over_many_frames(dim):
    # 20000 frames of offset 1000 and std 2: accumulated in float32 the variance comes out ~2% off
    # (catastrophic cancellation in sum_squares / n - mean^2); float64 matches numpy to ~1e-10.
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 250, 3, generator=g) * 2 + 1000 for _ in range(10)]
    ref = torch.cat([b.reshape(-1, 3) for b in batches]).double().numpy()
    stats = CMVNStats(dim)
    for feats in batches:
        stats.update(feats, torch.full((8,), 250))
    mean, istd = stats.finalize()
    assert stats.frame_count == 20000
    np.testing.assert_allclose(stats.sum.numpy(), ref.sum(0), rtol=1e-12)
    np.testing.assert_allclose(stats.sum_squares.numpy(), np.square(ref).sum(0), rtol=1e-12)
    np.testing.assert_allclose(1 / istd.double().numpy(), ref.std(0), rtol=1e-5)
    np.testing.assert_allclose(mean.numpy(), ref.mean(0), rtol=1e-7)


def test_update_without_lengths_counts_every_frame():
    # (B, F, D) without lens: all B*F frames are valid (B, F, D all different, so counting B, D or F*F
    # frames, or one utterance, shows up).
    feats = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(5)) + 10
    ref = feats.reshape(-1, 4).double().numpy()
    stats = CMVNStats()
    stats.update(feats)
    assert stats.frame_count == 21
    np.testing.assert_allclose(stats.sum.numpy(), ref.sum(0), rtol=1e-12)
    np.testing.assert_allclose(stats.sum_squares.numpy(), np.square(ref).sum(0), rtol=1e-12)


@pytest.mark.parametrize("lens", [torch.tensor(4), torch.tensor([4])])
def test_unbatched_update_honours_its_length(lens):
    # (F, D) with a length: only the first `lens` frames count (the rest is padding).
    feats = torch.randn(6, 2, generator=torch.Generator().manual_seed(6))
    feats[4:] = 1e6
    stats = CMVNStats()
    stats.update(feats, lens)
    assert stats.frame_count == 4
    np.testing.assert_allclose(stats.sum.numpy(), feats[:4].double().sum(0).numpy(), rtol=1e-12)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4, 5)])
def test_update_rejects_other_shapes(shape):
    message = f"CMVN update expects feats of shape (B, F, D) or (F, D), got {shape}"
    with pytest.raises(CMVNError, match=f"^{re.escape(message)}$"):
        CMVNStats().update(torch.zeros(shape))


def test_merge_of_empty_and_single_frame_accumulators():
    stats = CMVNStats()
    stats.merge(CMVNStats())  # an empty job (no utterances) adds nothing and fixes no dimension
    assert stats.frame_count == 0 and stats.dim is None
    one = CMVNStats()
    one.update(torch.tensor([[1.0, -2.0]]))  # a job that saw a single frame still counts
    stats.merge(one)
    stats.merge(one)
    assert stats.frame_count == 2 and stats.dim == 2
    assert stats.sum.tolist() == [2.0, -4.0] and stats.sum_squares.tolist() == [2.0, 8.0]


def test_round_trip_keeps_meta_and_smallest_valid_stats(tmp_path):
    # One dimension and one frame are valid stats (the bounds are "positive", not "> 1").
    stats = CMVNStats(meta={"frontend": {"kind": "kaldi_fbank"}, "corpus": "dev"})
    stats.update(torch.tensor([[3.0]]))
    stats.save(tmp_path / "one.json")
    back = CMVNStats.load(tmp_path / "one.json")
    assert back.dim == 1 and back.frame_count == 1
    assert back.meta == {"frontend": {"kind": "kaldi_fbank"}, "corpus": "dev"}
    assert back.sum.tolist() == [3.0] and back.sum_squares.tolist() == [9.0]
    # A zero sum of squares (a dimension that is always 0) is legal, unlike a negative one.
    data = back.to_dict()
    data.update(sum=[0.0], sum_squares=[0.0])
    assert CMVNStats.from_dict(data).sum_squares.tolist() == [0.0]


def test_saved_file_is_one_value_per_line(tmp_path):
    # The documented human-readable layout (indent 1, trailing newline): stats files get committed with
    # recipes, and a one-line or re-indented file makes every diff a full rewrite.
    stats = CMVNStats()
    stats.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    stats.save(tmp_path / "cmvn.json")
    text = (tmp_path / "cmvn.json").read_text(encoding="utf-8")
    assert text.startswith('{\n "format": "asrkit-cmvn",\n "version": 1,\n "dim": 2,\n "frame_count": 2,\n'
                           ' "sum": [\n  4.0,\n  6.0\n ],\n')
    assert text.endswith("\n}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["cmvn.json"]  # no temporary file left behind


def test_from_dict_errors_default_to_a_generic_name():
    with pytest.raises(CMVNError, match=r'^CMVN stats: not an asrkit CMVN stats object \(missing "format"'):
        CMVNStats.from_dict({"format": "kaldi"})


def test_utf8_stats_file_loads_whatever_the_locale(tmp_path, c_locale):
    # Stats JSON is UTF-8 (another tool may write non-ASCII meta unescaped); opening it with the locale's
    # encoding fails under a C/ASCII locale. (Catches the bug when Python is not in UTF-8 mode, as here.)
    stats = CMVNStats(meta={"corpus": "Zürich"})
    stats.update(torch.ones(2, 3))
    path = tmp_path / "cmvn.json"
    path.write_bytes(json.dumps(stats.to_dict(), ensure_ascii=False).encode("utf-8"))
    assert CMVNStats.load(path).meta == {"corpus": "Zürich"}
    stats.save(path)  # and the file it writes reads back the same
    assert CMVNStats.load(path).meta == {"corpus": "Zürich"}


def test_global_cmvn_buffers_and_output_are_float32():
    # float64 stats (e.g. straight from numpy) must not turn the features into float64: a float64 buffer
    # doubles the frontend's memory and breaks the model's float32/AMP inputs.
    mean = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    istd = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    cmvn = GlobalCMVN(mean, istd)
    assert cmvn.mean.dtype == cmvn.istd.dtype == torch.float32
    feats = torch.randn(2, 4, 3)
    out, _ = cmvn(feats, torch.tensor([4, 3]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0], (feats[0] - mean.float()) * istd.float())


@pytest.mark.parametrize("mean_shape,istd_shape", [((4,), (3,)), ((1, 4), (1, 4)), ((4,), ()), ((4,), (1, 4))])
def test_global_cmvn_rejects_mismatched_or_non_vector_stats(mean_shape, istd_shape):
    # Mismatched sizes would broadcast into wrong features (or fail only at the first batch).
    with pytest.raises(CMVNError, match=re.escape(f"CMVN mean and istd must be 1-D of equal size, got {mean_shape} "
                                                  f"and {istd_shape}")):
        GlobalCMVN(torch.zeros(mean_shape), torch.ones(istd_shape))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_features_with_cpu_lengths():
    # The frontend runs on the model's device while lengths often stay on the CPU: masks are built on the
    # features' device (an arange or lens left on the CPU fails to compare with CUDA tensors).
    batches, ref = _padded_batches(seed=7)
    stats = CMVNStats()
    for feats, lens in batches:
        stats.update(feats.cuda(), lens)
    assert stats.sum.device.type == "cpu" and stats.frame_count == 29
    np.testing.assert_allclose(stats.finalize()[0].numpy(), ref.mean(0), rtol=1e-6)
    cmvn = GlobalCMVN.from_stats(stats).cuda()
    feats, lens = batches[0]
    out, _ = cmvn(feats.cuda(), lens.cuda())
    torch.testing.assert_close(out.cpu(), GlobalCMVN.from_stats(stats)(feats, lens)[0])
