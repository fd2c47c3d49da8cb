"""Per-utterance CMN: against a per-row numpy reference, gain invariance through the frontend, its place before
SpecAugment and global CMVN, compute-cmvn's stats, and the stats/frontend mismatch check."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio.cmvn import CMVNStats
from asrkit.audio.frontend import Frontend
from asrkit.audio.utterance_cmn import UtteranceCMN
from asrkit.cli.compute_cmvn import compute_cmvn
from asrkit.config import ConfigError, FrontendConfig, SpecAugmentConfig
from asrkit.data.table import write_table

SR = 16000


def _speech(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / SR
    f0 = 100 + 100 * torch.rand((), generator=g)
    x = sum(torch.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
    return (0.1 * x + 0.01 * torch.randn(n, generator=g)).float()


def test_matches_per_utterance_reference_and_keeps_padding_zero():
    feats = torch.randn(4, 7, 5) * 3 + 2
    lens = torch.tensor([7, 4, 1, 0])  # a one-frame utterance becomes all 0
    out, out_lens = UtteranceCMN()(feats, lens)
    assert torch.equal(out_lens, lens)
    x = feats.double().numpy()
    for b, n in enumerate(lens.tolist()):
        ref = x[b, :n] - x[b, :n].mean(0) if n else x[b, :0]
        np.testing.assert_allclose(out[b, :n].double().numpy(), ref, atol=1e-5)
        assert torch.all(out[b, n:] == 0)  # padding (and the empty row) stay exactly 0, no NaN


def test_frontend_features_are_gain_invariant_only_with_utterance_cmn():
    wav = torch.stack([_speech(12000, 0), _speech(12000, 1)])
    lens = torch.tensor([12000, 9000])
    gains = torch.tensor([[0.2], [3.0]])
    on = Frontend(FrontendConfig(utterance_cmn=True)).eval()
    off = Frontend(FrontendConfig()).eval()
    a, a_lens = on(wav, lens)
    b, _ = on(wav * gains, lens)
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    valid_mean = a[0, : int(a_lens[0])].mean(0)
    torch.testing.assert_close(valid_mean, torch.zeros_like(valid_mean), atol=1e-4, rtol=0)
    assert (off(wav, lens)[0] - off(wav * gains, lens)[0]).abs().max() > 1.0  # a gain shifts plain log-mels


def test_applied_before_specaugment_and_global_cmvn():
    mean, istd = torch.randn(80), torch.rand(80) + 0.5
    cfg = FrontendConfig(utterance_cmn=True)
    fe = Frontend(cfg, SpecAugmentConfig(enabled=True, num_time_masks=0, freq_mask_width=10), cmvn=(mean, istd))
    wav, lens = torch.stack([_speech(16000, 2), _speech(16000, 3)]), torch.tensor([16000, 11000])
    x, x_lens = fe.extractor(wav, lens)
    valid = (torch.arange(x.size(1))[None, :] < x_lens[:, None]).unsqueeze(-1)
    u = x - (x * valid).sum(1, keepdim=True) / x_lens[:, None, None]
    ref = ((u - mean) * istd) * valid
    torch.testing.assert_close(fe.eval()(wav, lens)[0], ref, atol=1e-4, rtol=0)
    torch.manual_seed(2)
    feats, _ = fe.train()(wav, lens)
    zero_bins = (feats[0] == 0).all(0)  # masks filled with the CMVN mean become exactly 0 after it
    assert 1 <= int(zero_bins.sum()) <= 20


def _data_dir(root, n_utts: int = 4):
    data = root / "data"
    data.mkdir()
    scp = {}
    for i in range(n_utts):
        path = root / f"u{i}.wav"
        sf.write(path, (0.5 ** i) * _speech(8000 + 1000 * i, 10 + i).numpy(), SR, subtype="FLOAT")
        scp[f"utt{i}"] = str(path)
    write_table(data / "wav.scp", scp)
    write_table(data / "text", {u: "HELLO" for u in scp})
    write_table(data / "utt2spk", {u: "spk1" for u in scp})
    return data


def test_compute_cmvn_stats_follow_the_frontend_and_mismatch_is_refused(tmp_path):
    data = _data_dir(tmp_path)
    on, off = FrontendConfig(utterance_cmn=True), FrontendConfig()
    compute_cmvn(data, tmp_path / "on.json", on, progress=False)
    compute_cmvn(data, tmp_path / "off.json", off, progress=False)
    stats_on, stats_off = CMVNStats.load(tmp_path / "on.json"), CMVNStats.load(tmp_path / "off.json")
    mean_on, _ = stats_on.finalize()
    mean_off, _ = stats_off.finalize()
    assert float(mean_on.abs().max()) < 1e-4  # every utterance's mean was removed before accumulating
    assert float(mean_off.abs().max()) > 1.0
    Frontend(on, cmvn=stats_on)
    Frontend(off, cmvn=stats_off)
    with pytest.raises(ConfigError, match="utterance_cmn=False, but the frontend has utterance_cmn=True"):
        Frontend(on, cmvn=stats_off)
    with pytest.raises(ConfigError, match="recompute"):
        Frontend(off, cmvn=stats_on)
    stats_off.meta.clear()  # stats from elsewhere record no frontend: nothing to check
    Frontend(on, cmvn=stats_off)
