"""Choose the LM weight and length bonus on a dev set: WER (or CER) for every pair of a grid.

Encodes the data dir once and runs the configured search (--decode-config with its LM) once per pair.
Prints a table, writes OUT/results.tsv (lm_weight, length_bonus, error rate) and OUT/decode.yaml: the
decoding config with the best pair, ready for 'asrkit decode --decode-config OUT/decode.yaml' from any
directory (its LM path is written absolute).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from asrkit.cli.decode_options import add_decode_options, decode_config_from_args
from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.data.table import read_table
from asrkit.score.wer import score_texts


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit tune-fusion", description=__doc__)
    p.add_argument("--model", required=True, help="experiment dir written by 'asrkit train'")
    p.add_argument("--data", required=True, help="Kaldi data dir with a text file (a dev set, never the test set)")
    p.add_argument("--out", required=True, help="output dir: results.tsv and the best decode.yaml")
    p.add_argument("--lm-weights", type=float, nargs="+", required=True, metavar="W")
    p.add_argument("--length-bonuses", type=float, nargs="+", default=[0.0], metavar="B")
    p.add_argument("--cer", action="store_true", help="choose by character error rate instead of WER")
    p.add_argument("--batch-size", type=int, help="utterances per batch (default: the config's batch_size)")
    add_device_option(p)
    add_decode_options(p)
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        print(f"asrkit tune-fusion: {exc}", file=sys.stderr)
        return 2
    for path, what in ((args.model, "--model"), (args.data, "--data")):
        if not os.path.isdir(path):
            p.error(f"{what} {path}: no such directory")
    text = os.path.join(args.data, "text")
    if not os.path.isfile(text):
        p.error(f"--data {args.data}: no text file to score against")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from asrkit.pipeline import Transcriber, save_tuning, tune_fusion

    try:
        decode = decode_config_from_args(args)
        if decode.lm is None:
            raise ValueError("no LM to tune: give --lm or a decode config with lm set")
        transcriber = Transcriber.from_dir(args.model, device=device, decode=decode)
        refs = read_table(text)
    except (FileNotFoundError, ValueError) as exc:  # ConfigError and TableError are ValueErrors
        print(f"asrkit tune-fusion: {exc}", file=sys.stderr)
        return 1

    def error_rate(hyps: dict) -> float:
        return score_texts(refs, hyps, cer=args.cer).wer

    results = tune_fusion(transcriber, args.data, args.lm_weights, args.length_bonuses, error_rate, args.batch_size)
    unit = "CER" if args.cer else "WER"
    best = save_tuning(args.out, results, decode, unit)
    print(f"{'lm_weight':>9} {'bonus':>6} {unit:>7}")
    for weight, bonus, err in results:
        print(f"{weight:9g} {bonus:6g} {100 * err:6.2f}%{'  <- best' if (weight, bonus, err) == best else ''}")
    print(f"wrote {args.out}/decode.yaml (lm_weight {best[0]:g}, length_bonus {best[1]:g})")
    return 0
