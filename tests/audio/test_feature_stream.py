"""FeatureStream: audio in pieces of any size -> the same normalised frames as the offline Frontend in eval mode on
the whole audio (LogMel and Kaldi fbank, global CMVN, causal CMN), a reset per utterance, and the refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asrkit.audio.feature_stream import FeatureStream
from asrkit.audio.frontend import Frontend
from asrkit.config import FrontendConfig
from tests.audio.test_utterance_cmn import _speech

SR = 16000
KINDS = {"logmel": FrontendConfig(), "kaldi_fbank": FrontendConfig(kind="kaldi_fbank", n_mels=40)}


def _frontend(kind: str, cmn, prior: float = 100.0) -> Frontend:
    cfg = KINDS[kind]
    cfg = FrontendConfig(**{**cfg.__dict__, "utterance_cmn": cmn, "utterance_cmn_prior_frames": prior})
    g = torch.Generator().manual_seed(5)
    cmvn = (torch.randn(cfg.n_mels, generator=g) + 5, torch.rand(cfg.n_mels, generator=g) + 0.2)
    return Frontend(cfg, cmvn=cmvn).eval()


def _split(n: int, sizes, seed: int):
    """Cut n samples into consecutive pieces whose sizes are drawn from ``sizes`` (the last one what is left)."""
    rng = np.random.default_rng(seed)
    edges = [0]
    while edges[-1] < n:
        edges.append(min(n, edges[-1] + int(rng.choice(sizes))))
    return list(zip(edges[:-1], edges[1:]))


def _offline(fe: Frontend, wav: torch.Tensor) -> torch.Tensor:
    feats, lens = fe(wav[None], torch.tensor([wav.numel()]))
    return feats[0, : int(lens[0])]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cmn", [False, "causal"])
@pytest.mark.parametrize("sizes,seed", [((1, 7, 160, 399, 400, 401, 3000), 0), ((32000, 11, 16000), 1)])
def test_any_split_gives_the_offline_features(kind, cmn, sizes, seed):
    wav = _speech(41234, seed)
    fe = _frontend(kind, cmn)
    stream = FeatureStream(fe)
    pieces = [stream.accept(wav[a:b]) for a, b in _split(wav.numel(), sizes, seed)]
    assert all(p.shape[1] == fe.output_dim for p in pieces)
    torch.testing.assert_close(torch.cat(pieces), _offline(fe, wav), atol=1e-5, rtol=0)
    assert stream.frames == fe.num_frames(torch.tensor(wav.numel()))


def test_one_sample_at_a_time_and_empty_pieces():
    wav = _speech(2000, 3)  # 11 frames
    fe = _frontend("logmel", "causal")
    stream = FeatureStream(fe)
    out = [stream.accept(wav[i:i + 1]) for i in range(wav.numel())]
    assert stream.accept(wav[:0]).shape == (0, fe.output_dim)
    assert sum(p.shape[0] for p in out) == 11 and out[399].shape[0] == 1 and out[398].shape[0] == 0
    torch.testing.assert_close(torch.cat(out), _offline(fe, wav), atol=1e-5, rtol=0)


def test_numpy_float_pieces_and_a_short_stream():
    wav = _speech(16000, 4)
    fe = _frontend("logmel", False)
    stream = FeatureStream(fe)
    assert stream.accept(wav[:399].numpy()).shape == (0, 80)  # not a whole window yet
    rest = stream.accept(wav[399:].numpy().astype(np.float64))
    torch.testing.assert_close(rest, _offline(fe, wav), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"samples must be 1-D \(S,\), got shape \(2, 3\)"):
        stream.accept(torch.zeros(2, 3))


def test_kaldi_fbank_decoding_never_dithers():
    wav = _speech(8000, 6)
    cfg = FrontendConfig(kind="kaldi_fbank", n_mels=40, dither=1.0)
    fe = Frontend(cfg)
    torch.manual_seed(0)
    train_a = fe.train()(wav[None], torch.tensor([8000]))[0]
    train_b = fe(wav[None], torch.tensor([8000]))[0]
    assert (train_a - train_b).abs().max() > 1e-3  # dither is on in training
    fe.eval()
    a = torch.cat([FeatureStream(fe).accept(wav)])
    s = FeatureStream(fe)
    b = torch.cat([s.accept(wav[:3333]), s.accept(wav[3333:])])
    assert torch.equal(a, _offline(fe, wav))  # the same call on the same samples: bit for bit
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_reset_utterance_restarts_the_running_mean_not_the_framing():
    wav = _speech(24000, 7)
    fe = _frontend("logmel", "causal", prior=20.0)
    stream = FeatureStream(fe)
    first = stream.accept(wav[:8100])  # frames 0..48 (frame 49 needs samples up to 8240)
    assert first.shape[0] == 49
    stream.reset_utterance()
    second = stream.accept(wav[8100:])
    # the next utterance starts at frame 49, i.e. sample 49 * 160, with the running mean from the prior again
    torch.testing.assert_close(second, _offline(fe, wav[49 * 160:]), atol=1e-5, rtol=0)
    assert stream.frames == 49 + second.shape[0]


def test_refuses_the_whole_utterance_mean_naming_the_key():
    with pytest.raises(ValueError, match="frontend.utterance_cmn: true needs the whole utterance.*causal"):
        FeatureStream(_frontend("logmel", True))


def test_refuses_a_frontend_in_training_mode():
    fe = _frontend("logmel", False).train()
    with pytest.raises(ValueError, match=r"model.eval\(\)"):
        FeatureStream(fe).accept(torch.zeros(400))
