"""asrkit serve's app (issue 32) through starlette's TestClient: a WebSocket stream gives what the stream API gives
on the same audio (partials after each chunk, a final per endpoint, the whole result at the end), uploads give
what transcribe gives, and the info, health and metrics endpoints tell what happened."""
from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from asrkit.config import ServeConfig
from asrkit.pipeline.formats import result_to_dict
from asrkit.serve import build_app
from tests.serve.serve_audio import CHUNK_MS, SR, from_s16le, s16le, tones


@pytest.fixture(scope="module")
def app(tone_model):
    return build_app(tone_model, ServeConfig(), name="tones")


def reference(model, audio: np.ndarray, name: str):
    s = model.stream(name)
    s.accept_waveform(audio)
    return s.finish()


def test_a_websocket_stream_gives_what_the_stream_api_gives(app, tone_model):
    data = s16le(tones(2))
    ref = reference(tone_model, from_s16le(data), "mic")
    assert ref.text == "C C"  # two endpoints: the exchange below has two finals to show
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "start", "sample_rate": SR, "format": "s16le", "name": "mic"})
        assert ws.receive_json() == {"type": "ready", "model": "tones", "sample_rate": SR, "chunk_ms": CHUNK_MS}
        for i in range(0, len(data), 3333):  # odd sizes: samples split between frames
            ws.send_bytes(data[i: i + 3333])
        ws.send_json({"type": "end"})
        messages = []
        while not messages or messages[-1]["type"] != "done":
            messages.append(ws.receive_json())
    partials = [m for m in messages if m["type"] == "partial"]
    finals = [m for m in messages if m["type"] == "final"]
    done = messages[-1]["result"]
    assert done == result_to_dict(ref)
    assert [f["text"] for f in finals] == ["C", "C"]
    assert [(f["start"], f["end"], f["words"], f["nbest"]) for f in finals] == [
        (s["start"], s["end"], [w for w in done["words"] if s["start"] <= w["start"] < s["end"]], [
            {"text": a.text, "score": a.score, "ctc_score": a.ctc_score} for a in seg.nbest])
        for s, seg in zip(done["segments"], ref.segments)]
    chunks = int(np.ceil(len(data) / 2 / SR / (CHUNK_MS / 1000)))
    assert chunks - 1 <= len(partials) <= chunks + 1  # one per decoded chunk
    assert any(p["text"] == "C" for p in partials)
    ends = [p["end"] for p in partials]
    assert ends == sorted(ends) and ends[-1] == pytest.approx(len(data) / 2 / SR, abs=0.05)
