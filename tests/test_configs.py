"""Every conf/*.yaml loads, builds its model and survives one forward/backward step."""
import pathlib

import pytest
import torch

from asrkit.config import load_config
from asrkit.models.registry import build_model

CONF = pathlib.Path(__file__).resolve().parents[1] / "conf"
CONFIGS = sorted(CONF.glob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 8


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_trains_one_step(path):
    cfg = load_config(path)
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=30)
    model.train()
    sr = cfg.frontend.sample_rate
    batch = {"wav": 0.1 * torch.randn(2, sr), "wav_lens": torch.tensor([sr, 3 * sr // 4]),  # 1 s and 0.75 s
             "tokens": torch.tensor([[5, 6, 7, 8], [9, 9, -1, -1]]), "token_lens": torch.tensor([4, 2]),
             "utts": ["a", "b"], "texts": ["x", "y"]}
    out = model(batch)
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"]), path.name
    assert torch.isfinite(out["loss_ctc"]) and int(out["num_infinite_ctc"]) == 0
    out["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), path.name
    assert model.vocab_size == 30 and model.subsampling_factor in (1, 2, 4, 6, 8)
