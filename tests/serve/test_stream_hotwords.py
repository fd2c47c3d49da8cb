"""Per-stream hotwords (issues 31 and 32): a start message's ``hotwords`` give that stream what the stream API gives
with that list, a stream with its own list and one with the server's decode at once each as alone, and a bad list
is refused with 1008 while the other streams go on."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from asrkit.config import ServeConfig
from asrkit.serve import build_app
from asrkit.serve.engine import MAX_RECOGNIZERS
from tests.serve.serve_audio import (CHUNK_MS, SR, finish, from_s16le, reference, s16le, same_json, start, tones,
                                     wait_no_streams)

HOT = ["C", ["C C", 3.0]]  # the tone's token, and a pair with a weight


@pytest.fixture(scope="module")
def app(tone_model):
    return build_app(tone_model, ServeConfig(), name="tones")


def refused(ws, **keys) -> tuple:
    ws.send_json({"type": "start", "sample_rate": SR, **keys})
    message = ws.receive_json()
    with pytest.raises(WebSocketDisconnect) as exc:
        ws.receive_json()
    return message, exc.value.code


def test_a_stream_decodes_with_its_own_hotwords(app, tone_model):
    data = s16le(tones(2))
    ref = reference(tone_model, from_s16le(data), hotwords=[("C", 1.0), ("C C", 3.0)])
    assert ref != reference(tone_model, from_s16le(data))  # the list shows in the result (its scores)
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        assert start(ws, hotwords=HOT)["type"] == "ready"
        ws.send_bytes(data)
        assert finish(ws)[-1]["result"] == ref


def test_a_stream_with_hotwords_and_one_without_at_once_each_give_their_alone_result(app, tone_model):
    data = s16le(tones(2))
    plain, hot = reference(tone_model, from_s16le(data)), reference(tone_model, from_s16le(data), hotwords=["C"])
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as a, \
            client.websocket_connect("/v1/stream") as b:
        start(a)
        start(b, hotwords=["C"])
        for i in range(0, len(data), 6400):
            a.send_bytes(data[i: i + 6400])
            b.send_bytes(data[i: i + 6400])
        done_a, done_b = finish(a)[-1]["result"], finish(b)[-1]["result"]
    assert same_json(done_a, plain) and same_json(done_b, hot) and not same_json(plain, hot)


@pytest.mark.parametrize("hotwords, error", [
    ("C", "hotwords must be a list of phrases, got str"),
    (["C"] * 1001, "hotwords lists 1001 phrases, over the limit of 1000"),
    (["C", ""], "hotwords[1]: a phrase must be a non-empty string of at most 100 characters"),
    (["C" * 101], "hotwords[0]: a phrase must be a non-empty string of at most 100 characters"),
    (["\u00e9\u00e9"], "no phrase can be spelled with the model's units"),
])
def test_bad_hotwords_are_refused_and_the_others_go_on(app, tone_model, hotwords, error):
    data = s16le(tones(1))
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as good:
        start(good, hotwords=["C"])
        good.send_bytes(data[: len(data) // 2])
        with client.websocket_connect("/v1/stream") as bad:
            message, code = refused(bad, hotwords=hotwords)
        assert message["type"] == "error" and error in message["message"] and code == 1008
        good.send_bytes(data[len(data) // 2:])
        assert same_json(finish(good)[-1]["result"], reference(tone_model, from_s16le(data), hotwords=["C"]))


def test_hotword_lists_count_toward_the_cap_of_recognizers(app):
    lists = [["C"] * k for k in range(1, MAX_RECOGNIZERS)]  # with the server's: the cap
    with TestClient(app) as client:
        sockets = [client.websocket_connect("/v1/stream") for _ in lists]
        try:
            for ws, hot in zip(sockets, lists):
                assert start(ws.__enter__(), hotwords=hot)["type"] == "ready"
            with client.websocket_connect("/v1/stream") as same:  # a list in use (spaces aside) is taken
                assert start(same, hotwords=[" C "])["type"] == "ready"
            with client.websocket_connect("/v1/stream") as extra:
                message, code = refused(extra, hotwords=["C C"])
            assert code == 1008 and "(in use: 320 ms, 320 ms with own hotwords" in message["message"]
            with client.websocket_connect("/v1/stream") as other_chunk:  # a new chunk size is one more, too
                assert refused(other_chunk, chunk_ms=2 * CHUNK_MS)[1] == 1008
        finally:
            for ws in sockets:
                ws.__exit__(None, None, None)
        wait_no_streams(client)
        with client.websocket_connect("/v1/stream") as later:
            assert start(later, hotwords=["C C"])["type"] == "ready"


def test_a_stream_s_hotwords_reuse_the_loaded_search_and_a_greedy_server_refuses_them(app, serve_exp, monkeypatch):
    import asrkit
    from asrkit.config import DecodeConfig
    from asrkit.pipeline import searcher

    loads = []
    monkeypatch.setattr(searcher, "load_lm_scorer", lambda *a: loads.append(a))  # a new Searcher would load its LM
    with TestClient(app) as client, client.websocket_connect("/v1/stream") as ws:
        assert start(ws, hotwords=["C", "C C C"])["type"] == "ready"
    assert loads == []
    greedy = build_app(asrkit.load_model(serve_exp, decode=DecodeConfig(mode="greedy", chunk_ms=CHUNK_MS)),
                       ServeConfig())
    with TestClient(greedy) as client, client.websocket_connect("/v1/stream") as ws:
        message, code = refused(ws, hotwords=["C"])
    assert code == 1008 and "hotwords bias a beam search, but decode.mode is greedy" in message["message"]
