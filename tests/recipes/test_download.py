"""tools/download.py and recipes/librispeech/local/download_and_untar.sh against a loopback HTTP server.

The server (http.server in a thread, 127.0.0.1, port 0) serves archives made here and can misbehave on
chosen requests: close the connection half-way, send wrong bytes, or ignore Range. Expected checksums
come from hashlib over the bytes the test made, independently of the tool.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
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


# ------------------------------------------------------------------ MUSAN and RIRS_NOISES (multi-condition training)
PREPARE = SCRIPT.parent / "prepare_augment.py"
SMALL_ROOMS = ["Room001/Room001-00001.wav", "Room001/Room001-00002.wav", "Room002/Room002-00001.wav"]


def _wav_bytes(seconds: float = 0.05) -> bytes:
    import numpy as np
    import soundfile as sf
    buf = io.BytesIO()
    sf.write(buf, np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 0.1, 16000, format="WAV")
    return buf.getvalue()


def make_musan_tarball() -> bytes:
    """musan/{noise,music,speech}/<source>/<file>.wav and a README, as OpenSLR 17 unpacks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {"musan/README": b"MUSAN\n", "musan/noise/free-sound/noise-free-sound-0000.wav": _wav_bytes(),
                           "musan/noise/sound-bible/noise-sound-bible-0000.wav": _wav_bytes(),
                           "musan/music/fma/music-fma-0000.wav": _wav_bytes(),
                           "musan/speech/librivox/speech-librivox-0000.wav": _wav_bytes()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_rirs_zip() -> bytes:
    """RIRS_NOISES/simulated_rirs/<room>/{rir_list, RoomNNN/*.wav} and real_rirs_isotropic_noises, as OpenSLR 28's
    zip; rir_list paths are relative to the folder holding RIRS_NOISES (Kaldi's convention)."""
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for room in ("smallroom", "mediumroom", "largeroom"):
            base = f"RIRS_NOISES/simulated_rirs/{room}"
            lines = []
            for rel in SMALL_ROOMS:
                z.writestr(f"{base}/{rel}", _wav_bytes(0.02))
                rid = rel.split("/")[1][:-4]
                lines.append(f"--rir-id {room}-{rid} --room-id {room}-{rel.split('/')[0]} {base}/{rel}\n")
            z.writestr(f"{base}/rir_list", "".join(lines))
        z.writestr("RIRS_NOISES/real_rirs_isotropic_noises/air_1.wav", _wav_bytes(0.02))
        z.writestr("RIRS_NOISES/real_rirs_isotropic_noises/rir_list",
                   "--rir-id air_1 --room-id air --rt-60 0.4 RIRS_NOISES/real_rirs_isotropic_noises/air_1.wav\n")
    return buf.getvalue()


def test_download_and_untar_fetches_musan_and_rirs_noises(server, tmp_path):
    """OpenSLR 17's tarball and 28's zip: fetched, checked, unpacked into DIR/musan and DIR/RIRS_NOISES, marked."""
    musan, rirs = make_musan_tarball(), make_rirs_zip()
    server.files["/17/musan.tar.gz"] = musan
    server.files["/28/rirs_noises.zip"] = rirs
    table = tmp_path / "checksums.txt"
    table.write_text(f"musan.tar.gz md5 {hashlib.md5(musan).hexdigest()} {len(musan)}\n"
                     f"rirs_noises.zip sha256 {hashlib.sha256(rirs).hexdigest()} {len(rirs)}\n")
    aug = tmp_path / "augment"
    for name in ("musan", "rirs_noises"):
        res = run_script(server, aug, table, name)
        assert res.returncode == 0, res.stderr
    assert (aug / "musan" / ".complete").is_file() and (aug / "RIRS_NOISES" / ".complete").is_file()
    assert (aug / "musan" / "noise" / "free-sound" / "noise-free-sound-0000.wav").read_bytes() == _wav_bytes()
    assert (aug / "RIRS_NOISES" / "simulated_rirs" / "smallroom" / "rir_list").is_file()
    assert [p for p, _ in server.requests] == ["/17/musan.tar.gz", "/28/rirs_noises.zip"]
    assert run_script(server, aug, table, "rirs_noises").returncode == 0  # complete: nothing fetched again
    assert len(server.requests) == 2


def test_zip_unpack_refuses_members_outside_the_folder(tmp_path):
    import zipfile
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("RIRS_NOISES/ok.txt", "fine")
        z.writestr("../escaped.txt", "bad")
    with pytest.raises(dl.DownloadError, match=r"cannot unpack .*\.\./escaped\.txt: would be written outside"):
        dl.unpack(evil, tmp_path / "out", progress=False)
    assert not (tmp_path / "escaped.txt").exists()


def test_recipe_checksum_table_has_the_augmentation_archives():
    """MD5s as OpenSLR publishes them (resources 17 and 28) and the archives' sizes."""
    table = dl.read_checksum_table(SCRIPT.parent / "checksums.txt")
    assert table["musan.tar.gz"].md5 == "0c472d4fc0c5141eca47ad1ffeb2a7df" and table["musan.tar.gz"].size
    assert table["rirs_noises.zip"].md5 == "e6f48e257286e05de56413b4779d8ffb" and table["rirs_noises.zip"].size


def unpacked_augment(root: Path) -> Path:
    """AUGMENT_DIR as stage 0 leaves it: the archives unpacked and marked complete."""
    import zipfile
    with tarfile.open(fileobj=io.BytesIO(make_musan_tarball())) as tar:
        tar.extractall(root, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(root)
    with zipfile.ZipFile(io.BytesIO(make_rirs_zip())) as z:
        z.extractall(root)
    (root / "musan" / ".complete").write_text("")
    (root / "RIRS_NOISES" / ".complete").write_text("")
    return root


def test_prepare_augment_writes_what_the_augment_config_reads(tmp_path):
    from asrkit.audio.noise import list_noise_files
    from asrkit.audio.reverb import read_rir_list
    from asrkit.config import NoiseConfig, ReverbConfig

    aug = unpacked_augment(tmp_path / "augment")
    out = tmp_path / "lists"
    res = subprocess.run([sys.executable, str(PREPARE), str(aug), str(out)], capture_output=True, text=True,
                         cwd=tmp_path / "augment" / "musan")  # paths written absolute: the cwd does not matter
    assert res.returncode == 0, res.stderr
    # the RIR list: every simulated room's rir_list line, its path absolute; read by asrkit's reader from elsewhere
    lines = (out / "rir_list").read_text().splitlines()
    assert len(lines) == 9 and lines[0] == (f"--rir-id smallroom-Room001-00001 --room-id smallroom-Room001 "
                                           f"{aug}/RIRS_NOISES/simulated_rirs/smallroom/Room001/Room001-00001.wav")
    assert read_rir_list(str(out / "rir_list")) == [line.split()[-1] for line in lines]
    ReverbConfig(prob=0.5, rir_list=str(out / "rir_list"))
    # the noise folders: musan/noise and musan/music (speech is for babble, which asrkit mixes from utterances)
    sets = dict(line.split("=", 1) for line in (out / "train_opts").read_text().splitlines())
    assert sets["augment.reverb.rir_list"] == str(out / "rir_list")
    dirs = json.loads(sets["augment.noise.dirs"])
    assert dirs == [str(aug / "musan" / "noise"), str(aug / "musan" / "music")]
    assert [len(f) for f in list_noise_files(dirs)] == [2, 1]
    NoiseConfig(prob=0.5, dirs=tuple(dirs))
    # other sets: the real RIRs (their extra --rt-60 option kept), MUSAN speech
    res = subprocess.run([sys.executable, str(PREPARE), "--rir-sets", "real_rirs_isotropic_noises",
                          "--noise-sets", "speech", str(aug), str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (out / "rir_list").read_text() == (f"--rir-id air_1 --room-id air --rt-60 0.4 "
                                             f"{aug}/RIRS_NOISES/real_rirs_isotropic_noises/air_1.wav\n")


@pytest.mark.parametrize("args, message", [
    (["--rir-sets", "simulated_rirs/tinyroom"], "RIRS_NOISES/simulated_rirs/tinyroom/rir_list: no such file"),
    (["--noise-sets", "noise,nothing"], "musan/nothing: no such directory"),
])
def test_prepare_augment_errors_name_what_is_missing(tmp_path, args, message):
    aug = unpacked_augment(tmp_path / "augment")
    res = subprocess.run([sys.executable, str(PREPARE), *args, str(aug), str(tmp_path / "lists")],
                         capture_output=True, text=True)
    assert res.returncode == 1 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_prepare_augment_names_a_listed_file_that_is_missing(tmp_path):
    aug = unpacked_augment(tmp_path / "augment")
    (aug / "RIRS_NOISES" / "simulated_rirs" / "mediumroom" / "Room002" / "Room002-00001.wav").unlink()
    res = subprocess.run([sys.executable, str(PREPARE), str(aug), str(tmp_path / "lists")],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert (f"{aug}/RIRS_NOISES/simulated_rirs/mediumroom/rir_list:3: "
            f"{aug}/RIRS_NOISES/simulated_rirs/mediumroom/Room002/Room002-00001.wav: no such file") in res.stderr
    assert not (tmp_path / "lists" / "rir_list").exists()


def test_run_sh_augment_fetches_lists_and_trains_with_them(server, tmp_path):
    """--augment true: stage 0 fetches MUSAN and RIRS_NOISES (here already complete: their real checksums cannot
    match test archives) and writes data/augment/; stage 3 hands the lists and probabilities to asrkit train
    (recorded by a $ASRKIT_TRAIN_CMD that runs nothing)."""
    corpus, work = tmp_path / "corpus", tmp_path / "work"
    aug = unpacked_augment(corpus / "augment")
    (corpus / "LibriSpeech" / "dev-clean").mkdir(parents=True)
    (corpus / "LibriSpeech" / "dev-clean" / ".complete").write_text("")
    common = ["bash", str(SCRIPT.parents[1] / "run.sh"), "--corpus-dir", str(corpus), "--workdir", str(work),
              "--augment", "true", "--noise-prob", "0.4", "--train-sets", "dev-clean", "--eval-sets", "dev-clean"]
    res = subprocess.run([*common, "--stage", "0", "--stop-stage", "0", "--download", "true",
                          "--lm-resources", "", "--mirror", server.url],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "downloading musan (OpenSLR 17)" in res.stdout and "downloading rirs_noises (OpenSLR 28)" in res.stdout
    assert "musan.tar.gz already complete" in res.stderr and "rirs_noises.zip already complete" in res.stderr
    assert server.requests == []
    assert (work / "data" / "augment" / "rir_list").read_text().count("\n") == 9
    res = subprocess.run([*common, "--stage", "0", "--stop-stage", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "data/augment is complete" in res.stdout, res.stdout + res.stderr
    record = tmp_path / "train_args"
    recorder = tmp_path / "record.sh"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    recorder.chmod(0o755)
    env = dict(os.environ, ASRKIT_TRAIN_CMD=str(recorder))
    res = subprocess.run([*common, "--stage", "3", "--stop-stage", "3"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert res.returncode == 0, res.stderr
    args = record.read_text().splitlines()
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert f"augment.reverb.rir_list={work}/data/augment/rir_list" in sets
    assert f'augment.noise.dirs=["{aug}/musan/noise", "{aug}/musan/music"]' in sets
    assert {"augment.reverb.prob=0.5", "augment.noise.prob=0.4", "augment.noise.generated=[babble]"} <= set(sets)
    # without the lists, stage 3 says which stage writes them
    shutil.rmtree(work / "data" / "augment")
    shutil.rmtree(work / "exp")
    res = subprocess.run([*common, "--stage", "3", "--stop-stage", "3"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert res.returncode == 1
    assert "data/augment/train_opts: no augmentation lists: run stage 0 with --augment true" in res.stderr
