"""`asrkit serve` (issue 32): its options become the ServeConfig and the app it runs (served here by TestClient in
place of uvicorn), a bad value or a model that cannot stream is one line, and a missing serve extra names it."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient

import asrkit.serve.app as serve_app
from asrkit.cli import main
from asrkit.config import ServeConfig


@pytest.fixture
def ran(monkeypatch):
    """What `asrkit serve` would have run: (app, cfg, log_level), uvicorn left out."""
    got = []
    monkeypatch.setattr(serve_app, "run_server", lambda app, cfg, log_level="info": got.append((app, cfg, log_level)))
    return got


def test_the_options_make_the_config_and_the_app(serve_exp, ran, monkeypatch, capsys):
    monkeypatch.setenv("ASRKIT_SERVE_TOKEN", "from-env")
    assert main(["serve", "--model", str(serve_exp), "--mode", "ctc_prefix", "--beam", "3", "--chunk-ms", "320",
                 "--port", "9001", "--max-streams", "5", "--max-message-bytes", "4096", "--max-stream-seconds",
                 "60", "--idle-timeout", "7", "--max-upload-bytes", "1000", "--threads", "2", "--log-level",
                 "warning"]) == 0
    (app, cfg, log_level), = ran
    assert cfg == ServeConfig(host="127.0.0.1", port=9001, token="from-env", max_streams=5, max_message_bytes=4096,
                              max_stream_seconds=60.0, idle_timeout_s=7.0, max_upload_bytes=1000, threads=2)
    assert log_level == "warning" and capsys.readouterr().err == ""
    rec = app.state.recognizer
    assert (rec.cfg.mode, rec.cfg.beam, rec.chunk_frames * rec.frame_shift) == ("ctc_prefix", 3, pytest.approx(0.32))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 401
        info = client.get("/v1/info", headers={"Authorization": "Bearer from-env"}).json()
        assert (info["model"], info["chunk_ms"]) == (serve_exp.name, 320)


def test_serving_beyond_loopback_without_a_token_warns(serve_exp, ran, monkeypatch, capsys):
    monkeypatch.delenv("ASRKIT_SERVE_TOKEN", raising=False)
    assert main(["serve", "--model", str(serve_exp), "--host", "0.0.0.0", "--name", "demo"]) == 0
    assert ran[0][1].token is None and ran[0][0].state.engine.max_streams == ServeConfig().max_streams
    assert capsys.readouterr().err == ("asrkit serve: warning: serving on 0.0.0.0 without a token: anyone who reaches "
                                       "the port can use the model (give --token or $ASRKIT_SERVE_TOKEN)\n")


@pytest.mark.parametrize("args, code, error", [
    (["--max-streams", "0"], 2, "asrkit serve: serve.max_streams must be at least 1, got 0\n"),
    (["--port", "70000"], 2, "asrkit serve: serve.port must be at most 65535, got 70000\n"),
    (["--idle-timeout", "0"], 2, "asrkit serve: serve.idle_timeout_s must be > 0, got 0.0\n"),
    (["--chunk-ms", "50"], 1, "asrkit serve: decode.chunk_ms must be a positive multiple of the encoder frame"),
    (["--mode", "greedy", "--hotwords", "hot.txt"], 1, "asrkit serve: decode.hotwords is set but decode.mode is "
                                                          "greedy"),
])
def test_a_bad_option_is_one_line(serve_exp, ran, capsys, args, code, error, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hot.txt").write_text("C\n")
    assert main(["serve", "--model", str(serve_exp), *args]) == code
    assert capsys.readouterr().err.startswith(error) and ran == []


def test_a_missing_serve_extra_names_it(serve_exp, ran, not_installed, capsys):
    not_installed("uvicorn")
    assert main(["serve", "--model", str(serve_exp)]) == 1
    assert capsys.readouterr().err == ("asrkit: asrkit serve needs uvicorn, which is not installed: "
                                       "pip install -e '.[serve]' (in the asrkit checkout)\n")


def test_the_server_runs_torch_on_its_threads(serve_exp, monkeypatch):
    import sys
    import types

    import torch

    ran = []
    monkeypatch.setitem(sys.modules, "uvicorn", types.SimpleNamespace(run=lambda app, **kw: ran.append(
        (torch.get_num_threads(), kw))))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert main(["serve", "--model", str(serve_exp), "--threads", "1", "--max-message-bytes", "4096"]) == 0
    finally:
        torch.set_num_threads(before)
    (threads, kw), = ran
    assert threads == 1 and (kw["host"], kw["port"], kw["ws_max_size"]) == ("127.0.0.1", 8000, 8192)
