"""tools/bench/bench_streaming.py: the search for the most concurrent streams, and a smoke run of the whole
benchmark on a tiny streaming model (the figures need the demo model: not a test)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.pipeline.streaming_exp import make_streaming_exp
from tests.pipeline.tiny_exp import tone, write_data_dir
from tests.tool_loader import load_tool

bench = load_tool("bench/bench_streaming")


@pytest.mark.parametrize("capacity, limit, expected", [(5, 64, 5), (1, 64, 1), (0, 64, 0), (64, 64, 64),
                                                       (100, 40, 40)])
def test_most_concurrent_streams_by_doubling_then_bisection(monkeypatch, capacity, limit, expected):
    tried = []

    def sustains(model, audio, decode, chunk_ms, n, seconds):
        tried.append(n)
        return n <= capacity, 0.01 * n

    monkeypatch.setattr(bench, "_sustains", sustains)
    n, slowest = bench._max_streams(None, None, None, 640, 10.0, limit)
    assert (n, slowest) == (expected, 0.01 * expected)
    assert len(tried) == len(set(tried)) and len(tried) <= 2 * limit.bit_length() + 1  # no count tried twice


def test_the_benchmark_runs_end_to_end(tmp_path, capsys):
    exp = make_streaming_exp(tmp_path / "exp")
    data = write_data_dir(tmp_path / "data", {f"u{k}": np.concatenate([tone(0.5, 300 + 100 * k, k),
                                                                      np.zeros(4000, np.float32)]) for k in range(2)})
    (data / "text").write_text("u0 AB\nu1 CD\n")
    threads = str(torch.get_num_threads())  # the benchmark sets torch's threads: the test's own
    assert bench.main(["--model", str(exp), "--data", str(data), "--chunks", "320", "--minutes", "0.02",
                       "--stream-seconds", "1.6", "--max-streams", "2", "--threads", threads,
                       "--stream-threads", threads]) == 0
    out = capsys.readouterr().out
    assert "| greedy | 100.00 | " in out  # an untrained model: every word wrong, offline and streamed
    for row in (f"| RTF, one stream, {threads} thread(s) (encoder ", "| concurrent real-time streams, ",
                "| partial latency p50 / p95 / max (ms) | ", "| RSS after 0.02 min of one stream (MB) | "):
        assert row in out, row
