#!/usr/bin/env python3
"""Does an experiment config already hold some settings? For reusing a trained run as one of a comparison's runs.

usage: tools/config_matches.py CONFIG [--set key=value ...]

CONFIG is an experiment YAML (an experiment dir's config.yaml, which holds every setting its run used). Exit
status 0 when applying the ``--set`` overrides to it changes nothing; 1 when it changes something, with one
line per differing key on stderr (``model.interctc_weight: 0.0 in CONFIG, 0.3 wanted``); 2 for a config or
override that does not load.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Sequence

from asrkit.config import ConfigError, flatten_dict, load_config, to_dict


def differences(path: str, overrides: Sequence[str]) -> List[str]:
    """One 'key: X in CONFIG, Y wanted' line per setting the overrides change, in the config's key order."""
    have = flatten_dict(to_dict(load_config(path)))
    want = flatten_dict(to_dict(load_config(path, overrides)))
    return [f"{key}: {have.get(key)!r} in {path}, {want[key]!r} wanted" for key in want if have.get(key) != want[key]]


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(list(argv) or None)
    try:
        diff = differences(args.config, args.overrides)
    except ConfigError as e:
        print(f"config_matches: {e}", file=sys.stderr)
        return 2
    for line in diff:
        print(f"config_matches: {line}", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
