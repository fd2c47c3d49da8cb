"""Per-stream hotwords (issues 31 and 32): a start message's ``hotwords`` give that stream what the stream API gives
with that list, a stream with its own list and one with the server's decode at once each as alone, and a bad list
is refused with 1008 while the other streams go on."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from asrkit.config import ServeConfig
from asrkit.serve import build_app
from asrkit.serve.engine import MAX_HOTWORD_LISTS
from tests.serve.serve_audio import (CHUNK_MS, finish, from_s16le, reference, refused, s16le, same_json, start,
                                    tones, wait_no_streams)

HOT = ["C", ["C C", 3.0]]  # the tone's token, and a pair with a weight


@pytest.fixture(scope="module")
def app(tone_model):
    return build_app(tone_model, ServeConfig(), name="tones")


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


def test_hotword_lists_share_their_chunk_s_recognizer_and_count_toward_a_cap_of_their_own(app):
    lists = [["C"] * k for k in range(1, MAX_HOTWORD_LISTS + 1)]  # more than MAX_RECOGNIZERS: one recognizer
    with TestClient(app) as client:
        info = client.get("/v1/info").json()
        assert info["max_hotword_lists"] == MAX_HOTWORD_LISTS and info["hotword_lists_share_batches"] is True
        sockets = [client.websocket_connect("/v1/stream") for _ in lists]
        try:
            for ws, hot in zip(sockets, lists):
                assert start(ws.__enter__(), hotwords=hot)["type"] == "ready"
            with client.websocket_connect("/v1/stream") as same:  # a list in use (spaces aside) is taken
                assert start(same, hotwords=[" C "])["type"] == "ready"
            with client.websocket_connect("/v1/stream") as extra:
                message, code = refused(extra, hotwords=["C C"])
            assert code == 1008 and f"at most {MAX_HOTWORD_LISTS} distinct hotword lists" in message["message"]
            with client.websocket_connect("/v1/stream") as other_chunk:  # another chunk size is a recognizer more
                assert start(other_chunk, chunk_ms=2 * CHUNK_MS)["type"] == "ready"
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


def _result(stream) -> dict:
    from asrkit.pipeline.formats import result_to_dict

    return result_to_dict(stream.result())


@pytest.mark.parametrize("native", [True, False])
def test_streams_with_different_lists_share_one_recognizer_and_each_equals_its_alone_result(tone_model, native,
                                                                                           monkeypatch):
    from asrkit.search import native_loop

    if not native:  # the torch loop, as on a GPU
        monkeypatch.setenv("ASRKIT_NATIVE", "0")
    audio = tones(2)
    lists = [None, [("C", 1.0), ("C C", 3.0)], ["C"], [("C", 1.0), ("C C", 3.0)]]  # the first made before any list
    rec = tone_model.streaming_recognizer()
    assert rec.search.native == (native and native_loop.scorers_unavailable({}) is None)
    streams = [rec.create_stream("mic", hotwords=hot) for hot in lists[:1]]
    assert "hotwords" not in rec.search.scorers  # no list yet: streams pay nothing for the union
    streams += [rec.create_stream("mic", hotwords=hot) for hot in lists[1:]]
    assert rec.hotword_lists is not None and rec.hotword_lists.union.scorer.graph.lists == 3  # none, A, B
    for i in range(0, len(audio), 5120):
        for s in streams:
            s.accept_waveform(audio[i: i + 5120])
        rec.decode_streams(streams)
    for s in streams:
        s.input_finished()
    rec.decode_streams(streams)
    for s, hot in zip(streams, lists):
        assert same_json(_result(s), reference(tone_model, audio, hotwords=hot))
    assert not same_json(_result(streams[0]), _result(streams[1]))


def test_a_union_of_lists_no_stream_uses_is_compacted_and_a_live_stream_goes_on(tone_model, monkeypatch):
    from asrkit.pipeline import stream_hotwords

    monkeypatch.setenv("ASRKIT_NATIVE", "0")  # the torch loop's live states are the ones moved
    audio = tones(1)
    rec = tone_model.streaming_recognizer()
    lists = rec.hotword_lists
    gone = [rec.create_stream(f"gone{k}", hotwords=["C" * k, "C " * k]) for k in range(2, 6)]
    live = rec.create_stream("mic", hotwords=["C C"])
    assert live._hotword_list == 5  # none, four gone, the live one's
    live.accept_waveform(audio[: len(audio) // 2])
    rec.decode_streams([live])
    for s in gone:
        s.finish()
    monkeypatch.setattr(stream_hotwords, "DEAD_SHARE", 0.0)
    last = rec.create_stream("mic", hotwords=["C"])  # joins, and the lists of the gone streams are dropped
    assert lists.union.scorer.graph.lists == 3 and live._hotword_list == 1 and last._hotword_list == 2
    live.accept_waveform(audio[len(audio) // 2:])
    last.accept_waveform(audio)
    for s in (live, last):
        s.input_finished()
    rec.decode_streams([live, last])
    assert same_json(_result(live), reference(tone_model, audio, hotwords=["C C"]))
    assert same_json(_result(last), reference(tone_model, audio, hotwords=["C"]))


def test_a_search_bounded_by_a_lexicon_keeps_a_recognizer_per_list(serve_exp, tmp_path):
    import asrkit
    from asrkit.config import ConfigError, DecodeConfig

    words = tmp_path / "words.txt"
    words.write_text("C\n")
    model = asrkit.load_model(serve_exp, decode=DecodeConfig(mode="ctc_prefix", beam=4, chunk_ms=CHUNK_MS,
                                                             lexicon=str(words)))
    rec = model.streaming_recognizer()
    assert rec.hotword_lists is None  # a list's words outside the lexicon join it: once per search
    with pytest.raises(ConfigError, match="a word LM or decode.lexicon bounds the words"):
        rec.create_stream("mic", hotwords=["C"])
    with TestClient(build_app(model, ServeConfig())) as client:
        assert client.get("/v1/info").json()["hotword_lists_share_batches"] is False
        with client.websocket_connect("/v1/stream") as ws:
            assert start(ws, hotwords=["C"])["type"] == "ready"  # its own recognizer, as before
