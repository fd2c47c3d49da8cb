"""Optimizers and learning-rate schedules against closed-form references."""
from __future__ import annotations

import math

import pytest
import torch

from asrkit.config import ConfigError, TrainConfig
from asrkit.train.optim import _fusable, build_optimizer, build_scheduler, lr_factor


def lrs(cfg: TrainConfig, steps: int, total: int = 0):
    """Learning rate used by each of the first ``steps`` updates."""
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    sched = build_scheduler(opt, cfg, total_steps=total)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_inverse_sqrt_is_the_noam_shape_peaking_at_lr():
    cfg = TrainConfig(lr=2e-3, warmup_steps=4, scheduler="warmup_inverse_sqrt")
    got = lrs(cfg, 12)
    # Noam: d^-0.5 * min(s^-0.5, s * w^-1.5), rescaled so its peak (s = w) is train.lr.
    noam = [min(s ** -0.5, s * 4 ** -1.5) for s in range(1, 13)]
    ref = [2e-3 * v / max(noam) for v in noam]
    assert got == pytest.approx(ref, rel=1e-12)
    assert max(got) == pytest.approx(2e-3) and got.index(max(got)) == 3


def test_warmup_cosine_reaches_zero_at_total_steps():
    cfg = TrainConfig(lr=1.0, warmup_steps=2, scheduler="warmup_cosine")
    got = lrs(cfg, 12, total=10)
    ref = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(3, 11)] + [0.0, 0.0]
    assert got == pytest.approx(ref, abs=1e-12)


def test_warmup_cosine_without_warmup_and_with_too_few_total_steps():
    # w = 0: the cosine starts at step 1
    assert [lr_factor("warmup_cosine", 0, 4)(s) for s in range(1, 6)] == pytest.approx(
        [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(1, 5)] + [0.0], abs=1e-12)
    # total_steps unknown (0) or within the warm-up: the peak at step w, then 0 from step w + 1 on
    assert [lr_factor("warmup_cosine", 2, 0)(s) for s in range(1, 6)] == pytest.approx([0.5, 1.0, 0, 0, 0], abs=1e-12)


def test_inverse_sqrt_with_a_warmup_of_one_or_none_peaks_at_the_first_step():
    for w in (0, 1):
        assert [lr_factor("warmup_inverse_sqrt", w)(s) for s in (1, 4)] == pytest.approx([1.0, 0.5])


def test_constant_with_and_without_warmup():
    assert lrs(TrainConfig(lr=0.5, warmup_steps=0, scheduler="constant"), 3) == [0.5] * 3
    assert lrs(TrainConfig(lr=0.5, warmup_steps=2, scheduler="constant"), 4) == [0.25, 0.5, 0.5, 0.5]


def test_adam_and_adamw_differ_only_in_how_weight_decay_is_applied():
    model = torch.nn.Linear(3, 2)
    adamw = build_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1))
    adam = build_optimizer(model, TrainConfig(optimizer="adam", weight_decay=0.1))
    assert type(adamw) is torch.optim.AdamW and type(adam) is torch.optim.Adam
    # Biases (1-D) are not decayed.
    decay = {id(p): g["weight_decay"] for g in adamw.param_groups for p in g["params"]}
    assert decay[id(model.weight)] == 0.1 and decay[id(model.bias)] == 0.0


def reference_adam(p0, grads, lr, wd, decoupled, betas=(0.9, 0.98), eps=1e-9):
    """Adam / AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019) written out, in float64."""
    p, m, v = p0.double().clone(), torch.zeros_like(p0, dtype=torch.float64), torch.zeros_like(p0, dtype=torch.float64)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        p = p - lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
    return p


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_updates_follow_the_adam_equations_with_the_fused_kernel_on_cpu(kind):
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(5, 7, generator=gen)
    grads = [torch.randn(5, 7, generator=gen) * s for s in (1.0, 30.0, 0.01)]  # scale changes Adam's steps
    param = torch.nn.Parameter(p0.clone())
    opt = build_optimizer([param], TrainConfig(optimizer=kind, lr=0.01, weight_decay=0.1))
    assert opt.defaults["fused"] is True
    for g in grads:
        param.grad = g.clone()
        opt.step()
    ref = reference_adam(p0, grads, lr=0.01, wd=0.1, decoupled=kind == "adamw")
    assert (ref - p0.double()).abs().max() > 1e-2  # the steps are far above the tolerance
    assert torch.allclose(param.detach().double(), ref, rtol=1e-5, atol=1e-6)


def test_eps_is_1e9():
    """Gradients of ~1e-9 make Adam's denominator sqrt(v) + eps depend on eps: 1e-9 halves the step, 1e-8 (torch's
    default) would cut it to a tenth."""
    param = torch.nn.Parameter(torch.zeros(4))
    opt = build_optimizer([param], TrainConfig(optimizer="adam", lr=1.0))
    param.grad = torch.full((4,), 1e-9)
    opt.step()
    assert param.detach() == pytest.approx([-0.5] * 4, rel=1e-3)


class _FakeParam:
    def __init__(self, device: str, floating: bool = True):
        self.device, self.floating = torch.device(device), floating

    def is_floating_point(self) -> bool:
        return self.floating


def test_fused_only_where_every_parameter_allows_it():
    assert _fusable([_FakeParam("cuda")]) and _fusable([{"params": [_FakeParam("cpu"), _FakeParam("cuda:1")]}])
    assert not _fusable([_FakeParam("cuda", floating=False)]) and not _fusable([_FakeParam("mps")])
    assert not _fusable([])
    cfg = TrainConfig()
    assert build_optimizer(torch.nn.Linear(3, 2), cfg).defaults["fused"] is True
    meta = torch.nn.Parameter(torch.zeros(2, device="meta"))
    assert build_optimizer([torch.nn.Parameter(torch.zeros(2)), meta], cfg).defaults["fused"] is False


@pytest.mark.parametrize("field,value,choices", [("optimizer", "sgd", "adam, adamw"),
                                               ("scheduler", "linear", "warmup_inverse_sqrt, warmup_cosine, constant")])
def test_unknown_names_are_config_errors(field, value, choices):
    cfg = TrainConfig(**{field: value})
    with pytest.raises(ConfigError) as err:
        lrs(cfg, 1)
    assert str(err.value) == f"train.{field} '{value}' is unknown (choose from: {choices})"


@pytest.mark.parametrize("lr", [0.0, -1e-3])
def test_a_learning_rate_must_be_positive(lr):
    with pytest.raises(ConfigError) as err:
        build_optimizer(torch.nn.Linear(2, 2), TrainConfig(lr=lr))
    assert str(err.value) == f"train.lr must be positive, got {lr}"
