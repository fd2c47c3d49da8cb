#!/usr/bin/env python3
"""Write the lists asrkit's ``augment`` config reads from MUSAN (OpenSLR 17) and RIRS_NOISES (OpenSLR 28).

Usage: local/prepare_augment.py [--rir-sets simulated_rirs/smallroom,simulated_rirs/mediumroom,simulated_rirs/largeroom]
                                [--noise-sets noise,music] AUGMENT_DIR OUT_DIR

AUGMENT_DIR holds musan/ and RIRS_NOISES/ as run.sh stage 0 unpacks them. Writes:
- OUT_DIR/rir_list: the lines of RIRS_NOISES/<set>/rir_list for each --rir-sets entry (Kaldi's
  '--rir-id ID --room-id ROOM [--option value ...] path'), each path made absolute: Kaldi writes them relative to
  AUGMENT_DIR, asrkit reads them relative to its working directory (augment.reverb.rir_list);
- OUT_DIR/train_opts: the `asrkit train --set` lines that use them, one a line: augment.reverb.rir_list=OUT_DIR/rir_list
  and augment.noise.dirs=[musan/<set>, ...] (absolute, as a JSON list: valid YAML whatever the path holds).
The defaults follow Kaldi's multi-condition recipes: the simulated rooms (small, medium, large) for training, the
real responses (real_rirs_isotropic_noises) left for testing; MUSAN's noise and music as noise (its speech is
single talkers: asrkit mixes babble from other training utterances instead).
A missing set, a malformed line, or a listed file that does not exist is one line on stderr naming it (exit 1);
nothing is written then.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

DEFAULT_RIR_SETS = "simulated_rirs/smallroom,simulated_rirs/mediumroom,simulated_rirs/largeroom"
DEFAULT_NOISE_SETS = "noise,music"


class PrepError(Exception):
    """A missing or malformed input; the message names it."""


def rir_lines(augment_dir: str, rir_set: str) -> List[str]:
    """The lines of RIRS_NOISES/<rir_set>/rir_list with absolute paths (each file checked to exist)."""
    path = os.path.join(augment_dir, "RIRS_NOISES", rir_set, "rir_list")
    if not os.path.isfile(path):
        raise PrepError(f"{path}: no such file (is RIRS_NOISES unpacked in {augment_dir}?)")
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) % 2 == 0 or not all(f.startswith("--") for f in fields[:-1:2]):
                raise PrepError(f"{path}:{n}: expected '--rir-id ID --room-id ROOM ... path', got {line.strip()!r}")
            wav = fields[-1] if os.path.isabs(fields[-1]) else os.path.join(os.path.abspath(augment_dir), fields[-1])
            if not os.path.isfile(wav):
                raise PrepError(f"{path}:{n}: {wav}: no such file")
            out.append(" ".join([*fields[:-1], wav]))
    if not out:
        raise PrepError(f"{path}: lists no impulse response")
    return out


def noise_dirs(augment_dir: str, sets: Sequence[str]) -> List[str]:
    """musan/<set> for each set, absolute; each must exist."""
    out = []
    for name in sets:
        d = os.path.join(os.path.abspath(augment_dir), "musan", name)
        if not os.path.isdir(d):
            raise PrepError(f"{d}: no such directory (is MUSAN unpacked in {augment_dir}?)")
        out.append(d)
    return out


def prepare(augment_dir: str, out_dir: str, rir_sets: Sequence[str], noise_sets: Sequence[str]) -> None:
    """Check everything, then write OUT_DIR/rir_list and OUT_DIR/train_opts (each through a temporary file)."""
    lines = [line for s in rir_sets for line in rir_lines(augment_dir, s)]
    dirs = noise_dirs(augment_dir, noise_sets)
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    rir_list = os.path.join(out_dir, "rir_list")
    opts = [f"augment.reverb.rir_list={rir_list}", f"augment.noise.dirs={json.dumps(dirs)}"]
    for path, text in ((rir_list, lines), (os.path.join(out_dir, "train_opts"), opts)):
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write("".join(f"{t}\n" for t in text))
        os.replace(path + ".tmp", path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rir-sets", default=DEFAULT_RIR_SETS,
                   help="folders under RIRS_NOISES holding a rir_list, comma-separated")
    p.add_argument("--noise-sets", default=DEFAULT_NOISE_SETS, help="folders under musan, comma-separated")
    p.add_argument("augment_dir")
    p.add_argument("out_dir")
    args = p.parse_args(argv)
    split = [[x for x in v.split(",") if x] for v in (args.rir_sets, args.noise_sets)]
    if not split[0] or not split[1]:
        p.error("--rir-sets and --noise-sets need at least one name each")
    try:
        prepare(args.augment_dir, args.out_dir, *split)
    except PrepError as exc:
        print(f"prepare_augment.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
