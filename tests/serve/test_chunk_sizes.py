"""Per-stream chunk sizes (issue 32): a start message's ``chunk_ms`` gives that stream what the stream API gives
with that chunk, streams of different chunk sizes decode at once each as alone, and an unusable chunk size, or
one more distinct size than the server decodes at once, is refused with 1008 while the other streams go on."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from asrkit.config import ServeConfig
from asrkit.serve import build_app
from asrkit.serve.engine import MAX_RECOGNIZERS
from tests.serve.serve_audio import (CHUNK_MS, finish, from_s16le, reference, refused, s16le, same_json, start,
                                    tones, wait_no_streams)


@pytest.fixture(scope="module")
def app(tone_model):
    return build_app(tone_model, ServeConfig(), name="tones")


def test_a_stream_decodes_with_its_own_chunk_size(app, tone_model):
    data = s16le(tones(2))
    ref = reference(tone_model, from_s16le(data), chunk_ms=2 * CHUNK_MS)
    assert ref != reference(tone_model, from_s16le(data), chunk_ms=CHUNK_MS)  # the chunk size shows in the result
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        assert start(ws, chunk_ms=2 * CHUNK_MS)["chunk_ms"] == 2 * CHUNK_MS
        ws.send_bytes(data)
        messages = finish(ws)
    assert messages[-1]["result"] == ref
    partials = [m["end"] for m in messages if m["type"] == "partial"]
    assert partials[0] == pytest.approx(2 * CHUNK_MS / 1000, abs=0.05)  # the first partial heard one long chunk


def test_streams_of_two_chunk_sizes_at_once_each_give_their_alone_result(app, tone_model):
    data = s16le(tones(2))
    refs = {ms: reference(tone_model, from_s16le(data), chunk_ms=ms) for ms in (CHUNK_MS, 2 * CHUNK_MS)}
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as a, \
            client.websocket_connect("/v1/stream") as b:
        assert start(a)["chunk_ms"] == CHUNK_MS  # the server's chunk by default
        assert start(b, chunk_ms=2 * CHUNK_MS)["chunk_ms"] == 2 * CHUNK_MS
        for i in range(0, len(data), 6400):
            a.send_bytes(data[i: i + 6400])
            b.send_bytes(data[i: i + 6400])
        done_a, done_b = finish(a)[-1]["result"], finish(b)[-1]["result"]
        info = client.get("/v1/info").json()
    assert same_json(done_a, refs[CHUNK_MS]) and same_json(done_b, refs[2 * CHUNK_MS])
    assert info["chunk_ms"] == CHUNK_MS and info["max_recognizers"] == MAX_RECOGNIZERS
    assert info["chunk_ms_multiple_of"] == 40  # the tone model's encoder frame: 10 ms hop x 4


@pytest.mark.parametrize("chunk_ms, error", [
    (100, "chunk_ms 100 is not usable: decode.chunk_ms must be a positive multiple of the encoder frame (40 ms"),
    (0, "chunk_ms 0 is not usable"),
    (320.0, "chunk_ms must be an integer number of milliseconds, got 320.0"),
    ("640", "chunk_ms must be an integer number of milliseconds, got '640'"),
])
def test_a_bad_chunk_size_is_refused_and_the_others_go_on(app, tone_model, chunk_ms, error):
    data = s16le(tones(1))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as good:
        start(good, chunk_ms=2 * CHUNK_MS)
        good.send_bytes(data[: len(data) // 2])
        with client.websocket_connect("/v1/stream") as bad:
            message, code = refused(bad, chunk_ms=chunk_ms)
        assert message["type"] == "error" and error in message["message"] and code == 1008
        good.send_bytes(data[len(data) // 2:])
        assert finish(good)[-1]["result"] == reference(tone_model, from_s16le(data), chunk_ms=2 * CHUNK_MS)


def test_more_distinct_chunk_sizes_than_the_cap_are_refused(app):
    sizes = [CHUNK_MS * k for k in range(2, MAX_RECOGNIZERS + 1)]  # with the default: the cap
    with TestClient(app) as client:
        sockets = [client.websocket_connect("/v1/stream") for _ in sizes]
        try:
            for ws, ms in zip(sockets, sizes):
                assert start(ws.__enter__(), chunk_ms=ms)["chunk_ms"] == ms
            with client.websocket_connect("/v1/stream") as same:  # a size in use is taken
                assert start(same, chunk_ms=sizes[-1])["type"] == "ready"
            with client.websocket_connect("/v1/stream") as extra:
                message, code = refused(extra, chunk_ms=CHUNK_MS * (MAX_RECOGNIZERS + 1))
            assert code == 1008 and \
                f"at most {MAX_RECOGNIZERS} distinct chunk_ms settings at once" in message["message"]
        finally:
            for ws in sockets:
                ws.__exit__(None, None, None)
        wait_no_streams(client)
        with client.websocket_connect("/v1/stream") as later:  # the sizes' streams ended: a new size is taken
            assert start(later, chunk_ms=CHUNK_MS * (MAX_RECOGNIZERS + 1))["type"] == "ready"
