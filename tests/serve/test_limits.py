"""asrkit serve under bad clients (issue 32): each limit and each bad input gets its error message and close code,
and the other streams go on as if nothing happened; a client that leaves mid-utterance leaves no stream behind."""
from __future__ import annotations

import gc
import time
import weakref
from contextlib import ExitStack

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from asrkit.config import ServeConfig
from asrkit.pipeline.formats import result_to_dict
from asrkit.serve import build_app
from tests.serve.serve_audio import SR, from_s16le, s16le, same_json, tones

START = {"type": "start", "sample_rate": SR, "format": "s16le"}


def closing(ws) -> tuple:
    """The messages until the server closes ``ws``, and the close (code, reason)."""
    messages = []
    with pytest.raises(WebSocketDisconnect) as closed:
        while True:
            messages.append(ws.receive_json())
    return messages, (closed.value.code, closed.value.reason)


def stream_to_done(ws, data: bytes, name: str) -> dict:
    """Start, send ``data``, end: the done message's result (the stream closes with 1000)."""
    ws.send_json({**START, "name": name})
    assert ws.receive_json()["type"] == "ready"
    ws.send_bytes(data)
    ws.send_json({"type": "end"})
    messages, close = closing(ws)
    assert messages[-1]["type"] == "done" and close[0] == 1000
    return messages[-1]["result"]


def reference(model, data: bytes, name: str) -> dict:
    s = model.stream(name)
    s.accept_waveform(from_s16le(data))
    return result_to_dict(s.finish())


def metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split(" ")[1])
    raise KeyError(name)


def test_the_stream_past_the_most_is_refused_and_the_others_go_on(tone_model):
    app = build_app(tone_model, ServeConfig(max_streams=2))
    data = s16le(tones(1))
    with TestClient(app) as client, ExitStack() as stack:
        first, second = [stack.enter_context(client.websocket_connect("/v1/stream")) for _ in range(2)]
        for ws in (first, second):
            ws.send_json(START)
            assert ws.receive_json()["type"] == "ready"
        first.send_bytes(data[: len(data) // 2])
        with client.websocket_connect("/v1/stream") as third:
            third.send_json(START)
            messages, close = closing(third)
        assert close[0] == 1013
        assert messages == [{"type": "error", "message": "the server holds its most streams (2): try again later"}]
        for ws in (first, second):
            ws.send_bytes(data[len(data) // 2:] if ws is first else data)
            ws.send_json({"type": "end"})
            got, close = closing(ws)
            assert close[0] == 1000 and got[-1]["result"]["text"] == reference(tone_model, data, "x")["text"] == "C"
        assert metric(client, "asrkit_streams_refused_total") == 1
        assert metric(client, "asrkit_streams_total") == 2 and metric(client, "asrkit_streams_live") == 0
        with client.websocket_connect("/v1/stream") as again:  # a slot is free again
            assert stream_to_done(again, data, "again")["text"] == "C"


@pytest.mark.parametrize("send", ["bytes", "text"])
def test_a_message_over_the_size_limit_closes_with_1009(tone_model, send):
    app = build_app(tone_model, ServeConfig(max_message_bytes=2048))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START)
        ws.receive_json()
        ws.send_bytes(b"\0" * 2048)  # at the limit: fine
        big = '{"type": "end", "pad": "' + "\u00e9" * 1020 + '"}'  # 2066 bytes in UTF-8, 1046 characters
        if send == "bytes":
            ws.send_bytes(b"\0" * 2049)
        else:
            ws.send_text(big)
        messages, close = closing(ws)
    assert close == (1009, f"a message of {2049 if send == 'bytes' else 2066} bytes is over the limit of 2048")
    assert messages[-1] == {"type": "error", "message": close[1]}


def test_a_stream_past_its_longest_audio_closes_with_1001(tone_model):
    app = build_app(tone_model, ServeConfig(max_stream_seconds=1.0))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START)
        ws.receive_json()
        ws.send_bytes(s16le(tones(1)[: SR // 2]))
        ws.send_bytes(s16le(tones(1)[: SR // 2 + 1]))  # 1.0000625 s
        messages, close = closing(ws)
    assert close == (1001, "the stream passed its longest duration (1 s of audio)")
    assert messages[-1]["type"] == "error"


@pytest.mark.parametrize("limit", ["wall", "idle"])
def test_a_stream_that_lasts_too_long_or_sends_nothing_closes_with_1001(tone_model, limit):
    cfg = ServeConfig(max_stream_seconds=0.6, idle_timeout_s=30.0) if limit == "wall" else \
        ServeConfig(idle_timeout_s=0.3)
    app = build_app(tone_model, cfg)
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        t0 = time.perf_counter()
        ws.send_json(START)
        ws.receive_json()
        if limit == "wall":  # audio keeps coming, but slower than it plays
            for _ in range(5):
                ws.send_bytes(b"\0\0" * 160)
                time.sleep(0.15)
        messages, close = closing(ws)
        waited = time.perf_counter() - t0
    if limit == "wall":
        assert close == (1001, "the stream passed its longest duration (0.6 s)") and 0.6 <= waited < 10
    else:
        assert close == (1001, "no message for 0.3 s (the idle timeout)") and 0.3 <= waited < 10
    assert messages[-1] == {"type": "error", "message": close[1]}


@pytest.mark.parametrize("first, then, error", [
    ("{'type': 'start'}", None, "malformed JSON in a text message"),
    (b"\0\0\0\0", None, 'audio before the start message (send {"type": "start", ...} first)'),
    ({"type": "start", "format": "s16le"}, None, "start message: sample_rate is missing"),
    ({"type": "start", "sample_rate": 4000}, None, "start message: sample_rate must be an integer from 8000"),
    ({"type": "start", "sample_rate": SR, "format": "opus"}, None, "start message: format 'opus' is unknown"),
    ({"type": "start", "sample_rate": SR, "hotwords": {"C": 1}}, None, "hotwords must be a list of phrases"),
    (START, START, "unexpected message type 'start' after the start"),
    (START, "not json", "malformed JSON in a text message"),
])
def test_bad_input_closes_with_1008_and_leaves_the_other_streams_alone(tone_model, first, then, error):
    app = build_app(tone_model, ServeConfig())
    data = s16le(tones(1))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as good, \
            client.websocket_connect("/v1/stream") as bad:
        good.send_json(START)
        good.receive_json()
        good.send_bytes(data[:20000])
        for msg in (first, then):
            if isinstance(msg, bytes):
                bad.send_bytes(msg)
            elif isinstance(msg, str):
                bad.send_text(msg)
            elif msg is not None:
                bad.send_json(msg)
        messages, close = closing(bad)
        assert close[0] == 1008 and error in close[1]
        assert messages[-1]["type"] == "error" and error in messages[-1]["message"]
        good.send_bytes(data[20000:])
        good.send_json({"type": "end"})
        got, close = closing(good)
        assert close[0] == 1000 and got[-1]["result"] == reference(tone_model, data, "stream-1")
        assert metric(client, "asrkit_errors_total") == 1 and metric(client, "asrkit_streams_live") == 0


def test_another_sample_rate_is_resampled(tone_model):
    audio = tones(2)[::2]  # 8 kHz: the same tones (440 Hz) at half the samples
    app = build_app(tone_model, ServeConfig())
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json({**START, "sample_rate": 8000, "format": "f32le"})
        ws.receive_json()
        for i in range(0, audio.size, 1234):
            ws.send_bytes(audio[i: i + 1234].astype("<f4").tobytes())
        ws.send_json({"type": "end"})
        messages, _ = closing(ws)
    result = messages[-1]["result"]
    assert result["text"] == "C C" and result["duration"] == pytest.approx(audio.size / 8000, abs=1e-3)
    offline = tone_model.transcribe(tones(2))
    for got, want in zip(result["words"], offline.words):  # the tones where they are at 16 kHz
        assert got["start"] == pytest.approx(want.start, abs=0.1) and got["end"] == pytest.approx(want.end, abs=0.1)


def test_clients_that_leave_mid_utterance_leave_no_stream(tone_model):
    app = build_app(tone_model, ServeConfig(max_streams=4))
    data = s16le(tones(1))
    engine = app.state.engine
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as steady:
        steady.send_json(START)
        steady.receive_json()
        streams = []
        for k in range(60):  # 60 clients through 3 free slots: a slot that leaked would refuse one soon
            with client.websocket_connect("/v1/stream") as ws:
                ws.send_json(START)
                assert ws.receive_json()["type"] == "ready"
                ws.send_bytes(data[: 14000 + 1500 * (k % 20)])  # 0.44 to 1.33 s: a chunk or more, mid-utterance
                if k % 2:
                    assert ws.receive_json()["type"] == "partial"  # some wait for a partial, some leave at once
                streams.append(weakref.ref(next(s for s in engine._sessions.values() if s.name != "stream-1").stream))
            steady.send_bytes(data[k * 500: (k + 1) * 500])
        deadline = time.monotonic() + 5
        while engine.live > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.live == 1 and metric(client, "asrkit_streams_live") == 1
        assert metric(client, "asrkit_streams_refused_total") == 0 and metric(client, "asrkit_errors_total") == 0
        steady.send_bytes(data[60 * 500:])
        steady.send_json({"type": "end"})
        got, _ = closing(steady)
        assert same_json(got[-1]["result"], reference(tone_model, data, "stream-1"))  # batched with the others
    gc.collect()
    assert sum(ref() is not None for ref in streams) == 0  # every stream object was let go


def test_a_stream_the_model_fails_on_closes_with_1011_and_the_server_goes_on(tone_model, monkeypatch):
    from asrkit.pipeline.streaming import Stream

    accept = Stream.accept_waveform

    def failing(self, samples, sample_rate=None):
        if self.name == "bad":
            raise RuntimeError("features exploded")
        return accept(self, samples, sample_rate)

    monkeypatch.setattr(Stream, "accept_waveform", failing)
    app = build_app(tone_model, ServeConfig())
    data = s16le(tones(1))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as good, \
            client.websocket_connect("/v1/stream") as bad:
        good.send_json({**START, "name": "good"})
        bad.send_json({**START, "name": "bad"})
        good.receive_json(), bad.receive_json()
        bad.send_bytes(data[:20000])
        messages, close = closing(bad)
        assert close == (1011, "internal error")
        assert messages[-1] == {"type": "error", "message": "stream bad: features exploded"}
        good.send_bytes(data)
        good.send_json({"type": "end"})
        got, close = closing(good)
        assert close[0] == 1000 and got[-1]["result"] == reference(tone_model, data, "good")
        step = app.state.recognizer.step
        monkeypatch.setattr(app.state.recognizer, "step", lambda streams: 1 / 0)  # a bug in the batched step
        with client.websocket_connect("/v1/stream") as ws:
            ws.send_json(START)
            ws.receive_json()
            ws.send_bytes(data)
            messages, close = closing(ws)
        assert close[0] == 1011 and messages[-1]["message"] == "internal error: division by zero"
        monkeypatch.setattr(app.state.recognizer, "step", step)
        with client.websocket_connect("/v1/stream") as ws:  # the loop goes on
            assert stream_to_done(ws, data, "after")["text"] == "C"
        assert metric(client, "asrkit_errors_total") == 2 and metric(client, "asrkit_streams_live") == 0


def test_a_stream_that_ends_before_any_audio_is_done_and_empty(tone_model):
    app = build_app(tone_model, ServeConfig())
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json({**START, "name": "quiet"})
        ws.receive_json()
        ws.send_bytes(b"\x01")  # half a sample: no audio yet
        ws.send_json({"type": "end"})
        messages, close = closing(ws)
    assert close[0] == 1000 and messages[-1] == {"type": "done", "result": result_to_dict(
        tone_model.stream("quiet").finish())}
    assert messages[-1]["result"]["text"] == "" and messages[-1]["result"]["duration"] == 0.0
