#!/usr/bin/env python3
"""Convert one LibriSpeech subset into a Kaldi data dir.

Usage: local/data_prep.py CORPUS/LibriSpeech/train-clean-100 data/train_clean_100

LibriSpeech lays out SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt with one
``UTT WORDS...`` line per utterance and UTT.flac beside it. The data dir gets
wav.scp (absolute FLAC paths), text, utt2spk and spk2utt, sorted as Kaldi
expects; utterance ids already start with the speaker id. A transcript line
whose FLAC is missing is reported and left out.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)

from asrkit.data.datadir import DataDir, write_data_dir  # noqa: E402


def prepare(src: str, dst: str) -> DataDir:
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: no such LibriSpeech subset directory")
    wav_scp: Dict[str, str] = {}
    text: Dict[str, str] = {}
    utt2spk: Dict[str, str] = {}
    missing: List[str] = []
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(f for f in files if f.endswith(".trans.txt")):
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    fields = line.split()
                    if not fields:
                        continue
                    utt = fields[0]
                    flac = os.path.abspath(os.path.join(root, utt + ".flac"))
                    if not os.path.isfile(flac):
                        missing.append(f"{path}:{lineno}: {utt}.flac not found")
                        continue
                    wav_scp[utt], text[utt], utt2spk[utt] = flac, " ".join(fields[1:]), utt.split("-")[0]
    if not wav_scp:
        raise ValueError(f"{src}: no *.trans.txt transcripts with audio found")
    for m in missing[:10]:
        print(f"data_prep: {m}", file=sys.stderr)
    if missing:
        print(f"data_prep: {len(missing)} utterances without audio left out", file=sys.stderr)
    dd = DataDir(wav_scp=wav_scp, text=text, utt2spk=utt2spk)
    write_data_dir(dd, dst)
    return dd


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="LibriSpeech subset dir, e.g. /corpora/LibriSpeech/dev-clean")
    p.add_argument("dst", help="output Kaldi data dir")
    args = p.parse_args(argv)
    try:
        dd = prepare(args.src, args.dst)
    except (FileNotFoundError, ValueError) as exc:
        print(f"data_prep: {exc}", file=sys.stderr)
        return 1
    print(f"{args.dst}: {len(dd.wav_scp)} utterances, {len(dd.spk2utt)} speakers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
