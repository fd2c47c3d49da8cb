"""asrkit.serve.client: PCM encoding, pacing, latency and the protocol's paths against a scripted stub server
(websockets), and the client against the real server (asrkit serve's app on uvicorn) with a tiny model."""
from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any, Dict, List

import numpy as np
import pytest

from asrkit.serve.client import stream_audio, to_pcm

pytest.importorskip("websockets")
from websockets.asyncio.server import serve  # noqa: E402

SR = 16000


def test_pcm_encodings_match_struct():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -2.0, 1e-5], dtype=np.float32)
    want16 = struct.pack("<8h", 0, 16384, -16384, 32767, -32768, 32767, -32768, 0)
    assert to_pcm(x, "s16le") == want16
    assert to_pcm(x, "f32le") == struct.pack("<8f", *x.tolist())
    with pytest.raises(ValueError, match="s16le, f32le"):
        to_pcm(x, "u8")


class Stub:
    """A scripted server: ready, then after each ``every`` samples received a partial whose ``end`` is that many
    samples, sent ``delay`` seconds later; on end a final covering all and done. Records what it got."""

    def __init__(self, every: int = 3200, delay: float = 0.05, refuse: str = ""):
        self.every, self.delay, self.refuse = every, delay, refuse
        self.start: Dict[str, Any] = {}
        self.audio = b""
        self.frame_times: List[float] = []
        self.ended = False
        self.closed_code = None

    async def handler(self, ws) -> None:
        self.start = json.loads(await ws.recv())
        if self.refuse:
            await ws.send(json.dumps({"type": "error", "message": self.refuse}))
            await ws.close(1008, self.refuse[:100])
            return
        width = 2 if self.start["format"] == "s16le" else 4
        await ws.send(json.dumps({"type": "ready", "model": "stub", "sample_rate": SR, "chunk_ms": 200}))
        sent_for = 0
        pending: List[asyncio.Task] = []
        try:
            async for msg in ws:
                if isinstance(msg, bytes):
                    self.audio += msg
                    self.frame_times.append(time.perf_counter())
                    samples = len(self.audio) // width
                    while samples - sent_for >= self.every:
                        sent_for += self.every
                        pending.append(asyncio.create_task(self._later(ws, {"type": "partial", "text": "x",
                                                                            "start": 0.0, "end": sent_for / SR})))
                elif json.loads(msg)["type"] == "end":
                    self.ended = True
                    await asyncio.gather(*pending)
                    total = len(self.audio) // width / SR
                    await self._later(ws, {"type": "final", "text": "x", "start": 0.0, "end": total, "words": [],
                                           "nbest": []})
                    await ws.send(json.dumps({"type": "done", "result": {"name": "n", "text": "x y"}}))
                    await ws.close(1000)
                    return
        except Exception:  # the client left
            pass
        self.closed_code = ws.close_code

    async def _later(self, ws, msg) -> None:
        await asyncio.sleep(self.delay)
        await ws.send(json.dumps(msg))


def _run(stub: Stub, samples: np.ndarray, **kw):
    async def go():
        async with serve(stub.handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await stream_audio(f"ws://127.0.0.1:{port}/v1/stream", samples, **kw)
    return asyncio.run(go())


def _noise(seconds: float) -> np.ndarray:
    return (0.1 * np.random.default_rng(0).standard_normal(int(SR * seconds))).astype(np.float32)


def test_real_time_pacing_latency_and_the_whole_exchange():
    audio = _noise(0.8)
    stub = Stub(every=3200, delay=0.05)
    seen: List[str] = []
    sent, flags = asyncio.Event(), []  # whether the audio and end message were sent, at each message

    def got(msg) -> None:
        seen.append(msg["type"])
        flags.append(sent.is_set())

    t0 = time.perf_counter()
    out = _run(stub, audio, rate=1.0, frame_ms=100, name="a", on_message=got, sent=sent)
    took = time.perf_counter() - t0
    assert stub.start == {"type": "start", "sample_rate": SR, "format": "s16le", "name": "a"}
    assert stub.audio == to_pcm(audio, "s16le") and stub.ended
    assert took >= 0.75  # 0.8 s of audio at real time
    gaps = np.diff(stub.frame_times)  # 100 ms frames, one every 100 ms
    assert len(stub.frame_times) == 8 and np.median(gaps) == pytest.approx(0.1, abs=0.05)
    assert seen[0] == "ready" and seen[-1] == "done" and seen.count("partial") == 4
    assert flags[:3] == [False, False, False] and flags[-1] is True  # set when the end message went, before done
    assert (out.model, out.chunk_ms, out.error, out.close_code) == ("stub", 200, None, 1000)
    assert out.result == {"name": "n", "text": "x y"} and out.text == "x y"
    assert out.audio_seconds == pytest.approx(0.8)
    # every partial's end (200 ms of audio) is a frame's end: its latency is the stub's delay (plus loopback)
    # (loose upper bounds, for a loaded machine: the anchoring itself is the _Timeline test's)
    assert len(out.partial_latency) == 4 and all(0.045 <= x < 0.05 + 0.5 for x in out.partial_latency)
    # the last final closes the input: timed from the end message
    assert len(out.final_latency) == 1 and 0.045 <= out.final_latency[0] < 0.05 + 0.5


def test_a_partial_is_timed_from_the_frame_that_held_its_last_sample():
    from asrkit.serve.client import _Timeline

    t = _Timeline(SR)
    for end, sent in [(1600, 1.0), (3200, 1.1), (4800, 1.2)]:  # 100 ms frames
        t.sent(end, sent)
    assert t.latency(0.15, 1.25) == pytest.approx(0.15)  # its last sample came with the frame ending at 200 ms
    assert t.latency(0.2, 1.25) == pytest.approx(0.15)  # ... as did the 200 ms-th
    assert t.latency(0.1999, 1.25) == pytest.approx(0.15)
    assert t.latency(0.2002, 1.25) == pytest.approx(0.15)  # a time rounded to the millisecond
    assert t.latency(0.2006, 1.25) == pytest.approx(0.05)  # past it: the next frame's
    assert t.latency(0.01, 1.25) == pytest.approx(0.25)
    assert t.latency(0.31, 1.5) is None  # past what was sent, before the end message
    t.end_message = 1.3
    assert t.latency(0.31, 1.5) == pytest.approx(0.2)


def test_as_fast_as_possible_and_leaving_mid_stream():
    audio = _noise(3.0)
    stub = Stub()
    t0 = time.perf_counter()
    out = _run(stub, audio, rate=0, frame_ms=100, stop_after=1.0)
    assert time.perf_counter() - t0 < 1.0
    assert len(stub.audio) == 2 * SR and not stub.ended  # 1 s of s16le, then gone without an end message
    assert out.result is None and out.audio_seconds == pytest.approx(1.0)


def test_a_refused_stream_reports_the_server_s_message_and_code():
    out = _run(Stub(refuse="start message: sample_rate is missing"), _noise(0.2), rate=0)
    assert out.error == "start message: sample_rate is missing"
    assert out.close_code == 1008 and out.result is None


def test_no_server_is_an_error_not_an_exception():
    sent = asyncio.Event()
    out = asyncio.run(stream_audio("ws://127.0.0.1:9/v1/stream", _noise(0.1), rate=0, timeout=5, sent=sent))
    assert out.result is None and out.error and "refused" in out.error.lower()
    assert sent.is_set()  # a load generator waiting on it goes on


@pytest.mark.parametrize("kw, match", [({"rate": -1}, "rate"), ({"frame_ms": 0}, "frame_ms")])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        asyncio.run(stream_audio("ws://127.0.0.1:9/v1/stream", _noise(0.1), **kw))


# ---- against the real server (conftest's tone_model served by uvicorn) -------------------------------------------

def _tones() -> np.ndarray:
    """Two tones the conftest's tone_model hears as "C C", two utterances split by an endpoint."""
    from tests.serve.serve_audio import tones

    return tones(2)


@pytest.mark.parametrize("fmt", ["s16le", "f32le"])
def test_the_server_s_result_is_the_stream_api_s(tone_model, fmt):
    from asrkit.pipeline.formats import result_to_dict
    from tests.serve.live_server import serving

    audio = _tones()
    sent = np.frombuffer(to_pcm(audio, fmt), dtype="<i2" if fmt == "s16le" else "<f4").astype(np.float32)
    if fmt == "s16le":
        sent /= 32768.0
    local = tone_model.stream()
    local.accept_waveform(sent)
    want = result_to_dict(local.finish())
    assert want["text"] == "C C" and len(want["segments"]) == 2  # the case: an endpoint, then the input's end
    with serving(tone_model) as host:
        out = asyncio.run(stream_audio(f"ws://{host}/v1/stream", audio, rate=0, fmt=fmt, name="tones",
                                       frame_ms=50))
    assert (out.error, out.close_code, out.model, out.chunk_ms) == (None, 1000, "tiny", 320)
    got = dict(out.result)
    assert got.pop("name") == "tones" and want.pop("name") == "stream"
    for a, b in zip(got.pop("nbest"), want.pop("nbest")):  # scores: float sums in another order
        assert a["text"] == b["text"] and a["score"] == pytest.approx(b["score"], abs=1e-6)
    assert got == want
    assert [(f["text"], f["start"], f["end"]) for f in out.finals] == \
        [(s["text"], s["start"], s["end"]) for s in want["segments"]]
    assert [f["words"] for f in out.finals] == [[w] for w in want["words"]]
    ends = [p["end"] for p in out.partials]
    assert ends == sorted(ends) and ends[-1] <= len(audio) / SR + 1e-6
    assert len(out.partials) >= int(len(audio) / SR / 0.32)  # one per chunk
    assert len(out.partial_latency) == len(out.partials) and len(out.final_latency) == 2


def test_upload_returns_what_transcribe_gives(tone_model, tmp_path):
    import soundfile as sf

    from asrkit.pipeline.formats import result_to_dict
    from asrkit.serve.client import transcribe_file
    from tests.serve.live_server import serving

    wav = tmp_path / "tones.wav"
    sf.write(wav, _tones(), SR, subtype="PCM_16")
    want = result_to_dict(tone_model.transcribe(str(wav)))
    with serving(tone_model) as host:
        got = transcribe_file(f"http://{host}/v1/transcribe", str(wav))
        vtt = transcribe_file(f"http://{host}/v1/transcribe", str(wav), fmt="vtt")
        with pytest.raises(RuntimeError, match="HTTP 400: .*format 'doc' is unknown"):
            transcribe_file(f"http://{host}/v1/transcribe", str(wav), fmt="doc")
    assert want["text"] and {**got, "name": ""} == {**want, "name": ""}
    assert vtt.startswith("WEBVTT") and "C" in vtt


def test_the_cli_prints_partials_finals_and_the_result(tone_model, tmp_path, capsys, monkeypatch):
    import soundfile as sf

    from asrkit.cli import main
    from asrkit.config import ServeConfig
    from tests.serve.live_server import serving

    wav = tmp_path / "tones.wav"
    sf.write(wav, _tones(), SR, subtype="PCM_16")
    missing = str(tmp_path / "missing.wav")
    monkeypatch.setenv("ASRKIT_SERVE_TOKEN", "s3cret")
    with serving(tone_model, ServeConfig(token="s3cret")) as host:
        url = f"ws://{host}/v1/stream"
        assert main(["stream-client", "--url", url, "--rate", "0", str(wav), missing]) == 1
        cap = capsys.readouterr()
        assert main(["stream-client", "--url", url, "--rate", "0", "--token", "wrong", str(wav)]) == 1
        wrong = capsys.readouterr()
    lines = [json.loads(x) for x in cap.out.splitlines()]
    assert {x["name"] for x in lines} == {str(wav)}
    kinds = [x["type"] for x in lines]
    assert kinds[-1] == "done" and kinds.count("final") == 2 and "partial" in kinds
    assert lines[-1]["result"]["text"] == "C C" == " ".join(x["text"] for x in lines if x["type"] == "final")
    assert cap.err.count("\n") == 1 and "missing.wav" in cap.err  # the missing file named, the other sent
    assert wrong.out == "" and "the token is wrong (close code 1008)" in wrong.err
