#!/usr/bin/env python3
"""Load test of ``asrkit serve`` (issue 32's targets): concurrent real-time streams, and connect/disconnect churn.

    python tools/bench/bench_serve.py --model recipes/mini/exp/small_streaming --data recipes/mini/data/test \
        [--decode-config recipes/mini/exp/small_streaming/tune_dev/decode.yaml] [--clients 32] [--seconds 180]
    python tools/bench/bench_serve.py --model ... --data ... --churn 1000

The server is started as its own process (``asrkit serve`` on a free loopback port; ``--serve-arg`` passes more
options), or ``--url http://HOST:PORT`` names a running one (``--server-pid`` for its CPU and memory).

**Load** (the default): ``--clients`` clients over loopback, started over ``--ramp`` seconds; each sends the data
dir's recordings in turn (client k from the k-th on), one stream per recording, at real time (``--rate``) in
``--frame-ms`` frames, and starts no new one after ``--seconds``. The next recording's stream starts as soon as
the last one's audio and end message are sent, so each client always has one stream sending; at most two are
open (the next waits for the one before the last), and the server is started with ``--max-streams`` twice the
clients (at least 64). Reported: partial latency (from sending the frame that held the last sample a partial's
chunks needed to receiving it: asrkit.serve.client) p50/p95/p99 over all partials and the worst client's p95;
final latency (from the frame holding an utterance's last sample, or the end message, to its final); streams
with an error; the server's CPU (cores busy, from /proc) and resident memory; its mean batch (chunks per tick)
and its own partial latency and RTF (from /metrics); and the WER of the streams' results against the references
beside the WER of ``asrkit decode --streaming`` of the same recordings (same model, decode config and chunk),
with the number of streams whose text differs from it (0: the server adds no errors).

**Churn** (``--churn N``): after ``--churn-concurrency`` warm-up streams that end normally, N clients (that many at
a time) connect, send ``--churn-seconds`` of audio and leave mid-utterance (every other one closing the socket,
the rest dropping it unclosed); then the server's open streams (``asrkit_streams_live``) and its resident memory
before and after. Prints markdown; ``--json FILE`` writes the figures. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from asrkit.audio.io import load_audio  # noqa: E402
from asrkit.data.datadir import read_data_dir, write_data_dir  # noqa: E402
from asrkit.score.wer import score_texts  # noqa: E402
from asrkit.serve.client import StreamOutcome, stream_audio  # noqa: E402

P95_TARGET = 0.300  # seconds (issue 32)
RSS_TARGET = 0.10  # churn: resident memory within 10% of the start


@dataclass
class Recording:
    utt: str
    audio: np.ndarray  # float32 at the server's rate
    text: str


# ---- the server ----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "asrkit", "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--max-streams", str(max(64, 2 * args.clients))]  # a client holds up to two streams
    if args.decode_config:
        cmd += ["--decode-config", args.decode_config]
    if args.chunk_ms:
        cmd += ["--chunk-ms", str(args.chunk_ms)]
    for extra in args.serve_arg:
        cmd += extra.split()
    print(f"server: {' '.join(cmd)}", flush=True)
    return subprocess.Popen(cmd)


def http_get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return r.read().decode("utf-8")


def wait_healthy(base: str, server: Optional[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server is not None and server.poll() is not None:
            raise SystemExit(f"bench_serve: the server exited with status {server.returncode}")
        try:
            if json.loads(http_get(f"{base}/healthz", 2.0)).get("status") == "ok":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_serve: {base}/healthz did not answer in {timeout:g} s")
        time.sleep(0.2)


def read_metrics(base: str) -> Dict[str, float]:
    """The plain samples of GET /metrics (``name value`` lines; labelled ones keep their labels in the name)."""
    out: Dict[str, float] = {}
    for line in http_get(f"{base}/metrics").splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def load_average() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


# ---- the clients ---------------------------------------------------------------------------------------------

async def _client(k: int, url: str, recordings: Sequence[Recording], deadline: float, start_delay: float,
                  args: argparse.Namespace, sample_rate: int) -> List[Tuple[Recording, StreamOutcome]]:
    """Client ``k`` until ``deadline``: one stream sending at all times (the next recording starts once the last
    one's audio and end message are sent, while its last results are still coming), and at most two open (the
    next waits for the one before the last to finish); after a failed stream it waits ``--retry-delay``."""
    await asyncio.sleep(start_delay)
    streams: List[Tuple[Recording, "asyncio.Task[StreamOutcome]"]] = []
    i = k
    while time.monotonic() < deadline:
        if len(streams) >= 2:
            await streams[-2][1]
        rec, sent = recordings[i % len(recordings)], asyncio.Event()
        task = asyncio.create_task(stream_audio(
            url, rec.audio, sample_rate=sample_rate, rate=args.rate, frame_ms=args.frame_ms, fmt=args.format,
            token=args.token, name=f"c{k}-{rec.utt}", sent=sent, timeout=args.timeout))
        streams.append((rec, task))
        await sent.wait()
        if task.done() and task.result().result is None:  # refused or broken: no storm of retries
            await asyncio.sleep(args.retry_delay)
        i += 1
    return [(rec, await task) for rec, task in streams]


async def _sample_rss(pid: Optional[int], peak: List[float], stop: asyncio.Event) -> None:
    while pid is not None and not stop.is_set():
        peak[0] = max(peak[0], rss_mb(pid))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def run_load(url: str, recordings: Sequence[Recording], args: argparse.Namespace, sample_rate: int,
                   pid: Optional[int]) -> Tuple[List[List[Tuple[Recording, StreamOutcome]]], float]:
    """Every client's (recording, outcome) list, and the peak RSS (MB) of ``pid`` while they ran."""
    deadline = time.monotonic() + args.seconds
    peak, stop = [0.0], asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(pid, peak, stop))
    clients = [_client(k, url, recordings, deadline, args.ramp * k / max(1, args.clients), args, sample_rate)
               for k in range(args.clients)]
    results = await asyncio.gather(*clients)
    stop.set()
    await sampler
    return list(results), peak[0]


async def run_churn(url: str, recordings: Sequence[Recording], args: argparse.Namespace, sample_rate: int,
                    n: int, leave: bool) -> List[StreamOutcome]:
    """``n`` streams, ``--churn-concurrency`` at a time; ``leave``: each leaves after a random part of
    ``--churn-seconds`` (alternately closing and dropping the connection), else each sends a recording whole."""
    rng = random.Random(0)
    lo, hi = args.churn_seconds
    plan = [(recordings[i % len(recordings)], rng.uniform(lo, hi), i % 2 == 1) for i in range(n)]
    sem = asyncio.Semaphore(args.churn_concurrency)

    async def one(k: int, rec: Recording, seconds: float, abort: bool) -> StreamOutcome:
        async with sem:
            return await stream_audio(url, rec.audio, sample_rate=sample_rate, rate=args.rate,
                                      frame_ms=args.frame_ms, fmt=args.format, token=args.token, name=f"churn{k}",
                                      stop_after=seconds if leave else None, abort=abort, timeout=args.timeout)

    return list(await asyncio.gather(*(one(k, *p) for k, p in enumerate(plan))))


# ---- figures -------------------------------------------------------------------------------------------------

def quantiles(xs: Sequence[float]) -> Dict[str, Optional[float]]:
    if not xs:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    a = np.asarray(xs, dtype=np.float64)
    return {"p50": float(np.quantile(a, 0.5)), "p95": float(np.quantile(a, 0.95)), "p99": float(np.quantile(a, 0.99)),
            "n": len(xs)}


def streaming_decode_texts(args: argparse.Namespace, utts: Sequence[str], out_dir: str) -> Dict[str, str]:
    """``asrkit decode --streaming`` of the data dir's ``utts`` with the server's model, decode config and chunk:
    utt -> text."""
    if args.reference_text:
        path = args.reference_text
    else:
        from asrkit.cli import main as asrkit_main

        data = args.data
        if args.limit:  # only the recordings sent
            data = os.path.join(out_dir, "data")
            write_data_dir(read_data_dir(args.data).subset(utts), data)
        cmd = ["decode", "--model", args.model, "--data", data, "--out", out_dir, "--streaming"]
        if args.decode_config:
            cmd += ["--decode-config", args.decode_config]
        if args.chunk_ms:
            cmd += ["--chunk-ms", str(args.chunk_ms)]
        print(f"reference: asrkit {' '.join(cmd)}", flush=True)
        if asrkit_main(cmd) != 0:
            raise SystemExit("bench_serve: asrkit decode --streaming failed")
        path = os.path.join(out_dir, "text")
    texts: Dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            utt, _, text = line.rstrip("\n").partition(" ")
            texts[utt] = text.strip()
    return texts


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def load_report(per_client: List[List[Tuple[Recording, StreamOutcome]]], reference: Dict[str, str],
                wall: float, cpu: Optional[float], rss: Dict[str, Optional[float]], metrics: Tuple[Dict, Dict],
                load: Tuple[str, str]) -> Dict[str, Any]:
    streams = [pair for client in per_client for pair in client]
    partial = [x for _, o in streams for x in o.partial_latency]
    final = [x for _, o in streams for x in o.final_latency]
    client_p95 = [quantiles([x for _, o in c for x in o.partial_latency])["p95"] for c in per_client]
    errors = [(r.utt, o.error or "no result") for r, o in streams if o.result is None or o.error]
    ok = [(r, o) for r, o in streams if o.result is not None and not o.error]
    refs = {f"{r.utt}#{k}": r.text for k, (r, _) in enumerate(ok)}
    served = {f"{r.utt}#{k}": o.text for k, (r, o) in enumerate(ok)}
    decoded = {f"{r.utt}#{k}": reference.get(r.utt, "") for k, (r, _) in enumerate(ok)}
    before, after = metrics
    ticks = after.get("asrkit_ticks_total", 0) - before.get("asrkit_ticks_total", 0)
    chunks = after.get("asrkit_chunks_total", 0) - before.get("asrkit_chunks_total", 0)
    return {
        "clients": len(per_client), "streams": len(streams), "audio_seconds": sum(o.audio_seconds for _, o in streams),
        "wall_seconds": wall, "streams_sending": sum(o.audio_seconds for _, o in streams) / wall,  # on average
        "errors": len(errors), "error_examples": errors[:5],
        "partial_latency": quantiles(partial), "worst_client_p95": max((x for x in client_p95 if x is not None),
                                                                       default=None),
        "final_latency": quantiles(final),
        "server_cpu_cores": None if cpu is None else cpu / wall, "server_rss_mb": rss,
        "mean_batch": chunks / ticks if ticks else None,
        "server_errors": after.get("asrkit_errors_total", 0) - before.get("asrkit_errors_total", 0),
        "streams_live_after": after.get("asrkit_streams_live"),
        # the server's own view (its last partials): from a piece's arrival to the partial queued for sending
        "server_partial_p95": after.get('asrkit_partial_latency_seconds{quantile="0.95"}'),
        "server_rtf": after.get("asrkit_rtf"),
        "wer_served": 100 * score_texts(refs, served).wer if refs else None,
        "wer_decode_streaming": 100 * score_texts(refs, decoded).wer if refs else None,
        "texts_differing": sum(served[k] != decoded[k] for k in refs),
        "load_before": load[0], "load_after": load[1],
    }


def print_load(r: Dict[str, Any]) -> None:
    p, f = r["partial_latency"], r["final_latency"]
    rss = r["server_rss_mb"]
    met = p["p95"] is not None and p["p95"] <= P95_TARGET and r["errors"] == 0 and r["texts_differing"] == 0
    print(f"\n| clients | streams (sending at once) | audio (s) | wall (s) | partial ms p50 / p95 / p99 (n) | "
          f"worst client p95 | final ms p50 / p95 / p99 | errors | server CPU (cores) | "
          f"server RSS MB start / peak / end | mean batch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cpu = "-" if r["server_cpu_cores"] is None else f"{r['server_cpu_cores']:.2f}"
    rss_text = " / ".join("-" if rss[k] is None else f"{rss[k]:.0f}" for k in ("start", "peak", "end"))
    batch = "-" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}"
    print(f"| {r['clients']} | {r['streams']} ({r['streams_sending']:.1f}) | {r['audio_seconds']:.0f} | "
          f"{r['wall_seconds']:.0f} | {_ms(p['p50'])} / {_ms(p['p95'])} / {_ms(p['p99'])} ({p['n']}) | "
          f"{_ms(r['worst_client_p95'])} | "
          f"{_ms(f['p50'])} / {_ms(f['p95'])} / {_ms(f['p99'])} | {r['errors']} | {cpu} | {rss_text} | {batch} |")
    wer = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print(f"\nWER of the streams' results {wer(r['wer_served'])}%, of asrkit decode --streaming on the same "
          f"recordings {wer(r['wer_decode_streaming'])}%; streams whose text differs: {r['texts_differing']}")
    print(f"load average before {r['load_before']}, after {r['load_after']}; server errors "
          f"{r['server_errors']:.0f}, streams open after {r['streams_live_after']}; the server's own p95 partial "
          f"latency (its last partials) {_ms(r['server_partial_p95'])} ms, its RTF {r['server_rtf']}")
    for utt, err in r["error_examples"]:
        print(f"error: {utt}: {err}")
    print(f"target (p95 <= {1000 * P95_TARGET:.0f} ms, no errors, the same texts): {'met' if met else 'NOT met'}")


def print_churn(r: Dict[str, Any]) -> None:
    ratio = r["rss_after_mb"] / r["rss_before_mb"] if r["rss_before_mb"] else None
    met = r["streams_live_after"] == 0 and ratio is not None and abs(ratio - 1) <= RSS_TARGET
    print("\n| clients | left mid-utterance | streams open after | streams started | refused | server errors | "
          "RSS MB before / after (ratio) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {r['clients']} | {r['left']} | {r['streams_live_after']:.0f} | {r['streams_started']:.0f} | "
          f"{r['refused']:.0f} | {r['server_errors']:.0f} | {r['rss_before_mb']:.0f} / {r['rss_after_mb']:.0f} "
          f"({'-' if ratio is None else f'{ratio:.3f}'}) | {r['wall_seconds']:.0f} |")
    print(f"load average before {r['load_before']}, after {r['load_after']}")
    print(f"target (no stream open, RSS within {100 * RSS_TARGET:.0f}%): {'met' if met else 'NOT met'}")


# ---- main ----------------------------------------------------------------------------------------------------

def read_recordings(data_dir: str, sample_rate: int, limit: int) -> List[Recording]:
    data = read_data_dir(data_dir)
    if data.text is None:
        raise SystemExit(f"bench_serve: {data_dir}/text is missing (the references)")
    utts = sorted(data.utterances(), key=lambda u: u.utt)[: limit or None]
    return [Recording(u.utt, load_audio(u.source, sample_rate, start=u.start, end=u.end, name=u.utt).numpy(),
                      data.text[u.utt]) for u in utts]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="experiment dir (the server's model and the reference decode's)")
    p.add_argument("--data", required=True, help="Kaldi data dir: the recordings sent and their references")
    p.add_argument("--decode-config", help="decode config of the server and the reference decode")
    p.add_argument("--chunk-ms", type=int, help="the server's chunk (default: the model's)")
    p.add_argument("--serve-arg", action="append", default=[], help="more options for asrkit serve (repeatable)")
    p.add_argument("--url", help="a running server (http://HOST:PORT) instead of starting one")
    p.add_argument("--server-pid", type=int, help="with --url: the server's process, for its CPU and memory")
    p.add_argument("--token", help="the server's bearer token")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=180.0, help="no client starts a new stream after this")
    p.add_argument("--ramp", type=float, default=1.0, help="clients start evenly over this many seconds")
    p.add_argument("--rate", type=float, default=1.0, help="1: real time; 0: as fast as possible")
    p.add_argument("--frame-ms", type=int, default=100, help="audio per WebSocket frame")
    p.add_argument("--format", choices=("s16le", "f32le"), default="s16le")
    p.add_argument("--limit", type=int, default=0, help="use the first N recordings (0: all)")
    p.add_argument("--reference-text", help="a text file of asrkit decode --streaming (default: run it)")
    p.add_argument("--no-reference", action="store_true", help="leave out the reference decode (no WER equality)")
    p.add_argument("--churn", type=int, default=0, help="run the churn test with this many clients instead")
    p.add_argument("--churn-concurrency", type=int, default=32)
    p.add_argument("--churn-seconds", type=float, nargs=2, default=(0.1, 1.5), metavar=("MIN", "MAX"),
                   help="each churn client leaves after a random time in this range of audio")
    p.add_argument("--settle", type=float, default=10.0, help="churn: seconds to wait for the streams to close")
    p.add_argument("--timeout", type=float, default=60.0, help="a stream's connect, ready and result timeout")
    p.add_argument("--retry-delay", type=float, default=1.0, help="seconds a client waits after a failed stream")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--json", help="write the figures to this JSON file")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.rate < 0 or args.churn < 0 or args.churn_concurrency < 1:
        raise SystemExit("bench_serve: --clients and --churn-concurrency >= 1, --seconds > 0, --rate and --churn >= 0")
    server = None
    if args.url:
        base, pid = args.url.rstrip("/"), args.server_pid
    else:
        port = free_port()
        server = start_server(args, port)
        base, pid = f"http://127.0.0.1:{port}", server.pid
    tmp = tempfile.mkdtemp(prefix="bench_serve_")
    try:
        wait_healthy(base, server, args.startup_timeout)
        info = json.loads(http_get(f"{base}/v1/info"))
        rate = int(info["sample_rate"])
        ws_url = "ws" + base[len("http"):] + "/v1/stream"
        recordings = read_recordings(args.data, rate, args.limit)
        print(f"model {info.get('model')} ({args.model}), chunk {info.get('chunk_ms')} ms; data {args.data}: "
              f"{len(recordings)} recordings, {sum(len(r.audio) for r in recordings) / rate:.0f} s", flush=True)
        if args.churn:
            report = churn(args, base, ws_url, recordings, rate, pid)
            print_churn(report)
        else:
            report = load(args, base, ws_url, recordings, rate, pid, tmp)
            print_load(report)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(report, fh, indent=1)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def load(args: argparse.Namespace, base: str, ws_url: str, recordings: List[Recording], rate: int,
         pid: Optional[int], tmp: str) -> Dict[str, Any]:
    load_before = load_average()
    metrics_before = read_metrics(base)
    rss_start = rss_mb(pid) if pid else None
    cpu0, t0 = (cpu_seconds(pid) if pid else None), time.perf_counter()
    print(f"load: {args.clients} clients for {args.seconds:g} s at rate {args.rate:g} "
          f"(load average {load_before})", flush=True)
    per_client, peak = asyncio.run(run_load(ws_url, recordings, args, rate, pid))
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0 if pid and cpu0 is not None else None
    rss = {"start": rss_start, "peak": peak or None, "end": rss_mb(pid) if pid else None}
    metrics_after, load_after = read_metrics(base), load_average()
    reference = {} if args.no_reference else streaming_decode_texts(args, [r.utt for r in recordings],
                                                                    os.path.join(tmp, "decode"))
    report = load_report(per_client, reference, wall, cpu, rss, (metrics_before, metrics_after),
                         (load_before, load_after))
    if args.no_reference:
        report["wer_decode_streaming"], report["texts_differing"] = None, None
    return report


def churn(args: argparse.Namespace, base: str, ws_url: str, recordings: List[Recording], rate: int,
          pid: Optional[int]) -> Dict[str, Any]:
    load_before = load_average()
    warm = asyncio.run(run_churn(ws_url, recordings, args, rate, args.churn_concurrency, leave=False))
    failed = [o.error for o in warm if o.result is None]
    if failed:
        raise SystemExit(f"bench_serve: a warm-up stream failed: {failed[0]}")
    before = read_metrics(base)
    rss_before = rss_mb(pid) if pid else 0.0
    t0 = time.perf_counter()
    print(f"churn: {args.churn} clients, {args.churn_concurrency} at a time (load average {load_before})", flush=True)
    outs = asyncio.run(run_churn(ws_url, recordings, args, rate, args.churn, leave=True))
    deadline = time.monotonic() + args.settle
    after = read_metrics(base)
    while after.get("asrkit_streams_live", 0) and time.monotonic() < deadline:
        time.sleep(0.2)
        after = read_metrics(base)
    return {
        "clients": args.churn, "left": sum(o.result is None for o in outs), "wall_seconds": time.perf_counter() - t0,
        "streams_live_after": after.get("asrkit_streams_live"),
        "streams_started": after.get("asrkit_streams_total", 0) - before.get("asrkit_streams_total", 0),
        "refused": after.get("asrkit_streams_refused_total", 0) - before.get("asrkit_streams_refused_total", 0),
        "server_errors": after.get("asrkit_errors_total", 0) - before.get("asrkit_errors_total", 0),
        "client_errors": [o.error for o in outs if o.error][:5],
        "rss_before_mb": rss_before, "rss_after_mb": rss_mb(pid) if pid else 0.0,
        "load_before": load_before, "load_after": load_average(),
    }


if __name__ == "__main__":
    sys.exit(main())
