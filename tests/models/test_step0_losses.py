"""Every model config reaches the loss it reached before models were composed of parts (format 1), at step 0
for a fixed seed: the composition changed no initialisation and no loss formula, except where stated.

The figures in fixtures/step0_losses_format1.json were computed with the format-1 model classes on this
batch (torch.manual_seed(0) before building, vocabulary 30, eval mode).
"""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from asrkit.config import load_config
from asrkit.models.registry import build_model

REPO = pathlib.Path(__file__).resolve().parents[2]
BEFORE = json.loads((pathlib.Path(__file__).parent / "fixtures" / "step0_losses_format1.json").read_text())
# Where the composed model is meant to differ, and why.
CHANGED = {
    # The BiLSTM attention model used torch's label_smoothing (lsm / V on every id, the target included);
    # every decoder now shares one loss: KL to (1 - lsm) on the target and lsm / (V - 1) elsewhere.
    "blstm_location_attention.yaml": {"loss_att", "loss"},
    "tiny_blstm_location_attention.yaml": {"loss_att", "loss"},
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_step0_loss_is_unchanged(name):
    cfg = load_config(REPO / "conf" / name)
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=30).eval()
    sr = cfg.frontend.sample_rate
    g = torch.Generator().manual_seed(1)
    batch = {"wav": 0.1 * torch.randn(2, sr, generator=g), "wav_lens": torch.tensor([sr, 3 * sr // 4]),
             "tokens": torch.tensor([[5, 6, 7, 8], [9, 9, -1, -1]]), "token_lens": torch.tensor([4, 2])}
    with torch.no_grad():
        out = model(batch)
    for key, value in BEFORE[name].items():
        if key in CHANGED.get(name, ()):
            continue
        assert float(out[key]) == pytest.approx(value, rel=1e-4), key
