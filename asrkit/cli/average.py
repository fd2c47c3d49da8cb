"""Average the weights of the best K epoch checkpoints of an experiment into model.pt (or --out).

The best are chosen by the validation metric recorded in exp/DIR/checkpoints.json (default: the
experiment's train.best_metric); training keeps train.keep_best of them, so K should not exceed it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from asrkit.checkpoint import METRICS


def _best_metric(config_path: str) -> str:
    """train.best_metric of an ASR experiment's or an LM dir's config."""
    from asrkit.config import ConfigError, load_config, load_lm_config

    try:
        return load_config(config_path).train.best_metric
    except ConfigError as asr_error:
        try:
            return load_lm_config(config_path).train.best_metric
        except ConfigError:
            raise asr_error from None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit average", description=__doc__)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train' or 'asrkit train-lm'")
    p.add_argument("--best", type=int, required=True, metavar="K", help="number of best epoch checkpoints to average")
    p.add_argument("--metric", choices=sorted(METRICS), help="ranking metric (default: the config's train.best_metric)")
    p.add_argument("--out", help="output weights file (default: MODEL/model.pt)")
    args = p.parse_args(argv)
    if args.best < 1:
        p.error(f"--best must be at least 1, got {args.best}")
    if not os.path.isfile(os.path.join(args.model, "config.yaml")):
        print(f"asrkit average: {args.model}: not an experiment directory (no config.yaml)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from asrkit.checkpoint import average_best
    from asrkit.config import ConfigError

    try:
        metric = args.metric or _best_metric(os.path.join(args.model, "config.yaml"))
        out, files = average_best(args.model, args.best, metric, args.out)
    except (ValueError, ConfigError) as exc:
        print(f"asrkit average: {exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(files)} checkpoints ({', '.join(files)}) by {metric} into {out}")
    return 0
