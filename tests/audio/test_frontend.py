"""Feature extractors against librosa / torchaudio references, batch independence and exact frame counts."""
from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch
import torchaudio.compliance.kaldi as kaldi

from asrkit.audio.cmvn import GlobalCMVN
from asrkit.audio.frontend import Frontend, KaldiFbank, LogMel, build_frontend, mel_filterbank
from asrkit.config import ConfigError, FrontendConfig, SpecAugmentConfig, SpeedPerturbConfig


def _speechlike(n: int, seed: int, sr: int = 16000) -> torch.Tensor:
    """A few harmonics plus noise, amplitude well inside [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / sr
    f0 = 100 + 100 * torch.rand((), generator=g)
    x = sum(torch.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
    return (0.1 * x + 0.01 * torch.randn(n, generator=g)).float()


def _batch(lengths, seed=0, pad_noise=True):
    """Pad with *noise* (not zeros) so any leak of padding into features shows up."""
    wav = torch.randn(len(lengths), max(lengths), generator=torch.Generator().manual_seed(seed)) if pad_noise \
        else torch.zeros(len(lengths), max(lengths))
    for b, n in enumerate(lengths):
        wav[b, :n] = _speechlike(n, seed + b)
    return wav, torch.tensor(lengths)


@pytest.mark.parametrize("sr,n_fft,n_mels,fmin,fmax", [
    (16000, 512, 80, 20.0, None), (16000, 400, 40, 0.0, 7600.0), (8000, 256, 23, 64.0, None)])
def test_mel_filterbank_matches_librosa(sr, n_fft, n_mels, fmin, fmax):
    ours = mel_filterbank(sr, n_fft, n_mels, fmin, fmax or sr / 2).numpy()
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=True, norm=None)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window,n_fft,win", [("hann", 512, 400), ("hamming", 400, 400), ("hann", 512, 320)])
def test_logmel_matches_librosa(window, n_fft, win):
    cfg = FrontendConfig(n_fft=n_fft, win_length=win, hop_length=160, window=window, n_mels=40, fmin=20.0)
    y = _speechlike(8000, seed=3)
    feats, lens = build_frontend(cfg)(y[None], torch.tensor([8000]))
    # librosa (center=False) frames n_fft samples with the window centred; shifting the signal by the
    # centring offset puts window i on samples [i*hop, i*hop + win): our documented framing.
    left = (n_fft - win) // 2
    yp = np.concatenate([np.zeros(left), y.double().numpy(), np.zeros(n_fft - win - left)])
    power = librosa.feature.melspectrogram(y=yp, sr=16000, n_fft=n_fft, hop_length=160, win_length=win,
                                           window=window, center=False, power=2.0, n_mels=40, fmin=20.0,
                                           htk=True, norm=None)
    ref = np.log(np.maximum(power, cfg.log_floor)).T  # (F, M)
    assert int(lens[0]) == feats.shape[1] == ref.shape[0] == (8000 - win) // 160 + 1
    np.testing.assert_allclose(feats[0].numpy(), ref, atol=2e-3, rtol=0)


@pytest.mark.parametrize("kind,window", [("logmel", "hann"), ("kaldi_fbank", "povey")])
def test_batch_equals_single_and_padding_is_zero(kind, window):
    fe = build_frontend(FrontendConfig(kind=kind, window=window)).eval()
    lengths = [9000, 4000, 4567, 399, 400, 1234]  # 399: shorter than one window -> 0 frames
    wav, lens = _batch(lengths)
    feats, feat_lens = fe(wav, lens)
    assert feats.shape == (6, (9000 - 400) // 160 + 1, 80)
    for b, n in enumerate(lengths):
        single, single_len = fe(wav[b:b + 1, :n], lens[b:b + 1])
        assert int(single_len[0]) == int(feat_lens[b]) == single.shape[1]
        torch.testing.assert_close(feats[b, :single.shape[1]], single[0], atol=1e-4, rtol=1e-5)
        assert torch.all(feats[b, int(feat_lens[b]):] == 0.0)
    # Extra padding after the longest utterance changes nothing either.
    wider, wider_lens = fe(torch.cat([wav, torch.randn(6, 1000)], dim=1), lens)
    torch.testing.assert_close(wider[:, :feats.shape[1]], feats, atol=1e-4, rtol=1e-5)
    assert torch.equal(wider_lens, feat_lens) and torch.all(wider[:, feats.shape[1]:] == 0)


@pytest.mark.parametrize("kind,hop,win,n_fft", [("logmel", 160, 400, 512), ("logmel", 128, 256, 256),
                                                ("kaldi_fbank", 160, 400, 512)])
def test_feature_lengths_are_exact(kind, hop, win, n_fft):
    window = "hann"
    fe = build_frontend(FrontendConfig(kind=kind, hop_length=hop, win_length=win, n_fft=n_fft, window=window))
    rng = np.random.default_rng(0)
    lengths = sorted({1, win - 1, win, win + 1, win + hop - 1, win + hop, *rng.integers(1, 5000, 20).tolist()})
    for n in lengths:
        y = _speechlike(n, seed=n)
        feats, feat_lens = fe(y[None], torch.tensor([n]))
        assert int(feat_lens[0]) == feats.shape[1], n
        assert int(fe.num_frames(torch.tensor(n))) == feats.shape[1]
        if n >= win and kind == "kaldi_fbank":  # torchaudio's own frame count (snip_edges=True)
            assert feats.shape[1] == kaldi.fbank(y[None] * 32768, num_mel_bins=80, snip_edges=True).shape[0]
        if n >= win and kind == "logmel":  # librosa's frame count for the centring-shifted signal
            assert feats.shape[1] == librosa.util.frame(np.zeros(n + n_fft - win), frame_length=n_fft,
                                                        hop_length=hop).shape[1]
        assert feats.shape[1] == (max(0, (n - win) // hop + 1))


def test_all_shorter_than_a_window_gives_empty_features():
    for kind in ("logmel", "kaldi_fbank"):
        feats, lens = build_frontend(FrontendConfig(kind=kind, window="povey" if kind != "logmel" else "hann"))(
            torch.zeros(2, 300), torch.tensor([300, 100]))
        assert feats.shape == (2, 0, 80) and lens.tolist() == [0, 0]


@pytest.mark.parametrize("window,fmax", [("povey", None), ("hamming", 7000.0)])
def test_kaldi_fbank_equals_torchaudio(window, fmax):
    cfg = FrontendConfig(kind="kaldi_fbank", window=window, n_mels=40, fmin=40.0, fmax=fmax)
    fe = build_frontend(cfg).eval()
    assert isinstance(fe, KaldiFbank) and fe.output_dim == 40
    wav, lens = _batch([7000, 5000, 6100], seed=5)
    feats, feat_lens = fe(wav, lens)
    for b, n in enumerate(lens.tolist()):
        # Kaldi reads 16-bit PCM as integers: the module scales [-1, 1] floats by 32768.
        ref = kaldi.fbank(wav[b:b + 1, :n] * 32768.0, num_mel_bins=40, frame_length=25.0, frame_shift=10.0,
                          low_freq=40.0, high_freq=fmax or 0.0, window_type=window.replace("hann", "hanning"),
                          dither=0.0, sample_frequency=16000.0)
        assert int(feat_lens[b]) == ref.shape[0]
        torch.testing.assert_close(feats[b, :ref.shape[0]], ref, atol=1e-5, rtol=1e-5)


def test_kaldi_dither_only_in_training():
    fe = build_frontend(FrontendConfig(kind="kaldi_fbank", window="povey", dither=1.0))
    wav, lens = _batch([4000, 3000], seed=2)
    clean = build_frontend(FrontendConfig(kind="kaldi_fbank", window="povey"))(wav, lens)[0]
    assert torch.equal(fe.eval()(wav, lens)[0], clean)
    fe.train()
    torch.manual_seed(7)
    a = fe(wav, lens)[0]
    torch.manual_seed(7)
    b = fe(wav, lens)[0]
    assert torch.equal(a, b) and not torch.equal(a, clean)
    assert (a - clean).abs().max() < 1.0  # tiny dither on a loud signal: small change


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="frontend.kind 'mfcc'"):
        build_frontend(FrontendConfig(kind="mfcc"))
    with pytest.raises(ConfigError, match="set frontend.n_fft to 256"):
        build_frontend(FrontendConfig(kind="kaldi_fbank", win_length=200, n_fft=512))
    with pytest.raises(ConfigError, match="frontend.window 'povey'"):
        build_frontend(FrontendConfig(kind="logmel", window="povey"))
    with pytest.raises(ConfigError, match="win_length <= n_fft"):
        build_frontend(FrontendConfig(n_fft=256, win_length=400))
    with pytest.raises(ConfigError, match="fmax"):
        build_frontend(FrontendConfig(fmax=9000.0))


def test_frontend_composition_eval_is_features_plus_cmvn():
    cfg = FrontendConfig(n_mels=40)
    mean, istd = torch.randn(40), torch.rand(40) + 0.5
    fe = Frontend(cfg, SpecAugmentConfig(enabled=True), SpeedPerturbConfig(enabled=True), (mean, istd)).eval()
    assert fe.output_dim == 40 and {"cmvn.mean", "cmvn.istd"} <= set(fe.state_dict())
    wav, lens = _batch([6000, 4000])
    feats, feat_lens = fe(wav, lens)
    ref, ref_lens = LogMel(cfg)(wav, lens)
    ref, _ = GlobalCMVN(mean, istd)(ref, ref_lens)
    assert torch.equal(feat_lens, ref_lens)
    torch.testing.assert_close(feats, ref)
    with pytest.raises(ConfigError, match="dimension 80"):
        Frontend(cfg, cmvn=(torch.zeros(80), torch.ones(80)))


def test_frontend_training_augments_deterministically():
    fe = Frontend(FrontendConfig(), SpecAugmentConfig(enabled=True, time_warp=3),
                  SpeedPerturbConfig(enabled=True, factors=(0.9, 1.1)), (torch.zeros(80), torch.ones(80))).train()
    wav, lens = _batch([16000, 12000], pad_noise=False)
    clean, clean_lens = fe.eval()(wav, lens)
    fe.train()
    torch.manual_seed(0)
    a, a_lens = fe(wav, lens)
    torch.manual_seed(0)
    b, b_lens = fe(wav, lens)
    assert torch.equal(a, b) and torch.equal(a_lens, b_lens)
    assert not torch.equal(a_lens, clean_lens)  # factors exclude 1.0, so every length changes
    for i in range(2):
        assert torch.all(a[i, int(a_lens[i]):] == 0)


def test_specaugment_masks_become_zero_after_cmvn():
    mean, istd = torch.randn(80) - 10, torch.rand(80) + 0.5
    fe = Frontend(FrontendConfig(), SpecAugmentConfig(enabled=True, num_time_masks=0, freq_mask_width=10),
                  cmvn=(mean, istd))
    wav, lens = _batch([16000, 9000], pad_noise=False)
    torch.manual_seed(2)
    feats, feat_lens = fe.train()(wav, lens)
    zero_bins = (feats[0] == 0).all(0)  # masked mel bins, across all frames of utterance 0
    assert 1 <= int(zero_bins.sum()) <= 20
    assert not (fe.eval()(wav, lens)[0][0] == 0).all(0).any()
