#!/usr/bin/env python3
"""Benchmark of live recognition (issue 30's targets): accuracy by chunk size, speed, latency and memory.

    python tools/bench/bench_streaming.py --model recipes/mini/exp/small_streaming --data recipes/mini/data/test \
        [--lm-config recipes/mini/exp/small_streaming/tune_dev/decode.yaml] [--chunks 640 320] [--minutes 60]

1. **WER by chunk size**: the data dir's utterances decoded offline (full context) and as live streams
   (``transcribe --streaming``'s path: fed one chunk at a time, endpoints on) at each ``--chunks`` size, greedy
   and with ``--lm-config`` (a decode config with the word LM); the ratio to full context in brackets.
2. **One stream** (``--lm-config``'s search, or greedy; ``--threads 1``, one core): the utterances one after
   another as one stream fed chunk by chunk: RTF (compute / audio), partial latency (the compute from a chunk's
   last sample to its partial: ``accept_waveform`` of the piece that completes the chunk) and final latency
   (the same for the chunk whose endpoint fires: the chunk, the final N-best, rescoring and word alignment).
3. **Concurrent streams** (``--stream-threads``, default 2): N streams' audio arrives at real time, one chunk
   per stream every chunk; the batched recognizer decodes each tick's N chunks as one batch. N is sustained
   when every tick (after the first) finishes within one chunk of audio, so every partial is out before the next
   chunk arrives. Doubling, then bisection: the largest N sustained.
4. **Memory over a long stream**: ``--minutes`` of the utterances cycled with 0.5 s pauses (noise at each
   utterance's own level), one stream; resident memory (RSS) at 1 minute, at half and at the end.
Prints markdown tables; a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import asrkit  # noqa: E402
from asrkit.audio.io import load_audio  # noqa: E402
from asrkit.config import DecodeConfig, load_decode_config  # noqa: E402
from asrkit.data.datadir import read_data_dir  # noqa: E402
from asrkit.pipeline import AudioInput, Transcriber  # noqa: E402
from asrkit.pipeline.streaming_files import stream_inputs  # noqa: E402
from asrkit.score.wer import score_texts  # noqa: E402


WARMUP_TICKS = 3  # ticks of the concurrent-streams test that are not timed


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _wer(refs: Dict[str, str], hyps: Dict[str, str]) -> float:
    return 100.0 * score_texts(refs, hyps).wer


def _offline(model: Transcriber, wavs: Dict[str, torch.Tensor], decode: DecodeConfig) -> Dict[str, str]:
    searcher_model = Transcriber(model.model, model.cfg, model.tokenizer, model.device, decode)
    names = list(wavs)
    out: Dict[str, str] = {}
    for i in range(0, len(names), 16):
        batch = names[i: i + 16]
        for name, hyps in zip(batch, searcher_model.transcribe_nbest([wavs[n] for n in batch])):
            out[name] = hyps[0].text
    return out


def _streamed(model: Transcriber, wavs: Dict[str, torch.Tensor], decode: DecodeConfig, chunk_ms: int
              ) -> Dict[str, str]:
    rec = Transcriber(model.model, model.cfg, model.tokenizer, model.device, decode).streaming_recognizer(
        chunk_ms=chunk_ms)
    inputs = [AudioInput(name, waveform=w) for name, w in wavs.items()]
    return {r.name: r.text for r in stream_inputs(rec, inputs, max_streams=16)}


def _pieces(audio: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    for start in range(0, audio.numel(), size):
        yield audio[start: start + size]


def _one_stream(model: Transcriber, audio: torch.Tensor, decode: DecodeConfig, chunk_ms: int
                ) -> Tuple[float, List[float], List[float], str]:
    """(RTF, partial latencies, final latencies (seconds), where the time went) of one stream fed chunk by
    chunk."""
    stream = Transcriber(model.model, model.cfg, model.tokenizer, model.device, decode).stream(chunk_ms=chunk_ms)
    piece = int(round(chunk_ms / 1000 * model.sample_rate))
    partial, final = [], []
    total = 0.0
    for x in _pieces(audio, piece):
        finals = len(stream.finals)
        t0 = time.perf_counter()
        stream.accept_waveform(x)
        dt = time.perf_counter() - t0
        total += dt
        (final if len(stream.finals) > finals else partial).append(dt)
    t0 = time.perf_counter()
    stream.finish()
    total += time.perf_counter() - t0
    st = stream.recognizer.stats
    split = (f"encoder {st.encoder / total:.0%}, search {st.search / total:.0%}, finals {st.final / total:.0%}, "
             f"frontend and the rest {1 - (st.encoder + st.search + st.final) / total:.0%}")
    return total / (audio.numel() / model.sample_rate), partial, final, split


def _sustains(model: Transcriber, audio: torch.Tensor, decode: DecodeConfig, chunk_ms: int, n: int,
              seconds: float) -> Tuple[bool, float]:
    """Whether n concurrent real-time streams (each the audio from another offset) are each decoded within one
    chunk per tick, over ``seconds`` of audio; and the slowest tick (seconds)."""
    rec = Transcriber(model.model, model.cfg, model.tokenizer, model.device, decode).streaming_recognizer(
        chunk_ms=chunk_ms)
    streams = [rec.create_stream(f"s{i}") for i in range(n)]
    piece = int(round(chunk_ms / 1000 * model.sample_rate))
    offsets = [(i * 7919 * piece) % max(1, audio.numel() - piece) for i in range(n)]
    budget = chunk_ms / 1000
    slowest = 0.0
    for tick in range(int(seconds * 1000 / chunk_ms)):
        t0 = time.perf_counter()
        for s, off in zip(streams, offsets):
            start = (off + tick * piece) % max(1, audio.numel() - piece)
            s.accept_waveform(audio[start: start + piece])
        rec.decode_streams(streams)
        dt = time.perf_counter() - t0
        if tick >= WARMUP_TICKS:  # the first chunks pay one-time costs (allocations, the LM's first look-ups)
            slowest = max(slowest, dt)
            if dt > budget:
                return False, slowest
    return True, slowest


def _max_streams(model: Transcriber, audio: torch.Tensor, decode: DecodeConfig, chunk_ms: int, seconds: float,
                 limit: int) -> Tuple[int, float]:
    """The largest N of concurrent real-time streams sustained (doubling, then bisection), and its slowest tick."""
    def trial(count: int) -> Tuple[bool, float]:
        ok, slowest = _sustains(model, audio, decode, chunk_ms, count, seconds)
        print(f"  {count} streams: {'sustained' if ok else 'too slow'} (slowest tick {1000 * slowest:.0f} ms)",
              file=sys.stderr, flush=True)
        return ok, slowest

    good, slow, n = 0, 0.0, 1
    while n <= limit:
        ok, s = trial(n)
        if not ok:
            break
        good, slow, n = n, s, n * 2
    lo, hi = good, min(n, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, s = trial(mid)
        if ok:
            lo, slow = mid, s
        else:
            hi = mid
    return lo, slow


def _long_audio(wavs: Sequence[torch.Tensor], minutes: float, rate: int) -> Iterator[torch.Tensor]:
    """The utterances cycled with 0.5 s pauses (noise at the utterance's first 50 ms' level) for ``minutes``."""
    rng = np.random.default_rng(0)
    total = 0
    while total < minutes * 60 * rate:
        for w in wavs:
            pause = torch.from_numpy((rng.standard_normal(rate // 2) * float(w[: rate // 20].std())).astype(np.float32))
            for x in (w, pause):
                yield x
                total += x.numel()
            if total >= minutes * 60 * rate:
                return


def _memory(model: Transcriber, wavs: Sequence[torch.Tensor], decode: DecodeConfig, chunk_ms: int, minutes: float
            ) -> List[Tuple[float, float]]:
    """(minutes of audio, RSS MB) at 1 minute, half way and the end of one long stream."""
    stream = Transcriber(model.model, model.cfg, model.tokenizer, model.device, decode).stream(chunk_ms=chunk_ms)
    rate = model.sample_rate
    marks = sorted({min(1.0, minutes), minutes / 2, minutes})
    out: List[Tuple[float, float]] = []
    fed = 0
    for x in _long_audio(wavs, minutes, rate):
        for piece in _pieces(x, int(round(chunk_ms / 1000 * rate))):
            stream.accept_waveform(piece)
            fed += piece.numel()
            stream.pop_finals()  # a live client takes its finals; the stream keeps its own list (a few KB/min)
            while marks and fed >= marks[0] * 60 * rate:
                out.append((marks.pop(0), _rss_mb()))
    stream.finish()
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="experiment dir of a streaming-trained model")
    p.add_argument("--data", required=True, help="Kaldi data dir with text (e.g. the demo's test set)")
    p.add_argument("--lm-config", help="a decode config with the word LM (ctc_prefix or rescore)")
    p.add_argument("--chunks", type=int, nargs="+", default=[640, 320], help="chunk sizes in ms")
    p.add_argument("--minutes", type=float, default=60.0, help="length of the long stream (0: skip it)")
    p.add_argument("--stream-seconds", type=float, default=20.0,
                   help="audio per stream when testing N concurrent streams")
    p.add_argument("--max-streams", type=int, default=256, help="the most concurrent streams tried")
    p.add_argument("--threads", type=int, default=1, help="torch threads for one stream (RTF, latency, memory)")
    p.add_argument("--stream-threads", type=int, default=2, help="torch threads for the concurrent streams")
    p.add_argument("--limit", type=int, default=0, help="decode only the first N utterances (0: all)")
    p.add_argument("--no-wer", action="store_true", help="leave out the WER table (speed, latency, memory only)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = asrkit.load_model(args.model)
    data = read_data_dir(args.data)
    utts = sorted(data.utterances(), key=lambda u: u.utt)[: args.limit or None]
    refs = {u.utt: data.text[u.utt] for u in utts}
    wavs = {u.utt: load_audio(u.source, model.sample_rate, start=u.start, end=u.end, name=u.utt) for u in utts}
    searches = [("greedy", DecodeConfig())]
    if args.lm_config:
        searches.append((os.path.basename(args.lm_config), load_decode_config(args.lm_config)))
    lm_name, lm_decode = searches[-1]
    chunk = args.chunks[0]
    print(f"model {args.model}; data {args.data} ({len(utts)} utterances, "
          f"{sum(w.numel() for w in wavs.values()) / model.sample_rate:.0f} s); {args.threads} thread(s) for one "
          f"stream, {args.stream_threads} for the concurrent streams; {os.cpu_count()} CPUs\n")
    if not args.no_wer:
        print("| search | full context WER % | " + " | ".join(f"{c} ms WER % (x full)" for c in args.chunks) + " |")
        print("| --- | ---: | " + " | ".join("---:" for _ in args.chunks) + " |")
    for name, decode in [] if args.no_wer else searches:
        full = _wer(refs, _offline(model, wavs, decode))
        cells = []
        for c in args.chunks:
            wer = _wer(refs, _streamed(model, wavs, decode, c))
            cells.append(f"{wer:.2f} ({wer / full:.2f})" if full else f"{wer:.2f}")
        print(f"| {name} | {full:.2f} | " + " | ".join(cells) + " |", flush=True)
    audio = torch.cat([torch.cat([w, torch.zeros(model.sample_rate // 2)]) for w in wavs.values()])
    rtf, partial, final, split = _one_stream(model, audio, lm_decode, chunk)
    torch.set_num_threads(args.stream_threads)
    n, slow = _max_streams(model, audio, lm_decode, chunk, args.stream_seconds,
                           args.max_streams)
    torch.set_num_threads(args.threads)
    memory = _memory(model, list(wavs.values()), lm_decode, chunk, args.minutes) if args.minutes > 0 else []

    def ms(xs: List[float], q: float) -> str:
        return f"{1000 * statistics.quantiles(xs, n=100)[int(q) - 1]:.0f}" if len(xs) > 1 else (
            f"{1000 * xs[0]:.0f}" if xs else "-")

    print(f"\n| measure ({lm_name}, {chunk} ms chunks) | value | target |")
    print("| --- | ---: | --- |")
    print(f"| RTF, one stream, {args.threads} thread(s) ({split}) | {rtf:.3f} | <= 0.1 on one core |")
    print(f"| concurrent real-time streams, {args.stream_threads} thread(s) | {n} (slowest tick "
          f"{1000 * slow:.0f} ms of {chunk}) | >= 32 on 2 cores |")
    print(f"| partial latency p50 / p95 / max (ms) | {ms(partial, 50)} / {ms(partial, 95)} / "
          f"{1000 * max(partial, default=0):.0f} | <= 50 |")
    print(f"| final latency p50 / max (ms; {len(final)} endpoints) | {ms(final, 50)} / "
          f"{1000 * max(final, default=0):.0f} | <= 300 |")
    for minute, rss in memory:
        print(f"| RSS after {minute:g} min of one stream (MB) | {rss:.0f} | flat |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
