"""Fixtures of the serving tests: a tiny streaming model that hears tones (its CTC head emits "C" on a tone and blank
on quiet, so endpoints split a stream of tones into finals) and the app serving it."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="starlette's TestClient needs httpx (the serve extra)")

import asrkit  # noqa: E402
from asrkit.config import DecodeConfig, EndpointConfig  # noqa: E402
from tests.pipeline.streaming_exp import make_streaming_exp, make_tone_detector  # noqa: E402
from tests.serve.serve_audio import CHUNK_MS  # noqa: E402


@pytest.fixture(autouse=True)
def _testclient_leaves_quietly(monkeypatch):
    """Leaving a WebSocket session, starlette's TestClient sends the disconnect and at once cancels the app's task;
    on a loaded machine the server may still be handling the disconnect, and that cancellation then surfaces in the
    test as a CancelledError (seen in clean-clone CI runs, in two different tests). It is the harness's, not the
    server's: what the tests check is the server's side (streams freed, refusals, errors, results), so it is let
    through. Real sockets (uvicorn) are tested by the client, page and load tests."""
    import concurrent.futures

    from starlette.testclient import WebSocketTestSession

    leave = WebSocketTestSession.__exit__

    def quietly(self, *args):
        try:
            return leave(self, *args)
        except concurrent.futures.CancelledError:
            return None

    monkeypatch.setattr(WebSocketTestSession, "__exit__", quietly)


@pytest.fixture(scope="session")
def serve_exp(tmp_path_factory):
    """A tiny streaming experiment dir (random weights)."""
    return make_streaming_exp(tmp_path_factory.mktemp("serve") / "exp")


@pytest.fixture(scope="session")
def tone_model(serve_exp):
    """The Transcriber of ``serve_exp`` whose CTC head detects tones (token "C"), 320 ms chunks, a CTC prefix
    search, endpoints after 0.6 s of trailing blanks."""
    model = asrkit.load_model(serve_exp, decode=DecodeConfig(mode="ctc_prefix", beam=4, chunk_ms=CHUNK_MS,
                                                             endpoint=EndpointConfig(trailing_silence=0.6)))
    make_tone_detector(model.model, model.tokenizer.token_list.index("C"))
    return model
