"""Optimizer and learning-rate schedule built from :class:`~asrkit.config.TrainConfig`.

Every schedule is a multiplier of ``train.lr`` as a function of the optimizer step
``s`` (1-based: the first update uses ``s = 1``); ``w`` is ``train.warmup_steps``:

    warmup_inverse_sqrt  min(s / w, sqrt(w / s))     the Noam shape, peaking at train.lr when s = w
    warmup_cosine        s / w while s < w, then 0.5 * (1 + cos(pi * (s - w) / (total - w))), 0 after total
    constant             min(s / w, 1)                linear warm-up (none when w = 0), then train.lr
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, List

import torch
from torch import nn

from asrkit.config import ConfigError, TrainConfig

OPTIMIZERS = ("adam", "adamw")
SCHEDULERS = ("warmup_inverse_sqrt", "warmup_cosine", "constant")


def build_optimizer(params: Iterable[nn.Parameter] | nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam (L2 weight decay) or AdamW (decoupled); betas (0.9, 0.98) and eps 1e-9 as usual for Transformers;
    torch's fused implementation wherever it runs (:func:`_fusable`).

    Given a module, biases and normalisation gains (1-D parameters) are excluded from weight decay,
    which would only pull them towards zero without regularising anything.
    """
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"train.optimizer '{cfg.optimizer}' is unknown (choose from: {', '.join(OPTIMIZERS)})")
    if cfg.lr <= 0:
        raise ConfigError(f"train.lr must be positive, got {cfg.lr}")
    if isinstance(params, nn.Module):
        trainable = [p for p in params.parameters() if p.requires_grad]
        groups: List[dict] | List[nn.Parameter] = [
            {"params": [p for p in trainable if p.ndim > 1], "weight_decay": cfg.weight_decay},
            {"params": [p for p in trainable if p.ndim <= 1], "weight_decay": 0.0}]
    else:
        groups = list(params)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay,
               fused=_fusable(groups))


def _fusable(groups: List[dict] | List[nn.Parameter]) -> bool:
    """Whether torch's fused Adam kernel can update every parameter: floating point, on the CPU or a CUDA device.

    The same update in one kernel per dtype instead of about ten ops per parameter: on one CPU thread a step of
    the demo's 1.4 M-parameter model (146 tensors) takes 2.7 ms instead of 13.6 ms, ~7% of its training step.
    """
    params = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def lr_factor(kind: str, warmup_steps: int, total_steps: int = 0) -> Callable[[int], float]:
    """The multiplier of ``train.lr`` at optimizer step ``s`` (1-based); see the module docstring."""
    w = max(0, warmup_steps)
    if kind == "warmup_inverse_sqrt":
        w1 = max(1, w)
        return lambda s: min(s / w1, math.sqrt(w1 / s))
    if kind == "constant":
        return lambda s: min(s / w, 1.0) if w else 1.0
    if kind == "warmup_cosine":
        total = max(total_steps, w + 1)

        def cosine(s: int) -> float:
            if s < w:
                return s / w
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (s - w) / (total - w))))
        return cosine
    raise ConfigError(f"train.scheduler '{kind}' is unknown (choose from: {', '.join(SCHEDULERS)})")


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                    total_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` stepped once per optimizer update; ``total_steps`` is needed by ``warmup_cosine``."""
    factor = lr_factor(cfg.scheduler, cfg.warmup_steps, total_steps)
    # LambdaLR counts from 0 and applies the value before the first update, so shift to the 1-based step.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: factor(k + 1))

