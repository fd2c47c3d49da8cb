"""tools/bench/bench_serve.py end to end on a tiny model served in-process: the load test (2 real-time clients for
a few seconds: its figures, and the streams' texts equal to asrkit decode --streaming's) and a churn of 20 clients
that leave mid-utterance (no stream left open). The figures of the demo model are docs/serving.md's, not a test."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.pipeline.streaming_exp import make_streaming_exp
from tests.pipeline.tiny_exp import tone, write_data_dir
from tests.tool_loader import load_tool

pytest.importorskip("uvicorn")
bench = load_tool("bench/bench_serve")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import asrkit
    from tests.serve.live_server import serving

    root = tmp_path_factory.mktemp("bench_serve")
    exp = make_streaming_exp(root / "exp")
    data = write_data_dir(root / "data", {f"u{k}": np.concatenate([tone(0.6 + 0.2 * k, 300 + 200 * k, k),
                                                                  np.zeros(3200, np.float32)]) for k in range(3)})
    (data / "text").write_text("u0 A B\nu1 C\nu2 D E\n")
    with serving(asrkit.load_model(exp)) as host:
        yield exp, data, f"http://{host}"


def test_load_reports_latency_cpu_memory_and_the_same_texts_as_decode_streaming(served, tmp_path, capsys):
    exp, data, url = served
    out = tmp_path / "load.json"
    assert bench.main(["--model", str(exp), "--data", str(data), "--url", url, "--server-pid", str(os.getpid()),
                       "--clients", "2", "--seconds", "1.5", "--ramp", "0.2", "--format", "f32le", "--limit", "2",
                       "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["clients"] == 2 and r["streams"] >= 2 and r["errors"] == 0 and r["server_errors"] == 0
    assert r["streams_live_after"] == 0
    lat = r["partial_latency"]
    assert lat["n"] >= 2 * 2 and 0 < lat["p50"] <= lat["p95"] <= lat["p99"] < 5.0
    assert r["final_latency"]["n"] >= 0 and r["worst_client_p95"] >= lat["p50"]
    assert 0 < r["server_cpu_cores"] and r["server_rss_mb"]["peak"] >= r["server_rss_mb"]["start"] > 0
    assert r["mean_batch"] >= 1.0 and r["server_rtf"] > 0 and r["server_partial_p95"] > 0
    assert r["texts_differing"] == 0 and r["wer_served"] == pytest.approx(r["wer_decode_streaming"])
    assert r["audio_seconds"] >= 1.5 and r["wall_seconds"] >= 1.5 and 0 < r["streams_sending"] <= 2.05  # real time
    printed = capsys.readouterr().out
    assert "| clients | streams (sending at once) |" in printed and "streams whose text differs: 0" in printed


def test_churn_leaves_no_stream_open(served, tmp_path, capsys):
    exp, data, url = served
    out = tmp_path / "churn.json"
    assert bench.main(["--model", str(exp), "--data", str(data), "--url", url, "--server-pid", str(os.getpid()),
                       "--churn", "20", "--churn-concurrency", "5", "--churn-seconds", "0.05", "0.4", "--rate", "0",
                       "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["clients"] == 20 and r["left"] == 20 and r["streams_started"] == 20
    assert r["streams_live_after"] == 0 and r["refused"] == 0 and r["server_errors"] == 0
    assert r["rss_before_mb"] > 0 and r["rss_after_mb"] > 0
    assert "target (no stream open" in capsys.readouterr().out


def test_quantiles_of_known_values():
    q = bench.quantiles(list(np.arange(1, 101) / 1000))
    assert (q["p50"], q["p95"], q["p99"], q["n"]) == pytest.approx((0.0505, 0.09505, 0.09901, 100))
    assert bench.quantiles([])["p95"] is None
