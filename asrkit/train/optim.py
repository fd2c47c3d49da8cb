"""Optimizer and learning-rate schedule built from :class:`~asrkit.config.TrainConfig`."""
from __future__ import annotations

import torch

from asrkit.config import TrainConfig


def build_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay)


def warmup_inverse_sqrt(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the configured lr over ``warmup_steps``, then decay as 1/sqrt(step) (Noam shape)."""
    warmup = max(1, warmup_steps)

    def factor(step: int) -> float:
        step = step + 1
        return min(step / warmup, (warmup / step) ** 0.5)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
