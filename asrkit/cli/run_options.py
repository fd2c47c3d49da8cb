"""Options shared by the training subcommands (`asrkit train`, `asrkit train-lm`): resuming and --set."""
from __future__ import annotations

import argparse


def add_run_options(p: argparse.ArgumentParser, deleted: str) -> None:
    """--resume / --overwrite (exclusive) and repeatable --set KEY=VALUE; `deleted` names what --overwrite removes."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="require resuming from the latest checkpoint in --out")
    mode.add_argument("--overwrite", action="store_true", help=f"delete the {deleted} in --out and start again")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.epochs=5 (repeatable)")


def resume_mode(args: argparse.Namespace) -> str:
    """The trainer's ``resume`` argument: "require", "overwrite" or "auto"."""
    return "require" if args.resume else "overwrite" if args.overwrite else "auto"
