#!/usr/bin/env python3
"""The table of tools/espnet/bench_espnet.sh (stage 7): WER, CER and training throughput of asrkit and ESPnet2.

usage: espnet_report.py --out OUT --data DIR (--epochs N | --budget-plan OUT/budget.json) [--threads T]

Scores asrkit's and ESPnet's hypotheses (ESPnet: best path and its beam-1 prefix search) on DIR/test/text with
asrkit's scorer, takes the training wall times from OUT/timings.json (tools/espnet/espnet_bench.py timed), the epochs'
training parts from both training logs, the per-step times from OUT/step_time.json
(tools/espnet/espnet_step_time.py) and the batch counts from OUT/espnet/batches.json (tools/espnet/espnet_bench.py config);
writes OUT/results.md and prints it. A row whose hypotheses or training time are missing is left out, with a
line on stderr. An equal-time run (bench_espnet.sh --budget-minutes) gives each toolkit its own epochs: --budget-plan
(tools/espnet/espnet_budget.py's plan) says how many, and the table says how they were chosen. Run it with the
toolkit's .venv (it imports asrkit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

sys.path.insert(0, str(Path(__file__).resolve().parent))  # espnet_bench beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # asrkit from a checkout without installing

from espnet_bench import BenchError, load_record, read_table  # noqa: E402

# Row labels of the table; "espnet" (best path, asrkit's decoding rule) is what the WER ratio is taken against.
ROW_LABELS = {"asrkit": "asrkit, best path", "espnet": "ESPnet2, best path",
              "espnet_search": "ESPnet2, its beam-1 CTC prefix search",
              "asrkit_lm": "asrkit, with the LM", "espnet_lm": "ESPnet2, with the LM (asrkit's search on its posteriors)"}

_DURATION = re.compile(r"([0-9.]+) (hour|minute|second)s?")
_UNIT = {"hour": 3600.0, "minute": 60.0, "second": 1.0}


def audio_seconds(data_dir: str) -> float:
    """The total duration of a data dir, summed from its utt2dur."""
    with open(os.path.join(data_dir, "utt2dur"), encoding="utf-8") as fh:
        return sum(float(line.split()[1]) for line in fh if line.strip())


def epoch_train_seconds(log_path: str, toolkit: str) -> Optional[float]:
    """The training part of every epoch (no start-up, validation or checkpoints), summed from a training log:
    asrkit's "epoch N: train loss ... (K updates ..., 22.8s, ...)", ESPnet's "Nepoch results: [train] ...
    time=1 minute and 3.41 seconds, ... [valid] ..."; None when the log has no epoch line."""
    total, found = 0.0, False
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if toolkit == "asrkit":
                m = re.search(r"asrkit\.train: epoch \d+: train loss \S+ \(\d+ updates to step \d+, ([0-9.]+)s", line)
                if m:
                    total, found = total + float(m.group(1)), True
            elif "epoch results: [train]" in line:
                train = line.split("[train]", 1)[1].split("[valid]", 1)[0]
                m = re.search(r"\btime=([^,]+)", train)
                if m:
                    total += sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(m.group(1)))
                    found = True
    return total if found else None


def results_table(rows: Dict[str, Dict[str, float]], train_seconds: float, epochs: Union[int, Dict[str, int]],
                  threads: int) -> str:
    """The markdown table: per row WER, CER, training wall seconds and audio seconds per second (the whole
    command; and the epochs' training parts alone, when ``train_only_s`` is known); then the ratios the issue's
    targets are stated in (on the whole command). Rows are keyed as :data:`ROW_LABELS`: the WER ratio compares
    asrkit with ESPnet decoded by the same rule (best path), and is also given against ESPnet's own search.
    ``epochs``: of both toolkits, or {"asrkit": N, "espnet": M} after an equal-time run."""
    per_toolkit = epochs if isinstance(epochs, dict) else {"asrkit": epochs, "espnet": epochs}
    label = (f"asrkit {per_toolkit['asrkit']}, ESPnet {per_toolkit['espnet']} epochs" if isinstance(epochs, dict)
             else f"{epochs} epochs")
    audio = {name: train_seconds * per_toolkit[name.split("_")[0]] for name in rows}  # "espnet_search": ESPnet's
    lines = [f"| toolkit, decoding | WER % | CER % | train wall s ({label}) | train audio s / s | "
             "epochs' training parts s | audio s / s in them |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        only = r.get("train_only_s")
        extra = f"{only:.0f} | {audio[name] / only:.1f}" if only else "- | -"
        lines.append(f"| {ROW_LABELS.get(name, name)} | {100 * r['wer']:.2f} | {100 * r['cer']:.2f} | "
                     f"{r['train_s']:.0f} | {audio[name] / r['train_s']:.1f} | {extra} |")
    if "asrkit" in rows and "espnet" in rows:
        a, e = rows["asrkit"], rows["espnet"]
        speed = {name: audio[name] / rows[name]["train_s"] for name in ("asrkit", "espnet")}
        wer_ratio = a["wer"] / e["wer"] if e["wer"] > 0 else math.inf
        lines += ["", f"asrkit / ESPnet WER, both best path: {wer_ratio:.2f} (target <= 0.9)"]
        if "espnet_search" in rows:
            es = rows["espnet_search"]["wer"]
            lines[-1] += f"; against ESPnet's beam-1 prefix search: {a['wer'] / es if es > 0 else math.inf:.2f}"
        if "asrkit_lm" in rows and "espnet_lm" in rows:
            el = rows["espnet_lm"]["wer"]
            lines[-1] += f"; both with the same LM and search: {rows['asrkit_lm']['wer'] / el if el > 0 else math.inf:.2f}"
        lines[-1] += f"; asrkit / ESPnet training throughput: {speed['asrkit'] / speed['espnet']:.2f} (target >= 1.3)"
        if a.get("train_only_s") and e.get("train_only_s"):
            ratio = (audio["asrkit"] / a["train_only_s"]) / (audio["espnet"] / e["train_only_s"])
            lines[-1] += f"; in the epochs' training parts: {ratio:.2f}"
    lines += ["", f"Training data {train_seconds:.0f} s of audio x {label}; OMP_NUM_THREADS={threads}. "
                  "Train wall time: the whole training command (start-up, model building, data loading, "
                  "per-epoch validation on dev, checkpoints); not CMVN/collect_stats nor decoding. The epochs' "
                  "training parts: the times both trainers log per epoch for the training pass alone. "
                  "No LM but in the rows that say so (bench_espnet.sh --lm-decode-config: asrkit's search with "
                  "that decode config on each model's CTC log-probabilities); all rows scored by asrkit's scorer on the same test/text. Best path: frame argmax, "
                  "repeats collapsed, blanks dropped (asrkit decode's greedy mode; espnet_bench.py greedy for "
                  "ESPnet). ESPnet's asr_inference with beam 1 and ctc_weight 1.0 is a label-synchronous CTC "
                  "prefix search, not best path: the same ESPnet model as the row above, decoded its way."]
    return "\n".join(lines) + "\n"


def score_rows(out_dir: str, data_dir: str) -> Dict[str, Dict[str, float]]:
    """The table's rows from the benchmark's OUT dir: WER, CER (asrkit's scorer on DATA/test/text), training
    wall seconds and, where the training log has epoch lines, the epochs' training parts. A row whose
    hypotheses or training time are missing is left out, with a line on stderr."""
    from asrkit.score.wer import score_files

    record = load_record(os.path.join(out_dir, "timings.json"))
    ref = os.path.join(data_dir, "test", "text")
    # row -> (toolkit, hypotheses); both ESPnet rows decode the same model (stage 4)
    hyps = {"asrkit": ("asrkit", os.path.join(out_dir, "asrkit", "decode_test", "text")),
            "espnet": ("espnet", os.path.join(out_dir, "espnet", "decode_test_greedy", "text")),
            "espnet_search": ("espnet", os.path.join(out_dir, "espnet", "decode_test", "1best_recog", "text")),
            "asrkit_lm": ("asrkit", os.path.join(out_dir, "asrkit", "decode_test_lm", "text")),
            "espnet_lm": ("espnet", os.path.join(out_dir, "espnet", "decode_test_lm", "text"))}
    rows: Dict[str, Dict[str, float]] = {}
    refs = set(read_table(ref))
    for name, (toolkit, hyp) in hyps.items():
        if not os.path.isfile(hyp) or f"{toolkit}_train" not in record:
            print(f"report: {ROW_LABELS[name]}: no hypotheses at {hyp} or no training time; left out",
                  file=sys.stderr)
            continue
        covered = len(refs & set(read_table(hyp)))
        if covered < len(refs):  # a decoding killed half-way: its missing utterances would count as deletions
            print(f"report: {ROW_LABELS[name]}: {hyp} has {covered} of the {len(refs)} test utterances (cut short?); "
                  "left out", file=sys.stderr)
            continue
        rows[name] = {"wer": score_files(ref, hyp).wer, "cer": score_files(ref, hyp, cer=True).wer,
                      "train_s": record[f"{toolkit}_train"]}
        log = os.path.join(out_dir, toolkit, "exp/train.log" if toolkit == "asrkit" else "train.log")
        only = epoch_train_seconds(log, toolkit) if os.path.isfile(log) else None
        if only:
            rows[name]["train_only_s"] = only
    return rows


def step_time_lines(steps: Dict[str, Sequence[Sequence[float]]]) -> str:
    """The per-step section from OUT/step_time.json ({toolkit: [[ms per step, audio s per s], ...]}): the
    best run of each toolkit, and the ESPnet / asrkit ratio when both ran."""
    text = "\nPer step on identical batches (forward, backward, clipping, update; best of the runs):\n"
    for name, runs in steps.items():
        ms = min(r[0] for r in runs)
        text += f"- {name}: {ms:.0f} ms/step ({max(r[1] for r in runs):.1f} audio s/s)\n"
    if {"asrkit", "espnet"} <= set(steps):
        ratio = min(r[0] for r in steps["espnet"]) / min(r[0] for r in steps["asrkit"])
        text += f"- ESPnet / asrkit step time: {ratio:.2f}\n"
    return text


def budget_line(plan: Dict) -> str:
    """How an equal-time run chose each toolkit's epochs (tools/espnet/espnet_budget.py's plan)."""
    fits = [f"{name} {plan[key]['per_epoch_s']:.0f} s per epoch + {plan[key]['startup_s']:.0f} s start-up -> "
            f"{plan[key]['epochs']} epochs" for key, name in (("asrkit", "asrkit"), ("espnet", "ESPnet"))]
    probe = (f"the {plan['probe_epochs']}-epoch probe of {plan['probe_from']}, run the same way" if "probe_from" in plan
             else f"a {plan['probe_epochs']}-epoch probe run the same way")
    return (f"Equal training time: a budget of {plan['budget_s']:.0f} s each, both trainings at once (asrkit on core "
            f"{plan['cores']['asrkit']}, ESPnet on core {plan['cores']['espnet']}); epochs from {probe}: "
            f"{', '.join(fits)}.\n")


def fusion_line(out_dir: str) -> str:
    """The LM weight and length bonus each toolkit's LM row used (its decode_test_lm/decode.yaml), and whether
    they were chosen on dev (bench_espnet.sh --lm-weights: its tune_dev/); '' without both LM rows."""
    from asrkit.config import load_decode_config

    used = []
    for key, name in (("asrkit", "asrkit"), ("espnet", "ESPnet")):
        path = os.path.join(out_dir, key, "decode_test_lm", "decode.yaml")
        if not os.path.isfile(path):
            return ""
        cfg = load_decode_config(path)
        tuned = os.path.isfile(os.path.join(out_dir, key, "tune_dev", "results.tsv"))
        used.append(f"{name} {cfg.lm_weight:g} / {cfg.length_bonus:g}{' (chosen on dev)' if tuned else ''}")
    return f"LM weight / length bonus of the LM rows: {', '.join(used)}.\n"


def write_report(out_dir: str, data_dir: str, epochs: Optional[int], threads: int = 1,
                 budget_plan: Optional[str] = None) -> str:
    """The whole report of the benchmark's OUT dir (the table, the per-step times and the batch counts where
    their files exist), written to OUT/results.md and returned. Nothing to score is a :class:`BenchError`.
    ``budget_plan``: OUT/budget.json of an equal-time run (each toolkit's epochs; ``epochs`` is then None)."""
    rows = score_rows(out_dir, data_dir)
    if not rows:
        raise BenchError(f"{out_dir}: nothing to report yet")
    plan = load_record(budget_plan) if budget_plan else None
    if budget_plan and not plan:
        raise BenchError(f"{budget_plan}: no plan (bench_espnet.sh stage 3 writes it)")
    per_toolkit = {key: plan[key]["epochs"] for key in ("asrkit", "espnet")} if plan else epochs
    if per_toolkit is None:
        raise BenchError("the epochs of the run are needed (--epochs or --budget-plan)")
    table = results_table(rows, audio_seconds(os.path.join(data_dir, "train")), per_toolkit, threads)
    if plan:
        table += budget_line(plan)
    table += fusion_line(out_dir)
    steps = load_record(os.path.join(out_dir, "step_time.json"))
    if steps:
        table += step_time_lines(steps)
    batches = os.path.join(out_dir, "espnet", "batches.json")
    if os.path.isfile(batches):
        with open(batches, encoding="utf-8") as fh:
            b = json.load(fh)
        table += (f"Batches per epoch: asrkit {b['asrkit']}, ESPnet {b['espnet']} (ESPnet batch_bins "
                  f"{b['espnet_batch_bins']}, chosen for the same count).\n")
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(table)
    return table


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the benchmark's OUT dir")
    p.add_argument("--data", required=True, help="the benchmark's data dir (its test/text and train/utt2dur)")
    runs = p.add_mutually_exclusive_group(required=True)
    runs.add_argument("--epochs", type=int, help="the epochs both toolkits trained")
    runs.add_argument("--budget-plan", help="OUT/budget.json of an equal-time run (each toolkit's epochs)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the runs, for the table's note")
    args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        p.error(f"--epochs {args.epochs}: the benchmark trains at least one epoch")
    try:
        table = write_report(args.out, args.data, args.epochs, args.threads, args.budget_plan)
    except BenchError as exc:
        print(f"espnet_report.py: {exc}", file=sys.stderr)
        return 1
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
