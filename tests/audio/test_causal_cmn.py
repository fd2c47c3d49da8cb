"""The streaming form of per-utterance CMN (``frontend.utterance_cmn: causal``): against a frame-by-frame numpy
reference loop, its place after global CMVN (and before SpecAugment) in training and decoding, chunked steps equal
to the whole utterance, the config key, and compute-cmvn's stats for it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asrkit.audio.cmvn import CMVNStats
from asrkit.audio.frontend import Frontend
from asrkit.audio.utterance_cmn import CausalCMN, UtteranceCMN, build_utterance_cmn
from asrkit.cli.compute_cmvn import compute_cmvn
from asrkit.config import ConfigError, ExperimentConfig, FrontendConfig, SpecAugmentConfig, from_dict, load_config
from tests.audio.test_utterance_cmn import _data_dir, _speech


def _reference(x: np.ndarray, n: int, prior_frames: float) -> np.ndarray:
    """Frame by frame: frame t minus the mean of frames 0..t, that mean started from 0 with weight prior_frames."""
    out = np.zeros_like(x, dtype=np.float64)
    total = np.zeros(x.shape[1], dtype=np.float64)
    for t in range(n):
        total += x[t]
        out[t] = x[t] - total / (prior_frames + t + 1)
    return out


@pytest.mark.parametrize("prior_frames", [0.0, 100.0, 2.5])
def test_matches_frame_by_frame_reference_and_keeps_padding_zero(prior_frames):
    feats = torch.randn(4, 9, 5) * 3 + 2
    lens = torch.tensor([9, 4, 1, 0])
    out, out_lens = CausalCMN(prior_frames)(feats, lens)
    assert torch.equal(out_lens, lens) and out.dtype == torch.float32  # summed in float64, returned as given
    for b, n in enumerate(lens.tolist()):
        ref = _reference(feats[b].double().numpy(), n, prior_frames)
        np.testing.assert_allclose(out[b, :n].double().numpy(), ref[:n], atol=1e-5)
        assert torch.all(out[b, n:] == 0)
    if prior_frames == 0.0:  # no prior: a first frame is its own mean
        assert torch.all(out[:, 0][lens > 0] == 0)


def test_steps_over_chunks_equal_the_whole_utterance_and_a_reset_restarts_from_the_prior():
    cmn = CausalCMN(50.0)
    x = torch.randn(1, 40, 6) * 2 + 1
    whole, _ = cmn(x, torch.tensor([40]))
    state = cmn.initial_state(6)
    assert state.total.dtype == torch.float64 and state.frames == 0
    pieces = []
    for a, b in [(0, 1), (1, 1), (1, 17), (17, 18), (18, 40)]:  # an empty chunk too
        y, state = cmn.step(x[0, a:b], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces), whole[0], atol=1e-6, rtol=0)
    assert state.frames == 40
    # a new utterance from frame 25 on: as if it were an utterance of its own
    y, _ = cmn.step(x[0, 25:], cmn.initial_state(6))
    torch.testing.assert_close(y, cmn(x[:, 25:], torch.tensor([15]))[0][0], atol=1e-6, rtol=0)


def test_prior_weight_must_be_non_negative():
    with pytest.raises(ConfigError, match="frontend.utterance_cmn_prior_frames must be >= 0, got -1"):
        FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=-1)


def test_config_key_takes_true_false_or_causal():
    assert FrontendConfig(utterance_cmn="causal").utterance_cmn == "causal"
    cfg = from_dict(ExperimentConfig, {"frontend": {"utterance_cmn": "causal"}})
    assert cfg.frontend.utterance_cmn == "causal"
    assert from_dict(ExperimentConfig, {"frontend": {"utterance_cmn": True}}).frontend.utterance_cmn is True
    with pytest.raises(ConfigError, match="frontend.utterance_cmn must be true, false or causal, got 'running'"):
        from_dict(ExperimentConfig, {"frontend": {"utterance_cmn": "running"}})
    with pytest.raises(ConfigError, match="frontend.utterance_cmn: expected true/false or a string, got 1"):
        from_dict(ExperimentConfig, {"frontend": {"utterance_cmn": 1}})
    with pytest.raises(ConfigError, match="frontend.utterance_cmn must be true, false or causal, got 1"):
        FrontendConfig(utterance_cmn=1)  # 1 == True in Python, but no setting


def test_set_override_reads_causal(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("frontend:\n  utterance_cmn: true\n")
    assert load_config(conf, ["frontend.utterance_cmn=causal"]).frontend.utterance_cmn == "causal"
    assert load_config(conf, ["frontend.utterance_cmn=false"]).frontend.utterance_cmn is False


def test_build_picks_the_module_of_each_setting():
    assert build_utterance_cmn(FrontendConfig()) is None
    assert isinstance(build_utterance_cmn(FrontendConfig(utterance_cmn=True)), UtteranceCMN)
    causal = build_utterance_cmn(FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=7))
    assert isinstance(causal, CausalCMN) and causal.prior_frames == 7.0


def test_frontend_applies_it_after_global_cmvn_in_decoding_and_before_specaugment_in_training():
    mean, istd = torch.randn(80), torch.rand(80) + 0.5
    cfg = FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=30)
    fe = Frontend(cfg, SpecAugmentConfig(enabled=True, num_time_masks=0, freq_mask_width=10), cmvn=(mean, istd))
    assert fe.utterance_cmn is None and fe.causal_cmn is not None
    wav, lens = torch.stack([_speech(16000, 2), _speech(16000, 3)]), torch.tensor([16000, 11000])
    x, x_lens = fe.extractor(wav, lens)
    out = fe.eval()(wav, lens)[0]
    for b, n in enumerate(x_lens.tolist()):
        g = ((x[b, :n] - mean) * istd).double().numpy()
        np.testing.assert_allclose(out[b, :n].double().numpy(), _reference(g, n, 30.0), atol=1e-4)
        assert torch.all(out[b, n:] == 0)
    torch.manual_seed(2)
    feats, _ = fe.train()(wav, lens)
    masked = (feats[0, : int(x_lens[0])] == 0).all(0)  # masks fill with 0, the mean of what the model sees
    assert 1 <= int(masked.sum()) <= 20
    kept = ~masked
    torch.testing.assert_close(feats[0, : int(x_lens[0])][:, kept], out[0, : int(x_lens[0])][:, kept])


def test_gain_invariant_without_a_prior():
    wav, lens = _speech(12000, 0)[None], torch.tensor([12000])
    fe = Frontend(FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=0)).eval()
    torch.testing.assert_close(fe(wav, lens)[0], fe(wav * 3.0, lens)[0], atol=1e-3, rtol=0)


def test_a_prior_needs_global_cmvn():
    with pytest.raises(ConfigError, match="frontend.utterance_cmn_prior_frames=100.0 needs global CMVN stats"):
        Frontend(FrontendConfig(utterance_cmn="causal"))
    Frontend(FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=0))


def test_compute_cmvn_takes_the_stats_before_it_and_the_stats_check_knows(tmp_path):
    data = _data_dir(tmp_path)
    causal = FrontendConfig(utterance_cmn="causal")
    compute_cmvn(data, tmp_path / "causal.json", causal, progress=False)
    compute_cmvn(data, tmp_path / "off.json", FrontendConfig(), progress=False)
    compute_cmvn(data, tmp_path / "on.json", FrontendConfig(utterance_cmn=True), progress=False)
    stats = CMVNStats.load(tmp_path / "causal.json")
    assert stats.meta["frontend"]["utterance_cmn"] == "causal"
    torch.testing.assert_close(stats.sum, CMVNStats.load(tmp_path / "off.json").sum)  # the extractor's features
    Frontend(causal, cmvn=stats)
    Frontend(causal, cmvn=CMVNStats.load(tmp_path / "off.json"))
    Frontend(FrontendConfig(), cmvn=stats)
    with pytest.raises(ConfigError, match="utterance_cmn=True, but the frontend has utterance_cmn=causal"):
        Frontend(causal, cmvn=CMVNStats.load(tmp_path / "on.json"))
    with pytest.raises(ConfigError, match="utterance_cmn=causal, but the frontend has utterance_cmn=True"):
        Frontend(FrontendConfig(utterance_cmn=True), cmvn=stats)
