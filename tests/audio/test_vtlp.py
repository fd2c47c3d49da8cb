"""VTLP: the paper's warp against a scalar reference, alpha = 1 as the identity (filterbank and features), warped
filterbanks per utterance in LogMel, Kaldi's VTLN warp in KaldiFbank on the paper's map, training mode only."""
import math

import pytest
import torch
import torchaudio.compliance.kaldi as kaldi

from asrkit.audio.frontend import Frontend, KaldiFbank, LogMel, mel_filterbank, warped_mel_filterbank
from asrkit.audio.vtlp import KALDI_VTLN_LOW, check_boundary, kaldi_vtln_options, warp_frequencies
from asrkit.config import ConfigError, FrontendConfig, VtlpConfig

RATE, NYQ, F_HI = 16000, 8000.0, 4800.0


def _paper_warp(f: float, alpha: float, f_hi: float = F_HI, half: float = NYQ) -> float:
    """Jaitly & Hinton (2013), eq. for the warp, written out for one frequency."""
    if f <= f_hi * min(alpha, 1.0) / alpha:
        return f * alpha
    return half - (half - f_hi * min(alpha, 1.0)) / (half - f_hi * min(alpha, 1.0) / alpha) * (half - f)


@pytest.mark.parametrize("alpha", [0.85, 0.9, 1.0, 1.07, 1.2])
def test_warp_is_the_papers_map(alpha):
    freqs = torch.linspace(0.0, NYQ, 401, dtype=torch.float64)
    warped = warp_frequencies(freqs, torch.tensor([alpha]), F_HI, NYQ)
    ref = torch.tensor([_paper_warp(float(f), alpha) for f in freqs], dtype=torch.float64)
    assert torch.allclose(warped, ref, atol=1e-9)
    assert float(warped[0]) == 0.0 and float(warped[-1]) == pytest.approx(NYQ, abs=1e-9)
    assert bool((warped[1:] > warped[:-1]).all())  # monotonic


def test_warp_at_alpha_one_is_the_identity_and_broadcasts_per_row():
    freqs = torch.linspace(0.0, NYQ, 97, dtype=torch.float64)
    assert torch.allclose(warp_frequencies(freqs, torch.tensor([1.0]), F_HI, NYQ), freqs, atol=1e-9)
    rows = warp_frequencies(freqs[None, :], torch.tensor([[1.0], [1.1]]), F_HI, NYQ)
    assert rows.shape == (2, 97)
    assert torch.allclose(rows[0], freqs, atol=1e-9)
    assert float(rows[1, 10]) == pytest.approx(1.1 * float(freqs[10]))


def test_warped_filterbank_at_alpha_one_is_the_filterbank():
    plain = mel_filterbank(RATE, 512, 40, 20.0, NYQ)
    warped = warped_mel_filterbank(RATE, 512, 40, 20.0, NYQ, torch.tensor([1.0, 1.0]), F_HI)
    assert warped.shape == (2, 40, 257) and warped.dtype == torch.float32
    assert torch.allclose(warped, plain.expand(2, -1, -1), atol=1e-6)


def test_warped_filters_peak_at_the_warped_centres():
    alpha = 1.15
    fb = warped_mel_filterbank(RATE, 4096, 30, 20.0, NYQ, torch.tensor([alpha]), F_HI)[0]  # fine bins: 3.9 Hz
    plain = mel_filterbank(RATE, 4096, 30, 20.0, NYQ)
    bin_hz = NYQ / 2048
    for m in range(30):
        centre = float(plain[m].argmax()) * bin_hz
        assert float(fb[m].argmax()) * bin_hz == pytest.approx(_paper_warp(centre, alpha), abs=2.5 * bin_hz)


def _batch():
    g = torch.Generator().manual_seed(0)
    wav = torch.randn(3, 4000, generator=g) * 0.1
    return wav, torch.tensor([4000, 3500, 2800])


def test_logmel_warps_each_utterance_with_its_own_filterbank():
    cfg = FrontendConfig(n_mels=40)
    lm = LogMel(cfg)
    wav, lens = _batch()
    plain, plain_lens = lm(wav, lens)
    same, _ = lm(wav, lens, torch.ones(3))
    assert torch.equal(same, plain)  # alpha = 1 everywhere: the features themselves
    warp = torch.tensor([1.0, 0.9, 1.1])
    out, out_lens = lm(wav, lens, warp)
    assert torch.equal(out_lens, plain_lens)
    assert torch.allclose(out[0], plain[0], atol=1e-4)
    for b in (1, 2):
        ref = LogMel(cfg)
        ref.mel_fb = warped_mel_filterbank(RATE, 512, 40, 20.0, NYQ, warp[b:b + 1], F_HI)[0].T.contiguous()
        expected, _ = ref(wav[b:b + 1], lens[b:b + 1])
        n = int(out_lens[b])
        assert torch.allclose(out[b, :n], expected[0, :n], atol=1e-4)
        assert not torch.allclose(out[b, :n], plain[b, :n], atol=1e-2)


def test_kaldi_fbank_warps_with_kaldis_vtln_equal_to_the_papers_map():
    cfg = FrontendConfig(kind="kaldi_fbank", n_mels=23)
    fb = KaldiFbank(cfg).eval()
    wav, lens = _batch()
    plain, _ = fb(wav, lens)
    assert torch.equal(fb(wav, lens, torch.ones(3))[0], plain)
    out, out_lens = fb(wav, lens, torch.tensor([1.0, 1.1, 1.0]))
    assert torch.equal(out[0], plain[0]) and torch.equal(out[2], plain[2])
    n = int(out_lens[1])
    x = wav[1, : int(lens[1])] * KaldiFbank.INT16_SCALE
    expected = kaldi.fbank(x[None], dither=0.0, **fb.options, **kaldi_vtln_options(1.1, F_HI))
    assert torch.allclose(out[1, :n], expected, atol=1e-5)
    assert not torch.allclose(out[1, :n], plain[1, :n], atol=1e-2)
    # Kaldi's warped filter centres lie on the paper's map above Kaldi's low cut-off (100 * max(1, alpha) Hz).
    for alpha in (0.9, 1.1):
        args = (23, 512, float(RATE), 20.0, NYQ)
        _, centres = kaldi.get_mel_banks(*args, 100.0, -500.0, 1.0)
        opts = kaldi_vtln_options(alpha, F_HI)
        _, warped = kaldi.get_mel_banks(*args, opts["vtln_low"], opts["vtln_high"], opts["vtln_warp"])
        for c, w in zip(centres.flatten().tolist(), warped.flatten().tolist()):
            if c > KALDI_VTLN_LOW * max(1.0, 1.0 / alpha):
                assert w == pytest.approx(_paper_warp(c, alpha), abs=0.05)


def test_the_frontend_warps_in_training_only():
    cfg = FrontendConfig(n_mels=40)
    front = Frontend(cfg, vtlp=VtlpConfig(prob=0.5))
    wav, lens = _batch()
    warp = torch.tensor([0.9, 1.1, 1.05])
    front.eval()
    plain, _ = front(wav, lens)
    assert torch.equal(front(wav, lens, warp)[0], plain)
    front.train()
    assert torch.equal(front(wav, lens, torch.ones(3))[0], plain)
    assert not torch.allclose(front(wav, lens, warp)[0], plain, atol=1e-2)


def test_the_boundary_must_lie_below_nyquist():
    check_boundary(7999.9, 16000)
    with pytest.raises(ConfigError, match=r"^augment.vtlp.boundary_hz must lie below 8000 Hz, the Nyquist "
                                          r"frequency of frontend.sample_rate 16000; got 8000$"):
        check_boundary(8000.0, 16000)
    with pytest.raises(ConfigError, match=r"^augment.vtlp.boundary_hz must lie below 4000 Hz, the Nyquist "
                                          r"frequency of frontend.sample_rate 8000; got 4800$"):
        Frontend(FrontendConfig(sample_rate=8000, n_fft=256, win_length=200, hop_length=80),
                 vtlp=VtlpConfig(prob=0.5))
    # VTLP off: a config that could not warp still builds
    Frontend(FrontendConfig(sample_rate=8000, n_fft=256, win_length=200, hop_length=80), vtlp=VtlpConfig())
    with pytest.raises(ConfigError, match=r"^augment.vtlp with kind 'kaldi_fbank' needs boundary_hz below "
                                          r"the highest filter edge 4800 Hz"):
        KaldiFbank(FrontendConfig(kind="kaldi_fbank", fmax=4800.0), VtlpConfig(prob=1.0))
    KaldiFbank(FrontendConfig(kind="kaldi_fbank", fmax=4801.0, fmin=99.0), VtlpConfig(prob=1.0))
    with pytest.raises(ConfigError, match=r"frontend.fmin below 100 Hz; got boundary_hz 4800, fmin 100$"):
        KaldiFbank(FrontendConfig(kind="kaldi_fbank", fmin=100.0), VtlpConfig(prob=1.0))
    with pytest.raises(ConfigError, match=r"frontend.fmin below 100 Hz; got boundary_hz 4800, fmin 120$"):
        KaldiFbank(FrontendConfig(kind="kaldi_fbank", fmin=120.0), VtlpConfig(prob=1.0))


def test_vtlp_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^augment.vtlp.prob must be in \[0, 1\], got -0.1$"):
        VtlpConfig(prob=-0.1)
    with pytest.raises(ConfigError, match=r"^augment.vtlp.alpha must be a range \[low, high\] with low <= high"):
        VtlpConfig(alpha=(1.1, 0.9))
    with pytest.raises(ConfigError, match=r"^augment.vtlp.alpha must lie within \[0.5, 2\], got \[0.4, 1.0\]$"):
        VtlpConfig(alpha=(0.4, 1.0))
    with pytest.raises(ConfigError, match=r"^augment.vtlp.boundary_hz must be positive, got 0.0$"):
        VtlpConfig(boundary_hz=0.0)
    assert math.isclose(VtlpConfig().boundary_hz, F_HI)
