#!/usr/bin/env python3
"""Equal training time (tools/espnet/bench_espnet.sh --budget-minutes): how many epochs each toolkit fits.

usage:
  espnet_budget.py plan --budget-minutes M --probe-epochs K --out-dir OUT --cores "A E"
      After the probe (bench_espnet.sh stage 2: both toolkits trained K epochs at the same time, asrkit pinned
      to CPU A and ESPnet to CPU E), for each toolkit: the probe's wall seconds (OUT/timings.json, asrkit_probe
      and espnet_probe) and the time stamps its log puts on every epoch's result line, written after that
      epoch's validation (OUT/probe/asrkit/exp/train.log, OUT/probe/espnet/train.log), give
          seconds per epoch = (last stamp - first stamp) / (K - 1)   (K = 1: the whole probe, start-up included)
          start-up          = max(0, wall - K x seconds per epoch)
          epochs            = floor((M x 60 - start-up) / seconds per epoch)
      Each toolkit's own throughput decides its epochs; fewer than 2 is an error. Writes OUT/budget.json and
      prints "ASRKIT_EPOCHS ESPNET_EPOCHS".
  espnet_budget.py reuse-probe --from OTHER_OUT --out-dir OUT
      Another run's probe as this run's (bench_espnet.sh --probe-from: a second seed on the same machine, whose
      throughput the seed does not change): copies its probe logs and its asrkit_probe / espnet_probe wall times
      (OUT/timings.json), and names it in OUT/probe/source.txt, which the plan records as probe_from.
  espnet_budget.py show --plan OUT/budget.json
      print "ASRKIT_EPOCHS ESPNET_EPOCHS" of a written plan

Runs with any Python (no asrkit, no ESPnet import). ESPnet logs as "[host] 2026-11-28 10:00:00,123
(trainer:338) INFO: 1epoch results: [train] ... [valid] ...", asrkit as "2026-11-28 10:00:00,123 INFO
asrkit.train: epoch 0: train loss ...".
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # espnet_bench beside this file

from espnet_bench import BenchError, add_to_record, load_record  # noqa: E402

TOOLKITS = ("asrkit", "espnet")
MIN_EPOCHS = 2  # one epoch each says nothing about what the faster trainer's extra epochs are worth
# Where each toolkit's probe logs (bench_espnet.sh: asrkit writes exp/train.log, ESPnet's output is redirected).
PROBE_LOGS = {"asrkit": os.path.join("probe", "asrkit", "exp", "train.log"),
              "espnet": os.path.join("probe", "espnet", "train.log")}
PROBE_SOURCE = os.path.join("probe", "source.txt")  # written by reuse-probe: the run whose probe this is
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})")
_EPOCH_END = {"asrkit": re.compile(r"asrkit\.train: epoch \d+: train loss "),
              "espnet": re.compile(r"\d+epoch results: \[train\]")}


@dataclass(frozen=True)
class Fit:
    """What the probe says of one toolkit, and the epochs that fit in the budget."""

    epochs: int
    per_epoch_s: float
    startup_s: float
    probe_wall_s: float


def epoch_end_times(log_path: str, toolkit: str) -> List[float]:
    """Seconds since 1970 (local clock) of every epoch-result line of a training log, in order."""
    out = []
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not _EPOCH_END[toolkit].search(line):
                continue
            m = _STAMP.search(line)
            if not m:
                raise BenchError(f"{log_path}:{n}: an epoch line without a time stamp")
            out.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def epochs_in_budget(budget_s: float, probe_wall_s: float, ends: Sequence[float], probe_epochs: int,
                     toolkit: str) -> Fit:
    """The epochs ``toolkit`` fits in ``budget_s`` from its probe (formulas in the module docstring)."""
    if not budget_s > 0:
        raise BenchError(f"the budget must be > 0 s, got {budget_s:g}")
    if probe_epochs < 1:
        raise BenchError(f"the probe must train at least 1 epoch, got {probe_epochs}")
    if len(ends) != probe_epochs:
        raise BenchError(f"{toolkit}: the probe trained {probe_epochs} epochs but its log ends {len(ends)}")
    if any(b <= a for a, b in zip(ends, ends[1:])):
        raise BenchError(f"{toolkit}: the log's epoch ends are not increasing")
    per_epoch = (ends[-1] - ends[0]) / (probe_epochs - 1) if probe_epochs > 1 else probe_wall_s
    startup = max(0.0, probe_wall_s - probe_epochs * per_epoch)
    epochs = math.floor((budget_s - startup) / per_epoch)
    if epochs < MIN_EPOCHS:
        raise BenchError(f"{toolkit}: one epoch takes {per_epoch:.0f} s after {startup:.0f} s of start-up; the "
                         f"budget of {budget_s:.0f} s fits less than {MIN_EPOCHS} epochs")
    return Fit(epochs, per_epoch, startup, probe_wall_s)


def plan(out_dir: str, budget_minutes: float, probe_epochs: int, cores: Dict[str, int]) -> Dict[str, object]:
    """Each toolkit's Fit from the probe in ``out_dir``; written to OUT/budget.json and returned."""
    record_path = os.path.join(out_dir, "timings.json")
    record = load_record(record_path)
    result: Dict[str, object] = {"budget_s": budget_minutes * 60, "probe_epochs": probe_epochs, "cores": cores}
    for toolkit in TOOLKITS:
        if f"{toolkit}_probe" not in record:
            raise BenchError(f"{record_path} has no {toolkit}_probe: run stage 2 (the probe) first")
        log = os.path.join(out_dir, PROBE_LOGS[toolkit])
        if not os.path.isfile(log):
            raise BenchError(f"{log}: no probe log: run stage 2 (the probe) first")
        try:
            fit = epochs_in_budget(budget_minutes * 60, record[f"{toolkit}_probe"], epoch_end_times(log, toolkit),
                                   probe_epochs, toolkit)
        except BenchError as exc:
            raise BenchError(f"{exc} ({log})") from None
        result[toolkit] = asdict(fit)
    source = probe_source(out_dir)
    if source:
        result["probe_from"] = source
    path = os.path.join(out_dir, "budget.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    os.replace(path + ".tmp", path)
    return result


def probe_source(out_dir: str) -> Optional[str]:
    """The run whose probe ``out_dir`` reused (OUT/probe/source.txt), or None: its own."""
    path = os.path.join(out_dir, PROBE_SOURCE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def reuse_probe(src: str, out_dir: str) -> None:
    """Make the probe of the run in ``src`` this run's (``out_dir``): its logs and wall times, and its name in
    OUT/probe/source.txt. A rerun with the same source does nothing; a run with a probe of its own is refused."""
    src = os.path.abspath(src)
    names = [f"{toolkit}_probe" for toolkit in TOOLKITS]
    source_file = os.path.join(out_dir, PROBE_SOURCE)
    own = load_record(os.path.join(out_dir, "timings.json"))
    if any(name in own for name in names):
        if probe_source(out_dir) == src:
            return
        raise BenchError(f"{out_dir}: has a probe of its own (timings.json); not replaced by {src}'s")
    record_path = os.path.join(src, "timings.json")
    record = load_record(record_path)
    for toolkit, name in zip(TOOLKITS, names):
        if name not in record:
            raise BenchError(f"{record_path} has no {name}: that run's probe did not finish")
        if not os.path.isfile(os.path.join(src, PROBE_LOGS[toolkit])):
            raise BenchError(f"{os.path.join(src, PROBE_LOGS[toolkit])}: no probe log")
    for toolkit in TOOLKITS:
        os.makedirs(os.path.dirname(os.path.join(out_dir, PROBE_LOGS[toolkit])), exist_ok=True)
        shutil.copyfile(os.path.join(src, PROBE_LOGS[toolkit]), os.path.join(out_dir, PROBE_LOGS[toolkit]))
    with open(source_file, "w", encoding="utf-8") as fh:
        fh.write(src + "\n")
    for name in names:  # the records last: a copy cut short leaves no probe behind
        add_to_record(os.path.join(out_dir, "timings.json"), name, record[name])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("plan")
    c.add_argument("--budget-minutes", type=float, required=True)
    c.add_argument("--probe-epochs", type=int, required=True)
    c.add_argument("--out-dir", required=True, help="bench_espnet.sh's OUT (timings.json, probe/)")
    c.add_argument("--cores", required=True, help='"ASRKIT_CPU ESPNET_CPU", recorded in the plan')
    c = sub.add_parser("reuse-probe")
    c.add_argument("--from", dest="src", required=True, help="the OUT of the run whose probe is reused")
    c.add_argument("--out-dir", required=True, help="this run's OUT")
    c = sub.add_parser("show")
    c.add_argument("--plan", required=True, help="OUT/budget.json")
    args = p.parse_args(argv)
    try:
        if args.cmd == "plan":
            cores = [int(c) for c in args.cores.split()]
            if len(cores) != 2:
                raise BenchError(f"--cores needs two CPUs, got '{args.cores}'")
            result = plan(args.out_dir, args.budget_minutes, args.probe_epochs, dict(zip(TOOLKITS, cores)))
        elif args.cmd == "reuse-probe":
            reuse_probe(args.src, args.out_dir)
            return 0
        else:
            if not os.path.isfile(args.plan):
                raise BenchError(f"{args.plan}: no plan: run stage 3 (it plans the epochs before training)")
            result = load_record(args.plan)
    except BenchError as exc:
        print(f"espnet_budget.py {args.cmd}: {exc}", file=sys.stderr)
        return 1
    print(" ".join(str(result[t]["epochs"]) for t in TOOLKITS))  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main())
