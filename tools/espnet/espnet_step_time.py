#!/usr/bin/env python3
"""Per-step training time of asrkit and ESPnet2 on identical batches (a part of tools/espnet/bench_espnet.sh).

usage: espnet_step_time.py --toolkit asrkit|espnet --out OUT --data DIR [--batch-size 8] [--batches 6]

Run it with the toolkit's own venv (.venv for asrkit, .venv-espnet for ESPnet), after both trained into
OUT (tools/espnet/bench_espnet.sh stages 2 and 3): each model is built afresh from its experiment's config
(random weights: the time does not depend on them) and takes one warm-up step, then one step per batch:
forward, backward, gradient clipping and the optimizer update, as in their trainers, without data
loading. The batches: --batches x --batch-size utterances of DIR/train, consecutive in sorted id order
(mixed lengths), the same for both. The result, [ms per step, audio seconds per second], is appended
under the toolkit's name to OUT/step_time.json (run both in turn, several times: the report takes the best).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # espnet_bench beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # asrkit from a checkout without installing

from espnet_bench import SPACE, BenchError, load_record, read_table  # noqa: E402


def fixed_batches(data_dir: str, batch_size: int, count: int) -> List[List[str]]:
    """``count`` batches of ``batch_size`` utterances, consecutive in sorted id order (mixed lengths)."""
    utts = sorted(read_table(os.path.join(data_dir, "text")))
    if len(utts) < batch_size * count:
        raise BenchError(f"{data_dir}: {len(utts)} utterances, {batch_size} x {count} needed for step-time")
    return [utts[i * batch_size:(i + 1) * batch_size] for i in range(count)]


def _load_batch(data_dir: str, utts: Sequence[str], encode: Any) -> Dict[str, Any]:
    import soundfile
    import torch

    scp, text = read_table(os.path.join(data_dir, "wav.scp")), read_table(os.path.join(data_dir, "text"))
    wavs, rates = [], set()
    for u in utts:
        samples, rate = soundfile.read(scp[u], dtype="float32")
        wavs.append(torch.from_numpy(samples))
        rates.add(rate)
    if len(rates) != 1:
        raise BenchError(f"{data_dir}: utterances {', '.join(utts)} have several sample rates {sorted(rates)}")
    ids = [torch.tensor(encode(text[u]), dtype=torch.long) for u in utts]
    lens = torch.tensor([len(w) for w in wavs])
    wav = torch.zeros(len(wavs), int(lens.max()))
    tokens = torch.full((len(ids), max(len(i) for i in ids)), -1, dtype=torch.long)
    for b, (w, i) in enumerate(zip(wavs, ids)):
        wav[b, :len(w)], tokens[b, :len(i)] = w, i
    return {"wav": wav, "wav_lens": lens, "tokens": tokens, "token_lens": torch.tensor([len(i) for i in ids]),
            "seconds": float(lens.sum()) / rates.pop()}


def _asrkit_step(out: str) -> Any:
    import torch

    from asrkit.config import load_config
    from asrkit.models.registry import build_model
    from asrkit.text.tokenizer import load_tokenizer
    from asrkit.train.optim import build_optimizer

    exp = os.path.join(out, "asrkit", "exp")
    cfg = load_config(os.path.join(exp, "config.yaml"))
    tok = load_tokenizer(os.path.join(exp, "tokenizer.json"))
    cmvn = os.path.join(exp, "cmvn.json")
    model = build_model(cfg, tok.vocab_size, cmvn_path=cmvn if os.path.isfile(cmvn) else None).train()
    opt = build_optimizer(model, cfg.train)

    def step(batch: Dict[str, Any]) -> None:
        model(batch)["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, tok.encode


def _espnet_step(out: str) -> Any:
    import torch
    from espnet2.tasks.asr import ASRTask

    exp = os.path.join(out, "espnet", "exp")
    model, args = ASRTask.build_model_from_file(os.path.join(exp, "config.yaml"), None, "cpu")
    model.train()
    cls = torch.optim.AdamW if args.optim == "adamw" else torch.optim.Adam
    opt = cls(model.parameters(), **args.optim_conf)
    index = {t: i for i, t in enumerate(args.token_list)}

    def encode(text: str) -> List[int]:
        return [index.get(SPACE if c == " " else c, 1) for c in " ".join(text.split())]

    def step(batch: Dict[str, Any]) -> None:
        loss, _, _ = model(speech=batch["wav"], speech_lengths=batch["wav_lens"], text=batch["tokens"],
                           text_lengths=batch["token_lens"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, encode


def cmd_step_time(args: argparse.Namespace) -> None:
    """Forward, backward, clipping and the optimizer update of each toolkit's model on the same batches,
    after one warm-up step; appends {toolkit: [ms per step, audio s per s]} to OUT/step_time.json."""
    import torch

    torch.manual_seed(1)
    step, encode = (_asrkit_step if args.toolkit == "asrkit" else _espnet_step)(args.out)
    names = fixed_batches(os.path.join(args.data, "train"), args.batch_size, args.batches)
    batches = [_load_batch(os.path.join(args.data, "train"), utts, encode) for utts in names]
    step(batches[0])
    start = time.perf_counter()
    for b in batches:
        step(b)
    seconds = time.perf_counter() - start
    result = [1000 * seconds / len(batches), sum(b["seconds"] for b in batches) / seconds]
    path = os.path.join(args.out, "step_time.json")
    record = load_record(path)
    record.setdefault(args.toolkit, []).append(result)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    print(f"{args.toolkit}: {result[0]:.0f} ms/step, {result[1]:.1f} audio s/s "
          f"({args.batches} batches of {args.batch_size} utterances)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--toolkit", choices=("asrkit", "espnet"), required=True)
    p.add_argument("--out", required=True, help="the benchmark's OUT dir")
    p.add_argument("--data", required=True, help="the benchmark's data dir (its train/)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=6)
    args = p.parse_args(argv)
    try:
        cmd_step_time(args)
    except BenchError as exc:
        print(f"espnet_step_time.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
