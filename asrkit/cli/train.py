"""Train a model from a YAML config on Kaldi data dirs into an experiment directory."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from asrkit.config import ConfigError, load_config


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train", description=__doc__)
    p.add_argument("--config", required=True, help="experiment YAML (conf/*.yaml)")
    p.add_argument("--train-data", required=True, help="Kaldi data dir for training")
    p.add_argument("--valid-data", help="Kaldi data dir for validation loss")
    p.add_argument("--out", required=True, help="experiment dir (created)")
    p.add_argument("--tokenizer", help="tokenizer JSON (default: the config's tokenizer.path)")
    p.add_argument("--cmvn", help="global CMVN stats from 'asrkit compute-cmvn' (default: the config's cmvn)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.epochs=5 (repeatable)")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"asrkit train: {exc}", file=sys.stderr)
        return 2
    from asrkit.train.trainer import Trainer, prepare_experiment, setup_logging

    try:
        cfg = prepare_experiment(cfg, args.out, args.tokenizer, args.cmvn)
    except (FileNotFoundError, ValueError) as exc:
        print(f"asrkit train: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.out)
    Trainer(cfg, args.out, args.train_data, args.valid_data, device=args.device).fit()
    return 0
