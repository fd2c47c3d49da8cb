"""tools/download.py and recipes/librispeech/local/download_and_untar.sh against a loopback HTTP server.

The server (http.server in a thread, 127.0.0.1, port 0) serves archives made here and can misbehave on
chosen requests: close the connection half-way, send wrong bytes, or ignore Range. Expected checksums
come from hashlib over the bytes the test made, independently of the tool.
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "recipes" / "librispeech" / "local" / "download_and_untar.sh"
dl = load_tool("download")

TRANS = "1-2-0000 HELLO WORLD\n1-2-0001 GOOD MORNING\n"


def make_tarball(part: str = "dev-clean") -> bytes:
    """A tiny LibriSpeech-shaped .tar.gz: LibriSpeech/PART/1/2/{1-2.trans.txt, 1-2-0000.flac}."""
    buf = io.BytesIO()
    # incompressible payload so that the archive is a few hundred KB and a half-way cut lands mid-file
    payload = {f"LibriSpeech/{part}/1/2/1-2.trans.txt": TRANS.encode(),
               f"LibriSpeech/{part}/1/2/1-2-0000.flac": os.urandom(300_000)}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in payload.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Server:
    """Loopback HTTP server; ``faults[path]`` is a list of modes used by the next requests to path."""

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}
        self.faults: Dict[str, List[str]] = {}
        self.requests: List[Tuple[str, Optional[str]]] = []  # (path, Range header)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                owner.requests.append((self.path, rng))
                data = owner.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                modes = owner.faults.get(self.path) or []
                mode = modes.pop(0) if modes else "ok"
                if mode == "corrupt":
                    data = bytes(b ^ 0x5A for b in data)  # same length, wrong bytes
                start = 0
                if rng and mode != "ignore-range":
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # "truncate": announce the whole body, send half, close (an interrupted transfer)
                self.wfile.write(body[: len(body) // 2] if mode == "truncate" else body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> "Server":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    with Server() as srv:
        yield srv


def expected_of(data: bytes) -> "dl.Expected":
    return dl.Expected(md5=hashlib.md5(data).hexdigest(), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def fetch(server: Server, tmp: Path, data: bytes, expected=None, retries: int = 3):
    server.files["/12/dev-clean.tar.gz"] = data
    marker = tmp / "LibriSpeech" / "dev-clean" / ".complete"
    dl.fetch_resource(f"{server.url}/12/dev-clean.tar.gz", tmp, expected or expected_of(data), unpack_to=str(tmp),
                      marker=str(marker), retries=retries, retry_wait=0, timeout=10, progress=False)
    return marker


def unpacked_ok(tmp: Path) -> bool:
    trans = tmp / "LibriSpeech" / "dev-clean" / "1" / "2" / "1-2.trans.txt"
    return trans.is_file() and trans.read_text() == TRANS


def test_good_download_unpacks_marks_complete_and_is_not_fetched_again(server, tmp_path):
    data = make_tarball()
    marker = fetch(server, tmp_path, data)
    assert marker.is_file() and unpacked_ok(tmp_path)
    assert (tmp_path / "dev-clean.tar.gz").read_bytes() == data
    assert not (tmp_path / "dev-clean.tar.gz.part").exists()
    assert server.requests == [("/12/dev-clean.tar.gz", None)]
    fetch(server, tmp_path, data)  # rerun: the marker says done
    assert len(server.requests) == 1


def test_connection_closed_half_way_is_resumed_with_a_range_request(server, tmp_path, capsys):
    data = make_tarball()
    server.faults["/12/dev-clean.tar.gz"] = ["truncate"]
    marker = fetch(server, tmp_path, data)
    assert marker.is_file() and unpacked_ok(tmp_path)
    assert (tmp_path / "dev-clean.tar.gz").read_bytes() == data
    (_, first), (_, second) = server.requests
    assert first is None and second == f"bytes={len(data) // 2}-"
    assert "transfer failed" in capsys.readouterr().err


def test_partial_file_left_from_before_is_resumed(server, tmp_path):
    data = make_tarball()
    (tmp_path / "dev-clean.tar.gz.part").write_bytes(data[:12345])
    marker = fetch(server, tmp_path, data)
    assert marker.is_file() and unpacked_ok(tmp_path)
    assert server.requests == [("/12/dev-clean.tar.gz", "bytes=12345-")]


def test_server_ignoring_range_restarts_from_byte_zero(server, tmp_path):
    data = make_tarball()
    (tmp_path / "dev-clean.tar.gz.part").write_bytes(data[:5000])
    server.faults["/12/dev-clean.tar.gz"] = ["ignore-range"]
    fetch(server, tmp_path, data)
    assert (tmp_path / "dev-clean.tar.gz").read_bytes() == data and unpacked_ok(tmp_path)


def test_corrupted_download_is_detected_deleted_and_fetched_again(server, tmp_path, capsys):
    data = make_tarball()
    server.faults["/12/dev-clean.tar.gz"] = ["corrupt"]
    marker = fetch(server, tmp_path, data)
    assert marker.is_file() and unpacked_ok(tmp_path)
    # the wrong file was deleted, not resumed: the second request starts from byte 0
    assert [r for _, r in server.requests] == [None, None]
    assert "md5 mismatch" in capsys.readouterr().err


def test_file_still_wrong_after_the_retry_limit_fails_clearly_and_marks_nothing(server, tmp_path):
    data = make_tarball()
    bad = bytes(b ^ 0x5A for b in data)
    server.faults["/12/dev-clean.tar.gz"] = ["corrupt"] * 5
    with pytest.raises(dl.DownloadError) as err:
        fetch(server, tmp_path, data, retries=2)
    msg = str(err.value)
    url = f"{server.url}/12/dev-clean.tar.gz"
    assert "dev-clean.tar.gz" in msg and url in msg and "2 attempts" in msg
    assert hashlib.md5(data).hexdigest() in msg and hashlib.md5(bad).hexdigest() in msg
    assert len(server.requests) == 2
    assert not (tmp_path / "LibriSpeech").exists()
    assert not (tmp_path / "dev-clean.tar.gz").exists() and not (tmp_path / "dev-clean.tar.gz.part").exists()


def test_wrong_size_is_caught_before_hashing(server, tmp_path):
    data = make_tarball()
    with pytest.raises(dl.DownloadError, match=f"size mismatch: expected {len(data) + 1} bytes, actual {len(data)}"):
        fetch(server, tmp_path, data, expected=dl.Expected(size=len(data) + 1), retries=1)


def test_unknown_checksum_checks_size_and_says_so(server, tmp_path, capsys):
    server.files["/11/librispeech-vocab.txt"] = b"HELLO\nWORLD\n"
    dl.fetch_resource(f"{server.url}/11/librispeech-vocab.txt", tmp_path, dl.Expected(size=12),
                      retry_wait=0, progress=False)
    err = capsys.readouterr().err
    assert "no published checksum is known for librispeech-vocab.txt" in err
    assert hashlib.sha256(b"HELLO\nWORLD\n").hexdigest() in err  # printed so it can go into the table
    assert (tmp_path / "librispeech-vocab.txt.complete").is_file()


def test_checksum_table_errors_name_file_and_line(tmp_path):
    table = tmp_path / "checksums.txt"
    table.write_text("# comment\na.tar.gz md5 " + "0" * 32 + " 10\nb.tar.gz sha1 abc 10\n")
    with pytest.raises(ValueError, match=r"checksums.txt:3: unknown algorithm 'sha1'"):
        dl.read_checksum_table(table)
    table.write_text("a.tar.gz md5 xyz 10\n")
    with pytest.raises(ValueError, match=r"checksums.txt:1: 'xyz' is not a md5 hex digest"):
        dl.read_checksum_table(table)


def test_recipe_checksum_table_lists_every_download():
    table = dl.read_checksum_table(REPO / "recipes" / "librispeech" / "local" / "checksums.txt")
    parts = ["dev-clean", "dev-other", "test-clean", "test-other", "train-clean-100", "train-clean-360",
             "train-other-500"]
    for part in parts:  # the corpus archives have published MD5 and SHA-256 values
        e = table[f"{part}.tar.gz"]
        assert e.md5 and e.sha256 and e.size
    for name in ["librispeech-lm-norm.txt.gz", "3-gram.arpa.gz", "4-gram.arpa.gz", "librispeech-lexicon.txt",
                 "librispeech-vocab.txt"]:
        assert table[name].size


def run_script(server: Server, corpus: Path, table: Path, name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENSLR_MIRROR=server.url)
    return subprocess.run(["bash", str(SCRIPT), "--checksums", str(table), str(corpus), name],
                          capture_output=True, text=True, env=env, timeout=60)


def test_download_and_untar_script_end_to_end(server, tmp_path):
    data = make_tarball()
    vocab = b"HELLO\nWORLD\n"
    server.files["/12/dev-clean.tar.gz"] = data
    server.files["/11/librispeech-vocab.txt"] = vocab
    table = tmp_path / "checksums.txt"
    table.write_text(f"dev-clean.tar.gz md5 {hashlib.md5(data).hexdigest()} {len(data)}\n"
                     f"librispeech-vocab.txt - - {len(vocab)}\n")
    corpus = tmp_path / "corpus"
    res = run_script(server, corpus, table, "dev-clean")
    assert res.returncode == 0, res.stderr
    assert unpacked_ok(corpus) and (corpus / "LibriSpeech" / "dev-clean" / ".complete").is_file()
    res = run_script(server, corpus / "lm", table, "librispeech-vocab.txt")
    assert res.returncode == 0, res.stderr
    assert (corpus / "lm" / "librispeech-vocab.txt").read_bytes() == vocab
    assert len(server.requests) == 2
    res = run_script(server, corpus, table, "dev-clean")  # rerun: nothing fetched
    assert res.returncode == 0 and "already complete" in res.stderr
    assert len(server.requests) == 2


def test_download_and_untar_script_fails_on_a_bad_checksum(server, tmp_path):
    data = make_tarball("dev-other")
    server.files["/12/dev-other.tar.gz"] = data
    table = tmp_path / "checksums.txt"
    table.write_text(f"dev-other.tar.gz md5 {'0' * 32} {len(data)}\n")
    corpus = tmp_path / "corpus"
    res = subprocess.run(["bash", str(SCRIPT), "--checksums", str(table), "--retries", "2", str(corpus), "dev-other"],
                         capture_output=True, text=True, env=dict(os.environ, OPENSLR_MIRROR=server.url), timeout=60)
    assert res.returncode == 1
    assert f"expected {'0' * 32}, actual {hashlib.md5(data).hexdigest()}" in res.stderr
    assert not (corpus / "LibriSpeech").exists()
    res = subprocess.run(["bash", str(SCRIPT), "--checksums", str(table), str(corpus), "test-clean"],
                         capture_output=True, text=True, env=dict(os.environ, OPENSLR_MIRROR=server.url), timeout=60)
    assert res.returncode == 2 and "test-clean.tar.gz is not listed in" in res.stderr


@pytest.mark.parametrize("filters", [True, False])
def test_unpack_refuses_members_outside_the_folder(tmp_path, monkeypatch, filters):
    if not filters:  # the hand-written check used by Pythons without tarfile's extraction filters
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = tmp_path / "good.tar.gz"
    good.write_bytes(make_tarball())
    dl.unpack(good, tmp_path / "out", progress=False)
    assert unpacked_ok(tmp_path / "out")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(dl.DownloadError, match="cannot unpack"):
        dl.unpack(evil, tmp_path / "out2", progress=False)
    assert not (tmp_path / "escaped.txt").exists()


def test_run_sh_stage_0_fetches_parts_of_hours_and_lm_resources(server, tmp_path):
    """run.sh stage 0 orchestration: --hours picks the parts, --mirror reaches the server, LM files go to <corpus>/lm.

    The real checksum table is used, so the served LM file has the published size (its content is unchecked:
    no checksum is known for it) and the corpus parts are pre-marked complete (theirs could not match).
    """
    vocab = os.urandom(dl.read_checksum_table(SCRIPT.parent / "checksums.txt")["librispeech-vocab.txt"].size)
    server.files["/11/librispeech-vocab.txt"] = vocab
    corpus = tmp_path / "corpus"
    for part in ["train-clean-100", "train-clean-360", "dev-clean"]:
        (corpus / "LibriSpeech" / part).mkdir(parents=True)
        (corpus / "LibriSpeech" / part / ".complete").write_text("")
    res = subprocess.run(["bash", str(SCRIPT.parents[1] / "run.sh"), "--stage", "0", "--stop-stage", "0",
                          "--download", "true", "--corpus-dir", str(corpus), "--workdir", str(tmp_path / "work"),
                          "--hours", "460", "--eval-sets", "dev-clean", "--lm-resources", "librispeech-vocab.txt",
                          "--mirror", server.url], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    for part in ["train-clean-100", "train-clean-360", "dev-clean"]:
        assert f"downloading {part} " in res.stdout
    assert "train-other-500" not in res.stdout
    assert (corpus / "lm" / "librispeech-vocab.txt").read_bytes() == vocab
    assert (corpus / "lm" / "librispeech-vocab.txt.complete").is_file()
    assert "no published checksum is known for librispeech-vocab.txt" in res.stderr
    assert server.requests == [("/11/librispeech-vocab.txt", None)]
