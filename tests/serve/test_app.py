"""asrkit serve's app (issue 32) through starlette's TestClient: a WebSocket stream gives what the stream API gives
on the same audio (partials after each chunk, a final per endpoint, the whole result at the end), uploads give
what transcribe gives, and the info, health and metrics endpoints tell what happened."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from asrkit.config import ServeConfig
from asrkit.pipeline.formats import result_to_dict
from asrkit.serve import build_app
from tests.serve.serve_audio import CHUNK_MS, SR, from_s16le, s16le, same_json, tones


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


def test_streams_advance_as_one_batch_and_each_gives_what_it_gives_alone(app, tone_model):
    datas = [s16le(tones(1 + k % 2)[k * 800:]) for k in range(4)]
    with TestClient(app) as client:
        before = {k: metric(client, f"asrkit_{k}_total") for k in ("ticks", "chunks", "streams")}
        sockets = [client.websocket_connect("/v1/stream").__enter__() for _ in datas]
        try:
            for k, ws in enumerate(sockets):
                ws.send_json({"type": "start", "sample_rate": SR, "format": "s16le", "name": f"s{k}"})
                assert ws.receive_json()["type"] == "ready"
            for i in range(0, max(map(len, datas)), 12800):  # 0.4 s to every stream in turn
                for ws, data in zip(sockets, datas):
                    if i < len(data):
                        ws.send_bytes(data[i: i + 12800])
            results = []
            for ws in sockets:
                ws.send_json({"type": "end"})
                messages = [ws.receive_json()]
                while messages[-1]["type"] != "done":
                    messages.append(ws.receive_json())
                results.append(messages[-1]["result"])
        finally:
            for ws in sockets:
                ws.__exit__(None, None, None)
        ticks, chunks, streams = (metric(client, f"asrkit_{k}_total") - before[k]
                                  for k in ("ticks", "chunks", "streams"))
    for k, (data, result) in enumerate(zip(datas, results)):  # scores to rounding: a batch pads its rows
        assert same_json(result, result_to_dict(reference(tone_model, from_s16le(data), f"s{k}")))
    assert streams == 4 and chunks >= sum(len(d) / 2 / SR / (CHUNK_MS / 1000) for d in datas) - 4
    assert ticks < chunks  # streams shared ticks


def test_f32le_frames_of_odd_sizes_give_what_the_stream_api_gives(app, tone_model):
    audio = tones(1)
    data = audio.astype("<f4").tobytes()
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "start", "sample_rate": SR, "format": "f32le", "name": "f"})
        ws.receive_json()
        for i in range(0, len(data), 4097):  # every frame ends inside a sample
            ws.send_bytes(data[i: i + 4097])
        ws.send_json({"type": "end"})
        messages = [ws.receive_json()]
        while messages[-1]["type"] != "done":
            messages.append(ws.receive_json())
    assert messages[-1]["result"] == result_to_dict(reference(tone_model, audio, "f"))


def metric(client, name: str) -> float:
    """A sample of GET /metrics, each line checked against the exposition format."""
    text = client.get("/metrics").text
    found = None
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# (HELP \w+ .+|TYPE \w+ (counter|gauge|summary))", line), line
            continue
        key, value = line.rsplit(" ", 1)
        assert re.fullmatch(r'\w+(\{quantile="0\.\d+"\})?', key) and (value == "NaN" or float(value) >= 0), line
        if key == name:
            found = float(value)
    assert found is not None, name
    return found


def test_health_info_and_metrics_say_what_happened(app, tone_model):
    data = s16le(tones(1))
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        info = client.get("/v1/info").json()
        assert {k: info[k] for k in ("model", "sample_rate", "chunk_ms", "streaming", "formats")} == {
            "model": "tones", "sample_rate": SR, "chunk_ms": CHUNK_MS, "streaming": True,
            "formats": ["json", "srt", "vtt"]}
        before = {k: metric(client, k) for k in ("asrkit_audio_seconds_total", "asrkit_streams_total",
                                                 "asrkit_partial_latency_seconds_count")}
        with client.websocket_connect("/v1/stream") as ws:
            ws.send_json({"type": "start", "sample_rate": SR})
            ws.receive_json()
            for i in range(0, len(data), 6400):  # 0.2 s at a time, each answered before the next
                ws.send_bytes(data[i: i + 6400])
                while True:  # the partials this piece completed (at most one: a chunk is 0.32 s)
                    time.sleep(0.05)
                    if client.app.state.engine._sessions and not any(
                            s.inbox or s.backlog for s in client.app.state.engine._sessions.values()):
                        break
            ws.send_json({"type": "end"})
            messages = [ws.receive_json()]
            while messages[-1]["type"] != "done":
                messages.append(ws.receive_json())
            partials = sum(m["type"] == "partial" for m in messages)
        after = {k: metric(client, k) for k in before}
        assert after["asrkit_audio_seconds_total"] - before["asrkit_audio_seconds_total"] == pytest.approx(
            len(data) / 2 / SR)
        assert after["asrkit_streams_total"] - before["asrkit_streams_total"] == 1
        # every partial but the last (the end's flush) timed from the audio it heard
        assert after["asrkit_partial_latency_seconds_count"] - before["asrkit_partial_latency_seconds_count"] == \
            partials - 1
        assert 0 < metric(client, 'asrkit_partial_latency_seconds{quantile="0.5"}') < 1.0
        assert 0 < metric(client, "asrkit_rtf") == pytest.approx(client.get("/v1/info").json()["rtf"], rel=0.5)
        assert metric(client, "asrkit_streams_live") == 0


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("upload") / "tones.wav"
    sf.write(path, tones(2), SR, subtype="PCM_16")
    return path


def test_an_upload_gives_what_transcribe_gives(app, tone_model, wav):
    offline = result_to_dict(tone_model.transcribe(str(wav)))
    with TestClient(app) as client:
        got = client.post("/v1/transcribe", content=wav.read_bytes())
        srt_text = client.post("/v1/transcribe?format=srt", content=wav.read_bytes())
        vtt_text = client.post("/v1/transcribe?format=vtt", content=wav.read_bytes())
        assert metric(client, "asrkit_uploads_total") == 3
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    assert got.json() == {**offline, "name": "upload"} and offline["text"] == "C C"
    cues = list(srt.parse(srt_text.text))
    assert srt_text.headers["content-type"].startswith("application/x-subrip")
    assert [(c.content, c.start.total_seconds(), c.end.total_seconds()) for c in cues] == [
        (w["word"], w["start"], w["end"]) for w in offline["words"]]
    vtt = webvtt.from_string(vtt_text.text)
    assert vtt_text.headers["content-type"].startswith("text/vtt") and [c.text for c in vtt] == ["C", "C"]


@pytest.mark.parametrize("body, query, status, error", [
    (b"RIFF\x00\x00\x00\x00WAVEjunk", "", 400, "upload: "),
    (b"", "", 400, "the body is empty"),
    (b"x" * 5000, "", 413, "the body is over the upload limit of 4096 bytes"),
    (b"RIFF", "?format=ctm", 400, "format 'ctm' is unknown (choose from json, srt, vtt)"),
])
def test_a_bad_upload_gets_a_clear_error(tone_model, body, query, status, error):
    app = build_app(tone_model, ServeConfig(max_upload_bytes=4096))
    with TestClient(app) as client:
        got = client.post("/v1/transcribe" + query, content=body)
        assert got.status_code == status and got.json()["type"] == "error" and error in got.json()["message"]
        assert client.get("/healthz").status_code == 200


def test_a_chunked_upload_past_the_limit_is_cut_off(tone_model):
    app = build_app(tone_model, ServeConfig(max_upload_bytes=4096))

    def body():  # no content-length: the server counts as it reads
        for _ in range(10):
            yield b"x" * 1000

    with TestClient(app) as client:
        got = client.post("/v1/transcribe", content=body())
    assert got.status_code == 413


def test_with_a_token_every_endpoint_needs_it(tone_model):
    app = build_app(tone_model, ServeConfig(token="s3cret"))
    with TestClient(app) as client:
        for path in ("/healthz", "/v1/info", "/metrics", "/"):
            missing = client.get(path)
            assert missing.status_code == 401 and "a token is required" in missing.json()["message"]
            assert client.get(path, headers={"Authorization": "Bearer nope"}).json()["message"] == "the token is wrong"
        assert client.post("/v1/transcribe", content=b"RIFF").status_code == 401
        assert client.get("/healthz", headers={"Authorization": "Bearer s3cret"}).json() == {"status": "ok"}
        assert client.get("/healthz?token=s3cret").status_code == 200
        for url in ("/v1/stream", "/v1/stream?token=nope"):
            with client.websocket_connect(url) as ws:
                assert ws.receive_json()["type"] == "error"
                with pytest.raises(WebSocketDisconnect) as closed:
                    ws.receive_json()
                assert closed.value.code == 1008
        with client.websocket_connect("/v1/stream?token=s3cret") as ws:
            ws.send_json({"type": "start", "sample_rate": SR})
            assert ws.receive_json()["type"] == "ready"
        assert client.get("/static/app.js").status_code == 401
        page = client.get("/?token=s3cret")  # the page's own requests then carry the token in a cookie
        assert page.status_code == 200 and "httponly" in page.headers["set-cookie"].lower()
        assert client.get("/static/app.js").status_code == 200 and client.get("/healthz").status_code == 200
        with client.websocket_connect("/v1/stream") as ws:
            ws.send_json({"type": "start", "sample_rate": SR})
            assert ws.receive_json()["type"] == "ready"
        client.cookies.set("asrkit_token", "nope")
        assert client.get("/metrics").status_code == 401
