#!/usr/bin/env python3
"""Benchmark of ``asrkit transcribe``: real-time factor and where the time goes, and a long recording.

    python tools/bench/bench_transcribe.py --model recipes/mini/exp/small --data recipes/mini/data/test \
        [--decode-config recipes/mini/exp/small/tune_dev/decode.yaml] [--minutes 60] [--segmenter silero]

1. The data dir's utterances as separate files (after the model is loaded): WER, RTF and its split
   (loading, features, encoder, search).
2. The same utterances one after another, repeated to ``--minutes`` of audio with 0.5 s pauses, written to
   one FLAC file and transcribed with voice-activity segmentation (``--segmenter``: energy, or the Silero VAD
   of the vad extra): WER against the concatenated references,
   (a pause holds noise at the level of its utterance's first 50 ms, its own background: digital silence
   is unlike anything the demo model was trained on),
   RTF, and the peak resident memory of this process and its loader workers (ru_maxrss), measured first so
   that no other step's memory counts.
Prints a table; a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import asrkit  # noqa: E402
from asrkit.audio.io import load_audio  # noqa: E402
from asrkit.config import load_decode_config  # noqa: E402
from asrkit.data.datadir import read_data_dir  # noqa: E402
from asrkit.pipeline import AudioInput  # noqa: E402
from asrkit.score.wer import score_texts  # noqa: E402


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def _long_recording(utts, refs: Dict[str, str], minutes: float, rate: int, path: str) -> Tuple[str, float]:
    """Write the utterances (cycled) with 0.5 s pauses to ``path`` until ``minutes``; the reference text."""
    words: List[str] = []
    total = 0.0
    rng = np.random.default_rng(0)
    with sf.SoundFile(path, "w", samplerate=rate, channels=1, format="FLAC") as out:
        while total < minutes * 60:
            for u in utts:
                audio = load_audio(u.source, rate, name=u.utt).numpy()
                pause = (rng.standard_normal(int(0.5 * rate)) * audio[: rate // 20].std()).astype(np.float32)
                out.write(audio)
                out.write(pause)
                words.append(refs[u.utt])
                total += (len(audio) + len(pause)) / rate
                if total >= minutes * 60:
                    break
    return " ".join(words), total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="Kaldi data dir with text (e.g. the demo's test set)")
    p.add_argument("--decode-config", help="a conf/decode_*.yaml (default: greedy)")
    p.add_argument("--lm", help="LM for the decode config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="decode config overrides")
    p.add_argument("--minutes", type=float, default=60.0, help="length of the long recording (0: skip it)")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--batch-seconds", type=float, default=120.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--segmenter", choices=("energy", "silero"), default="energy",
                   help="how the long recording is split at pauses (silero: pip install -e '.[vad]')")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    overrides = list(args.set) + ([f"lm={args.lm}"] if args.lm else [])
    decode = load_decode_config(args.decode_config, overrides) if args.decode_config else None
    t0 = time.perf_counter()
    model = asrkit.load_model(args.model, decode=decode, batch_seconds=args.batch_seconds, segmenter=args.segmenter)
    load_s = time.perf_counter() - t0
    data = read_data_dir(args.data)
    utts = sorted(data.utterances(), key=lambda u: u.utt)
    refs = {u.utt: data.text[u.utt] for u in utts}
    rows = []
    if args.minutes > 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "long.flac")
            ref, seconds = _long_recording(utts, refs, args.minutes, model.sample_rate, path)
            before = _peak_mb()
            result = model.transcribe([path], num_workers=args.num_workers)[0]
            st = model.stats
            score = score_texts({"long": ref}, {"long": result.text})
            rows.append((f"long recording ({args.segmenter} VAD)", seconds, score, st, f"{max(before, _peak_mb()):.0f} MB peak RSS, "
                         f"{len(result.segments)} segments"))
    inputs = [AudioInput(u.utt, scp_source=u.source) for u in utts]
    model.segmenter = "none"
    results = model.transcribe(inputs, num_workers=args.num_workers)
    score = score_texts(refs, {r.name: r.text for r in results})
    rows.append(("separate utterances", model.stats.audio, score, model.stats, f"{len(results)} files"))
    mode = decode.mode if decode else "greedy"
    print(f"model {args.model}, decode {mode}{' + LM ' + args.lm if args.lm else ''}, {args.threads} thread(s), "
          f"{args.num_workers} loader worker(s); model loaded in {load_s:.2f} s (not counted)")
    print("| input | audio (s) | WER % | wall (s) | RTF | load | features | encoder | search | notes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, audio, sc, st, notes in rows:
        print(f"| {name} | {audio:.0f} | {100 * sc.wer:.2f} | {st.wall:.2f} | {st.rtf:.4f} | {st.load:.2f} | "
              f"{st.features:.2f} | {st.encoder:.2f} | {st.search:.2f} | {notes} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
