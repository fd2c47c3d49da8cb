"""The model hands a batch's VTLP warp factors (batch["vtlp_alpha"], from the augmenting loader) to its frontend, which
warps in training only; batches without them call the frontend with the waveforms alone."""
import dataclasses

import torch
from torch import nn

from asrkit.config import AugmentConfig, VtlpConfig
from asrkit.models.registry import build_model
from test_asr import VOCAB, batch, config


def _model():
    cfg = config(ctc_weight=1.0, dropout=0.0)
    cfg = dataclasses.replace(cfg, augment=AugmentConfig(vtlp=VtlpConfig(prob=0.5)))
    torch.manual_seed(0)
    return build_model(cfg, VOCAB)


def test_the_warp_factors_reach_the_frontend_in_training():
    model = _model().train()
    plain = float(model(batch())["loss"])
    assert float(model({**batch(), "vtlp_alpha": torch.ones(3)})["loss"]) == plain  # alpha 1: the same features
    warped = float(model({**batch(), "vtlp_alpha": torch.tensor([1.1, 0.9, 1.05])})["loss"])
    assert abs(warped - plain) > 1e-4
    model.eval()
    assert float(model({**batch(), "vtlp_alpha": torch.tensor([1.1, 0.9, 1.05])})["loss"]) == float(
        model(batch())["loss"])


class WaveformsOnly(nn.Module):
    """A frontend that takes (wav, wav_lens) and nothing more."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, wav, wav_lens):
        return self.inner(wav, wav_lens)

    def num_frames(self, n):
        return self.inner.num_frames(n)


def test_a_batch_without_warp_factors_calls_the_frontend_with_the_waveforms_alone():
    model = _model().eval()
    model.frontend = WaveformsOnly(model.frontend)
    assert torch.isfinite(model(batch())["loss"])
