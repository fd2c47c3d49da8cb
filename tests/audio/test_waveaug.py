"""The composed waveform augmentation: reproducible per (seed, utterance), kinds drawn independently, probabilities
realised, the SNR of the whole chain, VTLP per speaker; the channel (band, gain)."""
import hashlib
import logging
import math

import numpy as np
import pytest
import torch

from asrkit.audio.channel import apply_gain, band_limit
from asrkit.audio.io import AudioError
from asrkit.audio.noise import coloured_noise, read_noise
from asrkit.audio.reverb import RirSource
from asrkit.audio.waveaug import KINDS, WaveAugment, augment_enabled, check_sources, draw_rng
from asrkit.config import (AugmentConfig, BandConfig, ConfigError, GainConfig, NoiseConfig, ReverbConfig,
                           VtlpConfig)

RATE = 16000


def _speech(seed=0, n=8000):
    rng = np.random.default_rng(seed)
    t = np.arange(n) / RATE
    x = 0.2 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(n)
    return torch.from_numpy(x.astype(np.float32))


def _others(k, rng):
    return [_speech(int(s)) for s in rng.integers(1000, size=k)]


ALL = AugmentConfig(reverb=ReverbConfig(prob=1.0, num_rooms=3, max_order=3),
                    noise=NoiseConfig(prob=1.0), band=BandConfig(prob=1.0), gain=GainConfig(prob=1.0),
                    vtlp=VtlpConfig(prob=1.0))


@pytest.fixture(scope="module")
def everything():
    return WaveAugment(ALL, RATE, seed=1)


def test_the_same_seed_and_utterance_give_the_same_audio_and_others_differ(everything):
    wav = _speech()
    a = everything(wav, "utt1", 1001, others=_others)
    b = everything(wav.clone(), "utt1", 1001, others=_others)
    assert a.applied == b.applied == KINDS  # every kind, in the order of application
    assert torch.equal(a.wav, b.wav) and a.vtlp_alpha == b.vtlp_alpha
    other_utt = everything(wav, "utt2", 1001, others=_others)
    other_epoch = everything(wav, "utt1", 1002, others=_others)
    for c in (other_utt, other_epoch):
        assert not torch.allclose(c.wav, a.wav, atol=1e-3) and c.vtlp_alpha != a.vtlp_alpha
    assert a.wav.shape == wav.shape and a.wav.dtype == torch.float32
    assert torch.equal(wav, _speech())  # the input is not changed in place


def test_each_kind_draws_on_its_own():
    wav = _speech()
    reverb = ReverbConfig(prob=1.0, num_rooms=3, max_order=3)
    alone = WaveAugment(AugmentConfig(reverb=reverb), RATE, seed=1)(wav, "u", 7)
    with_gain = WaveAugment(AugmentConfig(reverb=reverb, gain=GainConfig(prob=1.0, db=(-3.0, -3.0))), RATE,
                            seed=1)(wav, "u", 7)
    assert alone.applied == ("reverb",) and with_gain.applied == ("reverb", "gain")
    assert torch.allclose(with_gain.wav, apply_gain(alone.wav, -3.0), atol=1e-7)


def test_probabilities_are_realised_per_kind():
    cfg = AugmentConfig(reverb=ReverbConfig(prob=0.4, num_rooms=1, max_order=1),
                        noise=NoiseConfig(prob=0.6, generated=("white",)), band=BandConfig(prob=0.3),
                        gain=GainConfig(prob=0.7), vtlp=VtlpConfig(prob=0.5))
    aug = WaveAugment(cfg, RATE, seed=1)
    wav = _speech(n=400)
    counts = {k: 0 for k in KINDS}
    for i in range(400):
        for kind in aug(wav, f"utt{i}", 3).applied:
            counts[kind] += 1
    assert abs(counts["reverb"] / 400 - 0.4) < 0.07
    assert abs(counts["noise"] / 400 - 0.6) < 0.07
    assert abs(counts["band"] / 400 - 0.3) < 0.07
    assert abs(counts["gain"] / 400 - 0.7) < 0.07
    assert abs(counts["vtlp"] / 400 - 0.5) < 0.07
    off = WaveAugment(AugmentConfig(), RATE, seed=1)
    assert off.rirs is None and off.noises is None  # nothing simulated or listed for kinds that are off
    none = off(_speech(), "u", 3)
    assert none.applied == () and none.vtlp_alpha == 1.0 and torch.equal(none.wav, _speech())


@pytest.mark.parametrize("snr", [0.0, 12.5])
def test_the_snr_after_reverberation_is_the_drawn_one(snr):
    cfg = AugmentConfig(reverb=ReverbConfig(prob=1.0, num_rooms=2, max_order=3),
                        noise=NoiseConfig(prob=1.0, snr=(snr, snr), generated=("pink",)))
    wav = _speech()
    out = WaveAugment(cfg, RATE, seed=2)(wav, "u", 5)
    reverberated = WaveAugment(AugmentConfig(reverb=cfg.reverb), RATE, seed=2)(wav, "u", 5).wav.double()
    noise = out.wav.double() - reverberated
    measured = 10 * math.log10(float(reverberated.square().sum()) / float(noise.square().sum()))
    assert abs(measured - snr) < 0.5


def test_snr_draws_cover_the_range():
    cfg = AugmentConfig(noise=NoiseConfig(prob=1.0, snr=(5.0, 20.0), generated=("white",)))
    aug, wav = WaveAugment(cfg, RATE, seed=2), _speech()
    snrs = []
    for i in range(40):
        noise = aug(wav, f"u{i}", 5).wav.double() - wav.double()
        snrs.append(10 * math.log10(float(wav.double().square().sum()) / float(noise.square().sum())))
    assert 5.0 - 0.01 <= min(snrs) < 7.0 and 18.0 < max(snrs) <= 20.0 + 0.01


def test_vtlp_per_speaker_gives_a_speakers_utterances_one_factor():
    cfg = AugmentConfig(vtlp=VtlpConfig(prob=1.0, alpha=(0.9, 1.1), per_speaker=True))
    aug, wav = WaveAugment(cfg, RATE, seed=1), torch.zeros(10)
    a1, a2 = aug(wav, "a-1", 4, speaker="a").vtlp_alpha, aug(wav, "a-2", 4, speaker="a").vtlp_alpha
    b1 = aug(wav, "b-1", 4, speaker="b").vtlp_alpha
    assert a1 == a2 != b1 and 0.9 <= a1 <= 1.1 and 0.9 <= b1 <= 1.1
    rng = draw_rng(4, "speaker a", "vtlp")  # the draw is pinned: a speaker's key, then decide, then the factor
    assert rng.random() < 1.0 and a1 == rng.uniform(0.9, 1.1)
    assert aug(wav, "a-1", 5, speaker="a").vtlp_alpha != a1  # another epoch, another draw
    # without a speaker (no utt2spk), per utterance
    assert aug(wav, "a-1", 4).vtlp_alpha != aug(wav, "a-2", 4).vtlp_alpha
    per_utt = WaveAugment(AugmentConfig(vtlp=VtlpConfig(prob=1.0)), RATE, seed=1)
    assert per_utt(wav, "a-1", 4, speaker="a").vtlp_alpha != per_utt(wav, "a-2", 4, speaker="a").vtlp_alpha


def test_babble_needs_other_utterances():
    aug = WaveAugment(AugmentConfig(noise=NoiseConfig(prob=1.0, generated=("babble",))), RATE, seed=1)
    out = aug(_speech(), "u", 1, others=_others)
    assert out.applied == ("noise",)
    with pytest.raises(ConfigError, match="^augment.noise.generated: babble needs other training utterances, and none "
                                          "were given$"):
        aug(_speech(), "u", 1)


def test_an_unreadable_noise_file_skips_noise_for_that_utterance(tmp_path, caplog):
    (tmp_path / "bad.wav").write_bytes(b"RIFF not audio")
    cfg = AugmentConfig(noise=NoiseConfig(prob=1.0, dirs=(str(tmp_path),), generated=()), gain=GainConfig(prob=1.0))
    with caplog.at_level(logging.WARNING, logger="asrkit.audio"):
        out = WaveAugment(cfg, RATE, seed=1)(_speech(), "u9", 1)
    assert out.applied == ("gain",)
    with pytest.raises(AudioError) as info:
        read_noise(str(tmp_path / "bad.wav"), 10, RATE, np.random.default_rng(0))
    assert [r.getMessage() for r in caplog.records] == [f"utt u9: no noise: {info.value}"]


def test_noise_from_a_directory_at_the_drawn_snr(tmp_path):
    import soundfile as sf

    (tmp_path / "noise").mkdir()
    sf.write(str(tmp_path / "noise" / "hum.wav"), coloured_noise("pink", 4000, np.random.default_rng(0)).numpy() * 0.1,
             8000, subtype="FLOAT")  # at 8 kHz: resampled as it is read
    cfg = AugmentConfig(noise=NoiseConfig(prob=1.0, snr=(7.0, 7.0), dirs=(str(tmp_path / "noise"),), generated=()))
    wav = _speech()
    out = WaveAugment(cfg, RATE, seed=1)(wav, "u", 1)
    noise = out.wav.double() - wav.double()
    assert out.applied == ("noise",)
    assert abs(10 * math.log10(float(wav.double().square().sum()) / float(noise.square().sum())) - 7.0) < 0.5


def test_the_band_is_the_configured_one():
    cfg = AugmentConfig(band=BandConfig(prob=1.0, rate=4000, low_hz=500.0))
    wav = _speech()
    assert torch.equal(WaveAugment(cfg, RATE, seed=1)(wav, "u", 1).wav, band_limit(wav, RATE, 4000, 500.0))


def test_an_unreadable_impulse_response_skips_reverberation(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not audio")
    (tmp_path / "rirs").write_text("bad.wav\n")
    cfg = AugmentConfig(reverb=ReverbConfig(prob=1.0, rir_list="rirs"), gain=GainConfig(prob=1.0))
    with caplog.at_level(logging.WARNING, logger="asrkit.audio"):
        out = WaveAugment(cfg, RATE, seed=1)(_speech(), "u7", 1)
    assert out.applied == ("gain",)
    with pytest.raises(AudioError) as info:
        RirSource(cfg.reverb, RATE, seed=1).draw(np.random.default_rng(0))
    assert [r.getMessage() for r in caplog.records] == [f"utt u7: no reverberation: {info.value}"]


def test_check_sources_reads_what_the_kinds_in_use_read(tmp_path):
    missing = str(tmp_path / "missing")
    check_sources(AugmentConfig(noise=NoiseConfig(prob=0.0, dirs=(missing,)),
                                reverb=ReverbConfig(prob=0.0, rir_list=missing)))  # off: not read
    check_sources(AugmentConfig(reverb=ReverbConfig(prob=0.5)))  # simulated rooms: pyroomacoustics is there
    with pytest.raises(ConfigError, match=r"^augment.noise.dirs: .*missing: no such directory$"):
        check_sources(AugmentConfig(noise=NoiseConfig(prob=0.5, dirs=(missing,))))
    with pytest.raises(ConfigError, match=r"^augment.reverb.rir_list: .*missing: No such file"):
        check_sources(AugmentConfig(reverb=ReverbConfig(prob=0.5, rir_list=missing)))


def test_check_sources_names_the_extra_simulated_rooms_need(monkeypatch):
    from asrkit.audio import waveaug
    from asrkit.extras import MissingExtraError

    def missing(module, purpose):
        raise MissingExtraError(f"{purpose} needs {module}")

    monkeypatch.setattr(waveaug, "require", missing)
    check_sources(AugmentConfig(reverb=ReverbConfig(prob=0.0)))
    with pytest.raises(MissingExtraError, match=r"^augment.reverb \(simulated rooms\) needs pyroomacoustics$"):
        check_sources(AugmentConfig(reverb=ReverbConfig(prob=0.5)))


def test_silent_audio_gets_no_noise():
    aug = WaveAugment(AugmentConfig(noise=NoiseConfig(prob=1.0, generated=("white",))), RATE, seed=1)
    out = aug(torch.zeros(100), "u", 1)
    assert out.applied == () and torch.equal(out.wav, torch.zeros(100))


def test_draws_are_pinned_so_resumed_runs_of_other_versions_agree():
    # blake2b of the id, not Python's per-process hash(): the same draw in every worker and every run
    assert draw_rng(1, "utt1", "noise").random() == draw_rng(1, "utt1", "noise").random()
    assert draw_rng(1, "utt1", "noise").random() != draw_rng(1, "utt1", "gain").random()
    digest = int.from_bytes(hashlib.blake2b(b"utt1", digest_size=8).digest(), "little")
    assert draw_rng(1, "utt1", "noise").random() == np.random.default_rng([1, digest, 1]).random()


def test_augment_enabled():
    assert not augment_enabled(AugmentConfig())
    for kind in KINDS:
        section = {"reverb": ReverbConfig, "noise": NoiseConfig, "band": BandConfig, "gain": GainConfig,
                   "vtlp": VtlpConfig}[kind]
        assert augment_enabled(AugmentConfig(**{kind: section(prob=0.01)}))


def _power(x):
    return float(x.double().square().mean())


def _sine(freq, n=16000):
    return torch.sin(2 * math.pi * freq * torch.arange(n, dtype=torch.float64) / RATE).float() * 0.5


def test_band_limit_keeps_the_telephone_band_and_removes_the_rest():
    for freq, low, high in ((1000, 0.9, 1.05), (6000, 0.0, 1e-3), (100, 0.0, 0.15)):
        x = _sine(freq)
        out = band_limit(x, RATE, 8000, 300.0)
        assert out.shape == x.shape
        mid = slice(2000, 14000)  # away from the filters' edges
        assert low <= _power(out[mid]) / _power(x[mid]) <= high, freq
    # no high-pass: 100 Hz passes; a rate at or above the sample rate keeps the top
    assert _power(band_limit(_sine(100), RATE, 8000, 0.0)[2000:14000]) / _power(_sine(100)[2000:14000]) > 0.95
    assert torch.equal(band_limit(_sine(6000), RATE, 16000, 0.0), _sine(6000))
    odd = torch.randn(12345)
    assert band_limit(odd, RATE, 8000, 300.0).numel() == 12345


def test_gain_scales_by_decibels_and_clips():
    x = torch.tensor([0.1, -0.2, 0.6])
    assert torch.allclose(apply_gain(x, 6.0), torch.tensor([0.1, -0.2, 1.0]) * torch.tensor([10 ** 0.3, 10 ** 0.3, 1]))
    assert torch.allclose(apply_gain(x, -20.0), x / 10)
    assert float(apply_gain(torch.tensor([-0.9]), 6.0)) == -1.0


def test_channel_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^augment.band.prob must be in \[0, 1\], got 2.0$"):
        BandConfig(prob=2.0)
    with pytest.raises(ConfigError, match=r"^augment.band.rate must be at least 1, got 0$"):
        BandConfig(rate=0)
    with pytest.raises(ConfigError, match=r"^augment.band.low_hz must be >= 0, got -1.0$"):
        BandConfig(low_hz=-1.0)
    with pytest.raises(ConfigError, match=r"^augment.gain.db must be a range \[low, high\] with low <= high, "
                                          r"got \[6.0, -6.0\]$"):
        GainConfig(db=(6.0, -6.0))
    with pytest.raises(ConfigError, match=r"^augment.gain.db must be a range \[low, high\] with low <= high, "
                                          r"got \[1.0\]$"):
        GainConfig(db=(1.0,))
    with pytest.raises(ConfigError, match=r"^augment.reverb.prob must be in \[0, 1\], got 1.01$"):
        ReverbConfig(prob=1.01)
    with pytest.raises(ConfigError, match=r"^augment.reverb.absorption must lie within \[0.01, 1\], got "
                                          r"\[0.0, 0.5\]$"):
        ReverbConfig(absorption=(0.0, 0.5))
    with pytest.raises(ConfigError, match=r"^augment.reverb.num_rooms must be at least 1, got 0$"):
        ReverbConfig(num_rooms=0)
    with pytest.raises(ConfigError, match=r"^augment.reverb.distance must be a range"):
        ReverbConfig(distance=(3.0, 1.0))


def test_augment_config_bounds_are_inclusive_and_errors_name_the_key():
    # the least and largest values a range or count may take are accepted
    ReverbConfig(max_order=0, room_length=(1.0, 1.0), room_width=(1.0, 2.0), room_height=(1.0, 3.0),
                 absorption=(0.01, 1.0), distance=(0.1, 0.1))
    NoiseConfig(babble_utts=(1, 1), prob=0.0, generated=())  # no source is fine while noise is off
    VtlpConfig(alpha=(0.5, 2.0), boundary_hz=0.5)
    BandConfig(low_hz=0.0)
    BandConfig(low_hz=0.5)
    for kwargs, message in (
            (dict(max_order=-1), r"augment.reverb.max_order must be at least 0, got -1"),
            (dict(room_length=(0.5, 3.0)), r"augment.reverb.room_length must lie within \[1, inf\], got \[0.5, 3.0\]"),
            (dict(room_width=(0.9, 3.0)), r"augment.reverb.room_width must lie within \[1, inf\]"),
            (dict(room_height=(0.99, 3.0)), r"augment.reverb.room_height must lie within \[1, inf\]"),
            (dict(distance=(0.05, 1.0)), r"augment.reverb.distance must lie within \[0.1, inf\], got \[0.05, 1.0\]")):
        with pytest.raises(ConfigError, match=f"^{message}"):
            ReverbConfig(**kwargs)
    with pytest.raises(ConfigError, match=r"^augment.noise.prob is 0.5 but there is no noise source: set "
                                          r"augment.noise.dirs or augment.noise.generated$"):
        NoiseConfig(prob=0.5, generated=())
    with pytest.raises(ConfigError, match=r"^augment.gain.prob must be in \[0, 1\], got 1.5$"):
        GainConfig(prob=1.5)
