"""Feature extractors against librosa / torchaudio references, batch independence and exact frame counts."""
from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch
import torchaudio.compliance.kaldi as kaldi

from asrkit.audio.cmvn import GlobalCMVN
from asrkit.audio.frontend import Frontend, KaldiFbank, LogMel, build_frontend, mel_filterbank
from asrkit.config import ConfigError, FrontendConfig, SpecAugmentConfig, SpeedPerturbConfig, load_config, to_dict


def _speechlike(n: int, seed: int, sr: int = 16000) -> torch.Tensor:
    """A few harmonics plus noise, amplitude well inside [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / sr
    f0 = 100 + 100 * torch.rand((), generator=g)
    x = sum(torch.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
    return (0.1 * x + 0.01 * torch.randn(n, generator=g)).float()


def _batch(lengths, seed=0, pad_noise=True, sr=16000):
    """Pad with *noise* (not zeros) so any leak of padding into features shows up."""
    wav = torch.randn(len(lengths), max(lengths), generator=torch.Generator().manual_seed(seed)) if pad_noise \
        else torch.zeros(len(lengths), max(lengths))
    for b, n in enumerate(lengths):
        wav[b, :n] = _speechlike(n, seed + b, sr)
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind,window", [("logmel", "hann"), ("kaldi_fbank", "povey")])
def test_cuda_features_equal_cpu_features(kind, window):
    fe = build_frontend(FrontendConfig(kind=kind, window=window)).eval()
    wav, lens = _batch([9000, 4000, 399, 1234], seed=4)
    feats, feat_lens = fe(wav, lens)
    gpu, gpu_lens = fe.cuda()(wav.cuda(), lens.cuda())
    assert gpu.is_cuda and torch.equal(gpu_lens.cpu(), feat_lens)
    torch.testing.assert_close(gpu.cpu(), feats, atol=2e-3, rtol=1e-4)  # log of FFT power: cuFFT vs pocketfft


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


def _kaldi_fbank_numpy(x: np.ndarray, sr: int, win: int, hop: int, n_mels: int, low: float, high: float,
                       window: str, remove_dc: bool = True) -> np.ndarray:
    """Kaldi ``compute-fbank`` (default options, dither 0, snip_edges) written out in float64 numpy.

    ``x`` holds the samples on Kaldi's int16 scale. Follows feature-window.cc / mel-computations.cc:
    frames of ``win`` samples every ``hop`` (only whole frames), DC offset removed per frame,
    pre-emphasis 0.97 (the first sample against itself), window, zero padding to the next power of two,
    power spectrum, triangles equally spaced in Kaldi mel (1127 ln(1 + f/700)) between ``low`` and
    ``high`` (``high <= 0``: offset from Nyquist) over the FFT bins below Nyquist, log with a floor of
    float32 epsilon. Returns (frames, n_mels). ``remove_dc=False`` only serves to show the test's sensitivity.
    """
    num_frames = 1 + (len(x) - win) // hop if len(x) >= win else 0
    frames = np.stack([x[t * hop:t * hop + win] for t in range(num_frames)]).astype(np.float64)
    if remove_dc:
        frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1)
    n = np.arange(win)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / (win - 1))  # Kaldi's windows are symmetric (N - 1)
    w = {"povey": hann ** 0.85, "hanning": hann, "hamming": 0.54 - 0.46 * np.cos(2 * np.pi * n / (win - 1))}[window]
    padded = 1 << (win - 1).bit_length()
    spec = np.fft.rfft(frames * w, n=padded)
    power = spec.real ** 2 + spec.imag ** 2  # (F, padded/2 + 1)

    def mel(f):
        return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)

    high = high if high > 0 else sr / 2 + high
    delta = (mel(high) - mel(low)) / (n_mels + 1)
    left = mel(low) + delta * np.arange(n_mels)[:, None]
    center, right = left + delta, left + 2 * delta
    m = mel(np.arange(padded // 2) * sr / padded)[None, :]  # Kaldi's banks skip the Nyquist bin
    banks = np.where((m > left) & (m < right), np.where(m <= center, (m - left) / (center - left),
                                                        (right - m) / (right - center)), 0.0)  # (M, K)
    energies = power[:, :padded // 2] @ banks.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps))


@pytest.mark.parametrize("window,sr,win,hop,n_mels,fmin,fmax", [
    ("povey", 16000, 400, 160, 40, 40.0, None),
    ("hamming", 16000, 400, 160, 40, 40.0, 7000.0),
    ("hann", 8000, 200, 80, 23, 20.0, 3800.0),  # another rate, window size and FFT size
])
def test_kaldi_fbank_equals_numpy_reference(window, sr, win, hop, n_mels, fmin, fmax):
    n_fft = 1 << (win - 1).bit_length()
    cfg = FrontendConfig(kind="kaldi_fbank", sample_rate=sr, win_length=win, hop_length=hop, n_fft=n_fft,
                         window=window, n_mels=n_mels, fmin=fmin, fmax=fmax)
    fe = build_frontend(cfg).eval()
    assert isinstance(fe, KaldiFbank) and fe.output_dim == n_mels
    lengths = [7000, 5000, 6100]
    wav, lens = _batch(lengths, seed=5, sr=sr)  # noise in the padding
    wav[1, :lengths[1]] += 0.05  # a DC offset (cheap microphones): Kaldi removes it per frame
    feats, feat_lens = fe(wav, lens)
    kaldi_window = "hanning" if window == "hann" else window
    refs = [_kaldi_fbank_numpy(wav[b, :n].double().numpy() * 32768.0, sr, win, hop, n_mels, fmin, fmax or 0.0,
                               kaldi_window) for b, n in enumerate(lengths)]
    for b, ref in enumerate(refs):
        # Frame count: snip_edges framing with the configured window and hop in samples (centred framing,
        # or a hop/window lost in the conversion to Kaldi's milliseconds, changes it).
        assert int(feat_lens[b]) == ref.shape[0] == (lengths[b] - win) // hop + 1
        # Values (float32 module vs float64 reference: ~1e-5 apart here): catches a missing or wrong int16
        # scaling (x32768 shifts every log energy by 2 ln 32768 = 20.8), the configured window ignored
        # (> 0.3 off), fmin/fmax or the sample rate not passed on (> 1 off), no pre-emphasis (> 4), a
        # magnitude instead of a power spectrum (~10), an FFT not padded to a power of two (> 0.8), no DC
        # removal (utterance 1, > 0.015) and padding samples read into an utterance's frames (noise follows
        # each utterance in the batch).
        np.testing.assert_allclose(feats[b, :ref.shape[0]].double().numpy(), ref, atol=5e-4, rtol=0)
        # Frames past the utterance are exactly 0, not features of the padding noise.
        assert torch.all(feats[b, ref.shape[0]:] == 0)
    # The tolerance is far below the effect of the subtlest bugs, so the comparison above fails for them.
    x = wav[1, :lengths[1]].double().numpy() * 32768.0
    args = (sr, win, hop, n_mels, fmin, fmax or 0.0)
    other_window = "hamming" if kaldi_window != "hamming" else "povey"
    assert np.abs(_kaldi_fbank_numpy(x, *args, other_window) - refs[1]).max() > 0.1
    assert np.abs(_kaldi_fbank_numpy(x, *args, kaldi_window, remove_dc=False) - refs[1]).max() > 0.01
    assert np.abs(_kaldi_fbank_numpy(x / 32768.0, *args, kaldi_window) - refs[1]).min() > 20.0


def test_numpy_kaldi_reference_agrees_with_torchaudio():
    # Checks the reference above against torchaudio's Kaldi port (so a mistake in the reference cannot make
    # both it and the module wrong in the same way unnoticed). The module itself is checked against numpy.
    x = _speechlike(6000, seed=9) * 32768.0 + 1000.0
    for window, low, high in [("povey", 20.0, 0.0), ("hamming", 64.0, -400.0), ("hanning", 0.0, 7600.0)]:
        ref = _kaldi_fbank_numpy(x.double().numpy(), 16000, 400, 160, 40, low, high, window)
        ta = kaldi.fbank(x[None], num_mel_bins=40, frame_length=25.0, frame_shift=10.0, low_freq=low,
                         high_freq=high, window_type=window, dither=0.0, sample_frequency=16000.0, snip_edges=True)
        np.testing.assert_allclose(ta.double().numpy(), ref, atol=5e-4, rtol=0)


def test_kaldi_dither_only_in_training():
    fe = build_frontend(FrontendConfig(kind="kaldi_fbank", window="povey", dither=1.0))
    wav, lens = _batch([4000, 3000], seed=2)
    clean = build_frontend(FrontendConfig(kind="kaldi_fbank", window="povey", dither=0.0))(wav, lens)[0]
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


def test_kaldi_fbank_defaults_are_kaldis_and_decoding_is_deterministic():
    """kind kaldi_fbank without window/dither: Kaldi compute-fbank's povey window and dither 1.0 (training only)."""
    cfg = FrontendConfig(kind="kaldi_fbank")
    assert (cfg.window, cfg.dither) == ("povey", 1.0)
    assert (FrontendConfig().window, FrontendConfig().dither) == ("hann", 0.0)  # logmel's are unchanged
    # An explicit setting wins over the kind's default, and 0 is a setting, not "unset".
    explicit = FrontendConfig(kind="kaldi_fbank", window="hamming", dither=0.0)
    assert (explicit.window, explicit.dither) == ("hamming", 0.0)
    fe = build_frontend(cfg)
    lengths = [6000, 4500]
    wav, lens = _batch(lengths, seed=11)
    # Eval mode (decoding, validation, compute-cmvn): no dither, so the same input gives the same features,
    # equal to Kaldi's with the povey window at dither 0.
    fe.eval()
    first, feat_lens = fe(wav, lens)
    assert torch.equal(first, fe(wav, lens)[0])
    for b, n in enumerate(lengths):
        ref = _kaldi_fbank_numpy(wav[b, :n].double().numpy() * 32768.0, 16000, 400, 160, 80, 20.0, 0.0, "povey")
        assert int(feat_lens[b]) == ref.shape[0]
        np.testing.assert_allclose(first[b, :ref.shape[0]].double().numpy(), ref, atol=5e-4, rtol=0)
    # Training mode dithers by default (Gaussian, 1.0 in int16 units): every draw differs, by little.
    fe.train()
    a, b = fe(wav, lens)[0], fe(wav, lens)[0]
    assert not torch.equal(a, first) and not torch.equal(a, b)
    assert (a - first).abs().max() < 1.0
    assert torch.equal(build_frontend(explicit).train()(wav, lens)[0],
                       build_frontend(explicit).eval()(wav, lens)[0])  # dither 0: none in training either


def test_frontend_defaults_are_written_out_when_loaded(tmp_path):
    """A config that leaves window/dither to the kind records what it used (config.yaml of an experiment)."""
    path = tmp_path / "c.yaml"
    path.write_text("frontend:\n  kind: kaldi_fbank\n", encoding="utf-8")
    cfg = load_config(path)
    assert to_dict(cfg)["frontend"]["window"] == "povey" and to_dict(cfg)["frontend"]["dither"] == 1.0
    with pytest.raises(ConfigError, match=r"c.yaml: frontend.kind 'mfcc' is unknown \(choose from: logmel, "
                                          r"kaldi_fbank\)"):
        path.write_text("frontend:\n  kind: mfcc\n", encoding="utf-8")
        load_config(path)
