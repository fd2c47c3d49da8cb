#!/usr/bin/env python3
"""Write a Kaldi data dir as tar shards (WebDataset layout) for `asrkit train --train-shards`.

usage: tools/make_shards.py [--utts-per-shard N] [--sample-rate HZ] [--shuffle-seed S] DATA_DIR OUT_DIR

OUT_DIR gets shard-000000.tar, shard-000001.tar, ... (N utterances each: 16-bit FLAC audio at HZ and
a JSON of id and transcript) and shards.json, the index every training process plans its epoch from.
Train on all of them with --train-shards OUT_DIR, or on some with a brace pattern such as
--train-shards 'OUT_DIR/shard-{000000..000009}.tar'. Shards of about equal duration keep the ranks'
step counts close, so by default the utterances are shuffled (seeded) before they are cut into shards;
--shuffle-seed -1 keeps the data dir's order. A shard is written under a temporary name and renamed
when complete. Exit status 1 (with a message naming the utterance) on unusable data.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asrkit.data.datadir import DataDirError  # noqa: E402
from asrkit.data.shards import ShardError, write_shards  # noqa: E402
from asrkit.extras import MissingExtraError  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="make_shards.py", description=__doc__.split("\n")[0])
    ap.add_argument("--utts-per-shard", type=int, default=1000, help="utterances per shard (default 1000)")
    ap.add_argument("--sample-rate", type=int, default=16000, help="audio is resampled to this rate")
    ap.add_argument("--shuffle-seed", type=int, default=0, help="seed of the utterance order (-1: keep it)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("data_dir")
    ap.add_argument("out_dir")
    args = ap.parse_args(argv)
    if args.utts_per_shard < 1 or args.sample_rate < 1:
        ap.error("--utts-per-shard and --sample-rate must be positive")
    try:
        shard_set = write_shards(args.data_dir, args.out_dir, args.utts_per_shard, args.sample_rate,
                                 shuffle_seed=None if args.shuffle_seed < 0 else args.shuffle_seed,
                                 progress=not args.no_progress)
    except (DataDirError, ShardError, MissingExtraError, OSError) as exc:
        print(f"make_shards.py: {exc}", file=sys.stderr)
        return 1
    n = sum(len(s.entries) for s in shard_set.shards)
    print(f"{args.out_dir}: {len(shard_set.shards)} shards, {n} utterances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
