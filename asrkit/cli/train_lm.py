"""Train a neural LM (LSTM or Transformer, conf/lm_*.yaml) over a tokenizer's ids into an LM dir.

The text is read like 'asrkit train-ngram' reads it: Kaldi text (utt-id words...) by default, one
sentence per line with --plain-text; empty lines are skipped and counted in the log. The LM dir
(config.yaml, tokenizer.json, model.pt = best dev perplexity) is what 'decode.lm' takes for shallow
fusion. Training runs the loop of 'asrkit train' (gradient accumulation, AMP, torchrun,
train.save_every_steps, the best train.keep_best epochs kept for 'asrkit average --metric valid_loss').
Re-running the same command resumes from the latest checkpoint; a dir holding a different LM (config
or tokenizer) is refused unless --overwrite.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import List, Optional

from asrkit.cli.device import DeviceError, add_device_option, resolve_device
from asrkit.cli.run_options import add_run_options, resume_mode
from asrkit.config import ConfigError, load_lm_config


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="asrkit train-lm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="LM YAML (conf/lm_lstm.yaml, conf/lm_transformer.yaml)")
    p.add_argument("--text", required=True,
                   help="training text: Kaldi text (utt-id words...), or one sentence per line with --plain-text")
    p.add_argument("--dev-text", help="dev text, same format: perplexity per epoch, the best epoch is model.pt")
    p.add_argument("--plain-text", action="store_true",
                   help="the text files hold one sentence per line, no utterance ids")
    p.add_argument("--tokenizer", help="tokenizer JSON (default: the config's tokenizer.path)")
    p.add_argument("--out", required=True, help="LM dir (created; resumed if it holds checkpoints)")
    add_device_option(p, "under torchrun, cuda is cuda:LOCAL_RANK")
    add_run_options(p, "checkpoints and weights")
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
        cfg = load_lm_config(args.config, args.overrides)
    except (DeviceError, ConfigError) as exc:
        print(f"asrkit train-lm: {exc}", file=sys.stderr)
        return 2
    from asrkit.train.lm_task import train_lm
    from asrkit.train.trainer import TrainingError

    resume = resume_mode(args)
    try:
        summary = train_lm(cfg, args.out, args.text, args.dev_text, args.tokenizer, args.plain_text, device,
                           resume)
    except (FileNotFoundError, ValueError, ConfigError) as exc:
        # ExperimentError, text and tokenizer problems are ValueErrors whose message names the file.
        print(f"asrkit train-lm: {exc}", file=sys.stderr)
        return 2
    except TrainingError as exc:
        print(f"asrkit train-lm: {exc}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun, one line from rank 0 is enough
        return 0
    ppl = summary.get("best_valid_ppl")
    print(f"wrote {args.out}" + (f": best dev perplexity {ppl:.2f}" if ppl is not None and math.isfinite(ppl) else ""))
    return 0
