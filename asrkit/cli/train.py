"""Train a model from a YAML config on Kaldi data dirs into an experiment directory.

Resuming: if the experiment dir already holds checkpoints of the same experiment (same config up
to epochs/logging/checkpoint settings, same tokenizer and CMVN), training continues from the latest
one (also after a kill -9 mid-epoch), as if it had never stopped; with the last epoch done it
does nothing. A directory holding a different experiment is refused. --resume insists on resuming
(error if there is nothing to resume); --overwrite deletes the old checkpoints and starts again.

Several processes (GPUs or CPU workers) train with DDP through torchrun, e.g.
  torchrun --standalone --nproc_per_node=4 -m asrkit train --config ... --out exp/x
(multi-node: --nnodes=N --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT; the exp dir must be shared).

Data at scale: --train-shards streams tar shards written by tools/make_shards.py instead of a data dir
(each shard read by one process and loader worker per epoch; ranks take equal steps). With
--train-shards, a mid-epoch resume needs the same number of processes and data.num_workers.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.cli.run_options import add_run_options, resume_mode
from asrkit.config import ConfigError, load_config


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="experiment YAML (conf/*.yaml)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--train-data", help="Kaldi data dir for training")
    source.add_argument("--train-shards", help="tar shards for training, from tools/make_shards.py: their dir, or "
                                               "a brace pattern such as 'DIR/shard-{000000..000009}.tar' "
                                               "(streamed; data.shard_buffer utterances are bucketed at a time)")
    p.add_argument("--valid-data", help="Kaldi data dir for validation loss/accuracy (needed to keep the best "
                                        "checkpoints by train.best_metric)")
    p.add_argument("--out", required=True, help="experiment dir (created; resumed if it holds checkpoints)")
    p.add_argument("--tokenizer", help="tokenizer JSON (default: the config's tokenizer.path)")
    p.add_argument("--cmvn", help="global CMVN stats from 'asrkit compute-cmvn' (default: the config's cmvn)")
    add_device_option(p, "under torchrun, cuda is cuda:LOCAL_RANK")
    add_run_options(p, "checkpoints, weights and logs of the experiment")
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
        cfg = load_config(args.config, args.overrides)
    except (DeviceError, ConfigError) as exc:
        print(f"asrkit train: {exc}", file=sys.stderr)
        return 2
    from asrkit.data.datadir import DataDirError
    from asrkit.train.trainer import TrainingError, train

    resume = resume_mode(args)
    try:
        train(cfg, args.out, args.train_data or args.train_shards, args.valid_data, args.tokenizer, args.cmvn, device, resume)
    except (FileNotFoundError, ValueError, ConfigError, DataDirError) as exc:
        # ExperimentError and checkpoint problems are ValueErrors with a message naming the file.
        print(f"asrkit train: {exc}", file=sys.stderr)
        return 2
    except TrainingError as exc:
        print(f"asrkit train: {exc}", file=sys.stderr)
        return 1
    return 0
