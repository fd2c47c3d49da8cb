#!/usr/bin/env python3
"""Training throughput and peak memory per model config, and the SDPA speedup over plain attention.

usage: tools/bench/bench_train.py [--steps N] [--batch-size B] [--seconds S] [--device DEV] [--amp none|bf16|fp16]
                            [--threads T] [CONFIG.yaml ...]

For each config (default: every conf/tiny_*.yaml) the model is built (random init, no CMVN) and
trained for --steps full steps (forward, backward, gradient clipping, AdamW update) on synthetic
batches of --batch-size utterances of --seconds seconds (noise) with 6 random labels per second,
after one warm-up step. Printed per config: parameters, seconds per step, throughput in seconds of
audio per second, and peak memory: on CUDA torch.cuda.max_memory_allocated, on CPU the peak
resident set size (each config then runs in its own process, so the peak is its own) and its
growth over the process's size before the first step.

Last, multi-head attention through SDPA (asrkit.nets.attention.MultiHeadAttention) is timed
against the same projections with an explicit softmax(Q K^T / sqrt(d)) V, forward + backward,
on B=16, T=250, d=256, 4 heads with a padding mask, after checking that both give the same output.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import torch  # noqa: E402

from asrkit.config import TrainConfig, load_config  # noqa: E402
from asrkit.models.registry import build_model  # noqa: E402
from asrkit.nets.attention import MultiHeadAttention  # noqa: E402
from asrkit.train.optim import build_optimizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCAB = 32


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def synthetic_batch(batch: int, seconds: float, sample_rate: int, gen: torch.Generator) -> Dict[str, object]:
    samples = int(seconds * sample_rate)
    labels = max(1, int(seconds * 6))
    # Distinct neighbouring labels, so the CTC length constraint is just labels <= frames.
    tokens = 3 + (torch.randint(0, VOCAB - 4, (batch, labels), generator=gen).cumsum(1) % (VOCAB - 3))
    tokens[:, 1:] = torch.where(tokens[:, 1:] == tokens[:, :-1], 3 + (tokens[:, 1:] - 2) % (VOCAB - 3),
                                tokens[:, 1:])
    return {"wav": 0.1 * torch.randn(batch, samples, generator=gen), "wav_lens": torch.full((batch,), samples),
            "tokens": tokens, "token_lens": torch.full((batch,), labels), "utts": [f"u{i}" for i in range(batch)],
            "texts": [""] * batch}


def bench_config(path: str, args: argparse.Namespace) -> Dict[str, object]:
    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = load_config(path)
    model = build_model(cfg, VOCAB).to(device).train()
    opt = build_optimizer(model, TrainConfig(lr=1e-4))
    gen = torch.Generator().manual_seed(0)
    batch = synthetic_batch(args.batch_size, args.seconds, cfg.frontend.sample_rate, gen)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")

    def step() -> float:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(batch)["loss"]
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    rss_before = current_rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    per_step = (time.perf_counter() - start) / args.steps
    result = {"config": path, "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "step_s": per_step,
              "audio_s_per_s": args.batch_size * args.seconds / per_step, "loss": loss}
    if device.type == "cuda":
        result["peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        result["growth_mb"] = result["peak_mb"] - rss_before
    return result


def plain_attention(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The same projections as ``mha`` with an explicit softmax(Q K^T / sqrt(d)) V; mask (B, 1, T)."""
    b, t, d = x.shape
    h = mha.num_heads

    def split(y: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, D/H)
        return y.view(b, t, h, d // h).transpose(1, 2)

    q, k, v = split(mha.q_proj(x)), split(mha.k_proj(x)), split(mha.v_proj(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)  # (B, H, T, T)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    out = scores.softmax(-1) @ v  # (B, H, T, D/H)
    return mha.out_proj(out.transpose(1, 2).reshape(b, t, d))


def bench_attention(device: torch.device, reps: int = 10, b: int = 16, t: int = 250, d: int = 256,
                    heads: int = 4) -> Dict[str, float]:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d, heads).to(device)
    x = torch.randn(b, t, d, device=device, requires_grad=True)
    lens = torch.randint(t // 2, t + 1, (b,), device=device)
    lens[0] = t
    mask = (torch.arange(t, device=device)[None, :] < lens[:, None]).unsqueeze(1)  # (B, 1, T): keys
    with torch.no_grad():
        max_diff = float((mha(x, x, x, mask) - plain_attention(mha, x, mask)).abs().max())

    def timed(fn) -> float:
        times = []
        for i in range(reps + 2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn().square().mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:  # warm-up
                times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]

    sdpa = timed(lambda: mha(x, x, x, mask))
    plain = timed(lambda: plain_attention(mha, x, mask))
    return {"sdpa_ms": sdpa * 1e3, "plain_ms": plain * 1e3, "speedup": plain / sdpa, "max_abs_diff": max_diff}


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/bench/bench_train.py", description=__doc__.split("\n")[0])
    p.add_argument("configs", nargs="*", help="model configs (default: conf/tiny_*.yaml)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0, help="utterance length")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # one config, JSON out (child)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.seconds <= 0:
        p.error("--steps, --batch-size and --seconds must be positive")
    if args.amp == "fp16" and not args.device.startswith("cuda"):
        p.error("--amp fp16 needs a CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.single:
        print(json.dumps(bench_config(args.configs[0], args)))
        return 0
    configs = args.configs or sorted(glob.glob(str(REPO / "conf" / "tiny_*.yaml")))
    if not configs:
        p.error("no config given and no conf/tiny_*.yaml found")
    print(f"device {args.device}, amp {args.amp}, {torch.get_num_threads()} CPU threads, batch "
          f"{args.batch_size} x {args.seconds:g} s, {args.steps} timed steps")
    print(f"{'config':<42} {'params':>8} {'s/step':>8} {'audio s/s':>10} {'peak MB':>9} {'growth MB':>10}")
    for path in configs:
        if args.device.startswith("cuda"):
            r = bench_config(path, args)
        else:  # a fresh process per config, so the peak RSS is this config's own
            child = [sys.executable, __file__, "--single", "--steps", str(args.steps), "--batch-size",
                     str(args.batch_size), "--seconds", str(args.seconds), "--device", args.device, "--amp", args.amp]
            child += ["--threads", str(args.threads)] if args.threads else []
            proc = subprocess.run(child + [path], capture_output=True, text=True)
            if proc.returncode:
                print(f"{path}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
        name = str(Path(r["config"]).relative_to(REPO)) if Path(r["config"]).is_absolute() else r["config"]
        growth = f"{r['growth_mb']:>10.0f}" if "growth_mb" in r else f"{'-':>10}"
        print(f"{name:<42} {r['params_m']:>7.2f}M {r['step_s']:>8.3f} {r['audio_s_per_s']:>10.1f} "
              f"{r['peak_mb']:>9.0f} {growth}")
    a = bench_attention(torch.device(args.device))
    print(f"attention B=16 T=250 d=256 H=4 fwd+bwd: SDPA {a['sdpa_ms']:.2f} ms, plain {a['plain_ms']:.2f} ms, "
          f"speedup {a['speedup']:.2f}x (max |difference| {a['max_abs_diff']:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
