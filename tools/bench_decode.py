#!/usr/bin/env python3
"""Benchmark CTC decoders on identical, seeded, random "peaky" log-probabilities.

Usage: tools/bench_decode.py [--batch 32] [--frames 250] [--vocabs 29 500] [--beams 10 50]
                             [--threads 1 2] [--decoders prefix greedy] [--repeats 3]
                             [--token-topk 8] [--token-min-logp -12] [--blank-skip 0.999]

Each utterance stands for 10 s of audio (250 frames at 40 ms). Prints one line per setting with
utterances per second and the real-time factor (decode seconds / audio seconds). The inputs
depend only on --seed, batch, frames and vocab, so every decoder sees the same log-probs.
Decoders: "prefix" (asrkit.search.ctc_prefix, pruning from the flags), "prefix-exact" (no
pruning, no blank skipping), "greedy"; peers can be added to DECODERS.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from asrkit.search.ctc_prefix import ctc_prefix_beam_search  # noqa: E402
from asrkit.search.greedy import greedy_search  # noqa: E402

AUDIO_SECONDS = 10.0


def peaky_log_probs(batch: int, frames: int, vocab: int, seed: int, nonblank: float = 0.35) -> torch.Tensor:
    """(B, T, V) CTC-like log-probs. Each frame has one dominant class: blank, or (with probability
    `nonblank`) a random token that often lasts two frames. The dominant class gets 1 - eps with
    eps log-uniform in [1e-5, 1e-1]; eps is spread over the other classes by a softmax of N(0, 2)
    logits, so peakiness does not depend on the vocabulary size."""
    g = torch.Generator().manual_seed(seed)
    is_token = torch.rand(batch, frames, generator=g) < nonblank
    token = torch.randint(1, vocab, (batch, frames), generator=g)
    repeat = torch.rand(batch, frames, generator=g) < 0.3
    token[:, 1:] = torch.where(repeat[:, 1:] & is_token[:, :-1], token[:, :-1], token[:, 1:])
    dominant = torch.where(is_token, token, 0)[..., None]
    eps = 10 ** (torch.rand(batch, frames, 1, generator=g) * 4 - 5)
    rest = (torch.randn(batch, frames, vocab, generator=g) * 2).scatter_(2, dominant, float("-inf"))
    lp = rest.log_softmax(-1) + eps.log()
    return lp.scatter_(2, dominant, torch.log1p(-eps))


def make_decoders(args: argparse.Namespace) -> Dict[str, Callable[[torch.Tensor, torch.Tensor, int], object]]:
    def prefix(lp: torch.Tensor, lens: torch.Tensor, beam: int) -> object:
        return ctc_prefix_beam_search(lp, lens, beam=beam, token_topk=args.token_topk,
                                      token_min_logp=args.token_min_logp,
                                      blank_skip_threshold=args.blank_skip).to_lists()

    def exact(lp: torch.Tensor, lens: torch.Tensor, beam: int) -> object:
        return ctc_prefix_beam_search(lp, lens, beam=beam, token_topk=None, token_min_logp=None,
                                      blank_skip_threshold=None).to_lists()

    def greedy(lp: torch.Tensor, lens: torch.Tensor, beam: int) -> object:
        return greedy_search(lp, lens).to_lists()

    return {"prefix": prefix, "prefix-exact": exact, "greedy": greedy}


def bench(fn: Callable[[torch.Tensor, torch.Tensor, int], object], lp: torch.Tensor,
          lens: torch.Tensor, beam: int, repeats: int) -> Tuple[float, float]:
    """Best-of-`repeats` (wall, process CPU) seconds for one batch, after one warm-up run.

    CPU time shows the work itself when other processes share the cores (it exceeds wall time
    when several threads run).
    """
    fn(lp, lens, beam)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(lp, lens, beam)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    return best, best_cpu


def _int_or_none(text: str) -> Optional[int]:
    return None if text.lower() == "none" else int(text)


def _float_or_none(text: str) -> Optional[float]:
    return None if text.lower() == "none" else float(text)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_decode.py", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--vocabs", type=int, nargs="+", default=[29, 500])
    p.add_argument("--beams", type=int, nargs="+", default=[10, 50])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--decoders", nargs="+", default=["prefix"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-topk", type=_int_or_none, default=8, help="tokens per frame, or 'none'")
    p.add_argument("--token-min-logp", type=_float_or_none, default=-12.0, help="log-prob floor, or 'none'")
    p.add_argument("--blank-skip", type=_float_or_none, default=0.999,
                   help="blank-frame skip threshold, or 'none'")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    decoders = make_decoders(args)
    unknown = [d for d in args.decoders if d not in decoders]
    if unknown:
        print(f"bench_decode.py: unknown decoder(s) {unknown}; choose from {sorted(decoders)}", file=sys.stderr)
        return 2
    lens = torch.full((args.batch,), args.frames, dtype=torch.long)
    print(f"batch {args.batch} x {args.frames} frames ({AUDIO_SECONDS:g} s audio each), device {args.device}, "
          f"topk {args.token_topk}, min_logp {args.token_min_logp}, blank_skip {args.blank_skip}")
    for vocab in args.vocabs:
        lp = peaky_log_probs(args.batch, args.frames, vocab, args.seed).to(args.device)
        for name in args.decoders:
            for beam in (args.beams if name != "greedy" else [1]):
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    sec, cpu = bench(decoders[name], lp, lens.to(args.device), beam, args.repeats)
                    rtf = sec / (args.batch * AUDIO_SECONDS)
                    print(f"{name:13s} V={vocab:4d} beam={beam:3d} threads={threads}: "
                          f"{args.batch / sec:8.1f} utt/s  RTF {rtf:.5f}  ({sec * 1000:.1f} ms/batch wall, "
                          f"{cpu * 1000:.1f} ms CPU = {args.batch / cpu:.1f} utt/CPU-s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
