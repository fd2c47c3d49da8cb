"""SpecAugment mask bounds and placement, time warp against F.interpolate, speed perturbation against torchaudio."""
from __future__ import annotations

import pytest
import torch
import torchaudio.functional as AF

from asrkit.audio.augment import SpecAugment, SpeedPerturb, sample_time_warp, speed_perturb, time_warp
from asrkit.config import ConfigError, SpecAugmentConfig, SpeedPerturbConfig

FILL = -1000.0  # a value features never take, so masked cells can be found exactly


def _feats(lengths, dim=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(len(lengths), max(lengths), dim, generator=g) + 1.0  # values in [1, 2): never FILL or 0
    lens = torch.tensor(lengths)
    for b, n in enumerate(lengths):
        feats[b, n:] = 0.0
    return feats, lens


def _masked(cfg, feats, lens):
    out, out_lens = SpecAugment(cfg).train()(feats, lens, fill=torch.full((feats.size(2),), FILL))
    assert torch.equal(out_lens, lens)
    return out == FILL  # (B, F, D)


def _runs(flags):
    """Lengths of the maximal runs of True in a 1-D bool tensor."""
    runs, n = [], 0
    for f in flags.tolist() + [False]:
        if f:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_frequency_masks_are_bands_within_bounds():
    cfg = SpecAugmentConfig(enabled=True, num_freq_masks=1, freq_mask_width=7, num_time_masks=0)
    lengths = [30, 12, 25] * 200
    feats, lens = _feats(lengths)
    torch.manual_seed(0)
    masked = _masked(cfg, feats, lens)
    widths = []
    for b, n in enumerate(lengths):
        cols = masked[b, :n].all(0)
        assert torch.equal(masked[b, :n], cols[None].expand(n, -1))  # whole columns of the valid frames
        assert not masked[b, n:].any()  # padding untouched
        runs = _runs(cols)
        assert len(runs) <= 1
        widths.append(runs[0] if runs else 0)
    assert min(widths) == 0 and max(widths) == 7  # widths span {0..W} inclusive
    two = SpecAugmentConfig(enabled=True, num_freq_masks=2, freq_mask_width=7, num_time_masks=0)
    assert _masked(two, feats, lens)[:, 0].sum(-1).max() <= 14


def test_time_masks_stay_inside_valid_frames_and_respect_caps():
    cfg = SpecAugmentConfig(enabled=True, num_freq_masks=0, num_time_masks=1, time_mask_width=10,
                            time_mask_ratio=0.2)
    lengths = [100, 30, 7, 64] * 150
    feats, lens = _feats(lengths, dim=4)
    torch.manual_seed(1)
    masked = _masked(cfg, feats, lens)
    widths = {n: [] for n in set(lengths)}
    for b, n in enumerate(lengths):
        rows = masked[b].all(1)
        assert torch.equal(masked[b], rows[:, None].expand(-1, 4))  # whole frames
        assert not rows[n:].any()
        runs = _runs(rows)
        assert len(runs) <= 1
        widths[n].append(runs[0] if runs else 0)
    # cap = min(time_mask_width, floor(ratio * len)): 10, 6, 1, 10
    assert {n: max(w) for n, w in widths.items()} == {100: 10, 30: 6, 7: 1, 64: 10}
    assert all(min(w) == 0 for w in widths.values())
    three = SpecAugmentConfig(enabled=True, num_freq_masks=0, num_time_masks=3, time_mask_width=10,
                              time_mask_ratio=0.2)
    counts = _masked(three, feats, lens)[:, :, 0].sum(1)
    assert all(int(c) <= 3 * min(10, int(0.2 * n)) for c, n in zip(counts, lengths))


def test_default_fill_is_zero_and_eval_is_identity():
    aug = SpecAugment(SpecAugmentConfig(enabled=True, time_warp=2))
    feats, lens = _feats([50, 40])
    out, _ = aug.eval()(feats, lens)
    assert out is feats
    torch.manual_seed(3)
    out, _ = aug.train()(feats, lens)
    changed = out != feats
    assert changed.any() and not changed[1, 40:].any()


def test_specaugment_is_deterministic_under_manual_seed():
    aug = SpecAugment(SpecAugmentConfig(enabled=True, time_warp=4)).train()
    feats, lens = _feats([80, 60, 33])
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(aug(feats, lens)[0])
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def _warp_reference(x, n, c, w):
    """Stretch frames [0, c] onto [0, w] and [c, n-1] onto [w, n-1] with align_corners=True interpolation."""
    def resize(seg, size):
        return torch.nn.functional.interpolate(seg.T[None], size=size, mode="linear", align_corners=True)[0].T
    return torch.cat([resize(x[:c + 1], w + 1)[:w], resize(x[c:n], n - w)])


def test_time_warp_matches_interpolate_reference():
    lengths = [60, 45, 9, 20, 30]  # 9 < 2*W+3: left unwarped
    feats, lens = _feats(lengths, dim=6)
    torch.manual_seed(11)
    centers, warped = sample_time_warp(lens, 5)
    out = time_warp(feats, lens, centers, warped)
    assert out.shape == feats.shape
    for b, n in enumerate(lengths):
        c, w = int(centers[b]), int(warped[b])
        if n < 13:
            assert c == w == 0 and torch.equal(out[b], feats[b])
            continue
        assert 6 <= c <= n - 7 and abs(w - c) <= 5
        torch.testing.assert_close(out[b, :n], _warp_reference(feats[b], n, c, w))
        assert torch.equal(out[b, n:], feats[b, n:])
    # The module draws warp parameters first, from the same generator state.
    aug = SpecAugment(SpecAugmentConfig(enabled=True, time_warp=5, num_freq_masks=0, num_time_masks=0)).train()
    torch.manual_seed(11)
    torch.testing.assert_close(aug(feats, lens)[0], out)
    assert (centers != warped).any()  # the test exercised actual warps


def test_time_warp_identity_parameters_change_nothing():
    feats, lens = _feats([25, 18])
    same = torch.tensor([10, 4])
    torch.testing.assert_close(time_warp(feats, lens, same, same), feats)


@pytest.mark.parametrize("factors", [[0.9, 1.1, 1.0, 0.9], [1.1, 1.1, 0.9, 1.0]])
def test_speed_perturb_matches_torchaudio_resample(factors):
    sr = 8000
    lengths = [4000, 2500, 3333, 1000]
    g = torch.Generator().manual_seed(0)
    wav = torch.randn(4, 4000, generator=g) * 0.1  # the padding is noise: it must be ignored
    lens = torch.tensor(lengths)
    out, out_lens = speed_perturb(wav, lens, factors, sr)
    for b, (n, f) in enumerate(zip(lengths, factors)):
        ref = wav[b, :n] if f == 1.0 else AF.resample(wav[b, :n], orig_freq=int(round(sr * f)), new_freq=sr)
        assert int(out_lens[b]) == ref.numel()
        assert abs(ref.numel() - n / f) < 1.0
        torch.testing.assert_close(out[b, :ref.numel()], ref, atol=1e-5, rtol=1e-4)
        assert torch.all(out[b, ref.numel():] == 0)


def test_speed_perturb_module_training_only_and_seeded():
    sp = SpeedPerturb(SpeedPerturbConfig(enabled=True, factors=(0.9, 1.0, 1.1)), 16000)
    wav = torch.randn(60, 1600)
    lens = torch.full((60,), 1600)
    out, out_lens = sp.eval()(wav, lens)
    assert out is wav and out_lens is lens
    sp.train()
    torch.manual_seed(4)
    a, a_lens = sp(wav, lens)
    torch.manual_seed(4)
    b, b_lens = sp(wav, lens)
    assert torch.equal(a, b) and torch.equal(a_lens, b_lens)
    # Per-utterance factors: all three lengths ceil(1600 / f) occur in one batch.
    assert set(a_lens.tolist()) == {1778, 1600, 1455}


def test_config_validation():
    with pytest.raises(ConfigError, match="speed_perturb.factors"):
        SpeedPerturb(SpeedPerturbConfig(factors=(0.9, 0.0)), 16000)
    with pytest.raises(ConfigError, match="specaug.time_mask_ratio"):
        SpecAugment(SpecAugmentConfig(time_mask_ratio=1.5))
    with pytest.raises(ConfigError, match="specaug.num_time_masks"):
        SpecAugment(SpecAugmentConfig(num_time_masks=-1))
