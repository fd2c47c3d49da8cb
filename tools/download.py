#!/usr/bin/env python3
"""Resumable HTTP(S) download, verified against published checksums before it is unpacked.

usage: tools/download.py [--checksums TABLE] [--md5 HEX] [--sha256 HEX] [--size BYTES]
                         [--unpack DIR] [--marker FILE] [--remove-archive] [--retries N]
                         [--retry-wait S] [--timeout S] [--quiet] URL DEST_DIR

Fetches URL into DEST_DIR/NAME (NAME: the last part of the URL) through DEST_DIR/NAME.part:
- an interrupted transfer is resumed with an HTTP Range request (a server that ignores Range
  sends the whole file again, which is detected and written from the start);
- the finished file is checked against the expected size and every known checksum (MD5 and/or
  SHA-256) from the TABLE line(s) for NAME and/or --md5/--sha256/--size; a mismatch is deleted and
  fetched again, up to --retries attempts, then the tool fails naming the file, the URL and the
  expected and actual values;
- with --unpack DIR a verified tar archive (any compression) or zip archive is unpacked into DIR;
- only then is the marker written (--marker; default DIR/.NAME.complete with --unpack, else
  DEST_DIR/NAME.complete). While the marker exists the tool does nothing, so reruns are free.
A file with no known checksum is still checked for its size, and the tool says so on stderr (and
prints the file's SHA-256 so that it can be added to the table); it never skips silently.

TABLE format (one line per name and algorithm, '#' comments, '-' for unknown):
    NAME  ALGORITHM(md5|sha256|-)  CHECKSUM|-  SIZE_BYTES|-
Exit status: 0 done (or already complete), 1 download/verification/unpack failure, 2 bad usage.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Dict, List, Optional

from tqdm import tqdm

ALGORITHMS = ("md5", "sha256")
CHUNK = 1 << 20  # bytes per read/write and per hash update
# HTTP errors worth another attempt; any other 4xx/5xx (404, 403, ...) fails at once.
RETRYABLE_HTTP = {408, 429, 500, 502, 503, 504}


class DownloadError(RuntimeError):
    """A file could not be fetched, verified or unpacked; the message names the file and URL."""


class _Truncated(OSError):
    """The server closed the connection before sending all the bytes it announced."""


@dataclass(frozen=True)
class Expected:
    """What a correct file looks like: its size and checksums, each None when unknown."""
    md5: Optional[str] = None
    sha256: Optional[str] = None
    size: Optional[int] = None

    def checksums(self) -> Dict[str, str]:
        return {a: getattr(self, a) for a in ALGORITHMS if getattr(self, a)}


def read_checksum_table(path: str | os.PathLike) -> Dict[str, Expected]:
    """NAME -> Expected from a checksum table (format in the module docstring)."""
    table: Dict[str, Expected] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            where = f"{path}:{lineno}"
            if len(fields) != 4:
                raise ValueError(f"{where}: expected 'NAME ALGORITHM CHECKSUM SIZE', got {len(fields)} fields")
            name, algo, value, size_text = fields
            if algo not in ALGORITHMS + ("-",):
                raise ValueError(f"{where}: unknown algorithm '{algo}' (md5, sha256 or -)")
            want_len = {"md5": 32, "sha256": 64}.get(algo)
            if want_len and (len(value) != want_len or any(c not in "0123456789abcdef" for c in value.lower())):
                raise ValueError(f"{where}: '{value}' is not a {algo} hex digest")
            if size_text != "-" and not size_text.isdigit():
                raise ValueError(f"{where}: size '{size_text}' is not a number of bytes (or -)")
            old = table.get(name, Expected())
            size = int(size_text) if size_text != "-" else None
            if size is not None and old.size is not None and size != old.size:
                raise ValueError(f"{where}: {name} was listed earlier with size {old.size}, here {size}")
            if want_len and getattr(old, algo) not in (None, value.lower()):
                raise ValueError(f"{where}: {name} has two different {algo} values")
            new = replace(old, size=size if size is not None else old.size)
            if want_len:
                new = replace(new, **{algo: value.lower()})
            table[name] = new
    return table


def file_digests(path: Path, algorithms: List[str], progress: bool = True) -> Dict[str, str]:
    """Hex digests of ``path`` for each algorithm, in one pass over the file."""
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as fh, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, mininterval=1,
                                      desc=f"checking {path.name}", disable=not progress) as bar:
        while block := fh.read(CHUNK):
            for h in hashers.values():
                h.update(block)
            bar.update(len(block))
    return {a: h.hexdigest() for a, h in hashers.items()}


def verify(path: Path, expected: Expected, progress: bool = True) -> Optional[str]:
    """None if ``path`` has the expected size and checksums, else what is wrong (expected vs actual)."""
    size = path.stat().st_size
    if expected.size is not None and size != expected.size:
        return f"size mismatch: expected {expected.size} bytes, actual {size} bytes"
    wanted = expected.checksums()
    actual = file_digests(path, list(wanted), progress) if wanted else {}
    for algo, value in wanted.items():
        if actual[algo] != value:
            return f"{algo} mismatch: expected {value}, actual {actual[algo]}"
    return None


def _fetch(url: str, part: Path, expected_size: Optional[int], timeout: float, progress: bool) -> None:
    """Append the missing bytes of ``url`` to ``part`` (a Range request when it already holds some)."""
    have = part.stat().st_size if part.exists() else 0
    if expected_size is not None and have > expected_size:
        part.unlink()  # longer than the real file: cannot be a prefix of it
        have = 0
    if expected_size is not None and have == expected_size:
        return  # all bytes are there (an earlier run stopped before verifying)
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return  # nothing past what we hold: let verification decide
        raise
    with resp:
        start = 0
        if have and resp.status == 206:
            # "bytes START-END/TOTAL": resume only where the server really starts
            content_range = resp.headers.get("Content-Range", "")
            start = int(content_range.split()[1].split("-")[0]) if content_range.startswith("bytes ") else -1
        if start != have:
            have = 0  # the server ignored Range (200) or answered another range: write from byte 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else expected_size
        with open(part, "ab" if have else "wb") as fh, tqdm(
                total=total, initial=have, unit="B", unit_scale=True, mininterval=1,
                desc=part.name[:-len(".part")], disable=not progress) as bar:
            got = 0
            while block := resp.read(CHUNK):
                fh.write(block)
                got += len(block)
                bar.update(len(block))
        if length is not None and got < int(length):
            raise _Truncated(f"connection closed after {have + got} of {total} bytes")


def download(url: str, dest_dir: str | os.PathLike, expected: Expected, retries: int = 3,
             retry_wait: float = 5.0, timeout: float = 60.0, progress: bool = True) -> Path:
    """DEST_DIR/NAME, fetched (resuming a partial NAME.part) and verified; raises DownloadError."""
    if retries < 1:
        raise ValueError(f"retries must be >= 1, got {retries}")
    name = Path(urllib.parse.urlparse(url).path).name
    if not name:
        raise DownloadError(f"{url}: the URL names no file")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest, part = dest_dir / name, dest_dir / f"{name}.part"
    if not expected.checksums():
        known = f"only its size ({expected.size} bytes) is checked" if expected.size is not None \
            else "NEITHER ITS SIZE NOR ITS CONTENT IS CHECKED"
        print(f"download.py: WARNING: no published checksum is known for {name}; {known}", file=sys.stderr)
    if dest.exists():
        problem = verify(dest, expected, progress)
        if problem is None:
            return dest
        print(f"download.py: existing {dest} is wrong ({problem}); fetching it again", file=sys.stderr)
        dest.unlink()
    problem = "no attempt made"
    for attempt in range(1, retries + 1):
        try:
            _fetch(url, part, expected.size, timeout, progress)
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRYABLE_HTTP:
                raise DownloadError(f"{name}: {url} answered HTTP {exc.code} {exc.reason}") from exc
            problem = f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            # the partial file is kept: the next attempt resumes it
            problem = f"transfer failed: {getattr(exc, 'reason', exc)}"
        else:
            problem = verify(part, expected, progress) or ""
            if not problem:
                part.replace(dest)
                if not expected.checksums():  # help the user complete the table
                    sha = file_digests(dest, ["sha256"], progress)["sha256"]
                    print(f"download.py: {name} sha256 {sha} (not checked against a published value)",
                          file=sys.stderr)
                return dest
            part.unlink()  # wrong bytes somewhere: resuming would keep them
        print(f"download.py: {name}: attempt {attempt}/{retries}: {problem}", file=sys.stderr)
        if attempt < retries and problem.startswith(("transfer", "HTTP")):
            time.sleep(retry_wait)
    raise DownloadError(f"{name}: still wrong after {retries} attempts from {url}: {problem}")


class _Progress:
    """A read-only file wrapper that advances a tqdm bar (for unpacking streamed archives)."""

    def __init__(self, fh: BinaryIO, bar: tqdm) -> None:
        self.fh, self.bar = fh, bar

    def read(self, n: int = -1) -> bytes:
        block = self.fh.read(n)
        self.bar.update(len(block))
        return block


def _check_member(member: tarfile.TarInfo, into: Path) -> None:
    """Refuse a member that would land outside ``into`` or is not a plain file, folder or inner link."""
    root = into.resolve()
    target = (root / member.name).resolve()
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise tarfile.TarError(f"{member.name}: not a regular file or folder")
    if root not in (target, *target.parents):
        raise tarfile.TarError(f"{member.name}: would be written outside {into}")
    if member.issym() or member.islnk():
        base = target.parent if member.issym() else root
        link = (base / member.linkname).resolve()
        if root not in (link, *link.parents):
            raise tarfile.TarError(f"{member.name}: links outside {into}")


def _unzip(archive: Path, into: Path, progress: bool) -> None:
    """Extract a zip archive into ``into``, refusing (before writing anything) a member that would leave it."""
    root = into.resolve()
    with zipfile.ZipFile(archive) as z:
        members = z.infolist()
        for m in members:
            target = (root / m.filename).resolve()
            if root not in (target, *target.parents):
                raise zipfile.BadZipFile(f"{m.filename}: would be written outside {into}")
        for m in tqdm(members, unit="file", mininterval=1, desc=f"unpacking {archive.name}", disable=not progress):
            z.extract(m, into)


def unpack(archive: Path, into: str | os.PathLike, progress: bool = True) -> None:
    """Extract a tar archive (any compression) or a zip archive into ``into``; members may not leave it."""
    Path(into).mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):  # OpenSLR 28's rirs_noises.zip
        try:
            _unzip(archive, Path(into), progress)
        except (zipfile.BadZipFile, OSError) as exc:
            raise DownloadError(f"{archive}: cannot unpack into {into}: {exc}") from exc
        return
    try:
        with open(archive, "rb") as raw, tqdm(total=archive.stat().st_size, unit="B", unit_scale=True, mininterval=1,
                                             desc=f"unpacking {archive.name}", disable=not progress) as bar:
            # stream mode: one sequential pass, no seeking back in multi-GB .tar.gz files
            with tarfile.open(fileobj=_Progress(raw, bar), mode="r|*") as tar:  # type: ignore[arg-type]
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(into, filter="data")  # "data": no absolute paths, no escaping links
                else:  # a Python without extraction filters (before 3.9.17/3.10.12/3.11.4): check by hand
                    for member in tar:
                        _check_member(member, Path(into))
                        tar.extract(member, into)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DownloadError(f"{archive}: cannot unpack into {into}: {exc}") from exc


def fetch_resource(url: str, dest_dir: str | os.PathLike, expected: Expected, unpack_to: Optional[str] = None,
                   marker: Optional[str] = None, remove_archive: bool = False, retries: int = 3,
                   retry_wait: float = 5.0, timeout: float = 60.0, progress: bool = True) -> Path:
    """Download + verify (+ unpack) once: returns the marker, written only when everything succeeded."""
    name = Path(urllib.parse.urlparse(url).path).name
    if marker is None:
        marker = os.path.join(unpack_to, f".{name}.complete") if unpack_to else os.path.join(dest_dir, f"{name}.complete")
    done = Path(marker)
    if done.exists():
        print(f"download.py: {name} already complete ({done})", file=sys.stderr)
        return done
    path = download(url, dest_dir, expected, retries, retry_wait, timeout, progress)
    if unpack_to is not None:
        unpack(path, unpack_to, progress)
        if not done.parent.is_dir():
            raise DownloadError(f"{path}: unpacking into {unpack_to} did not create {done.parent} (wrong archive?)")
        if remove_archive:
            path.unlink()
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(f"{url}\n", encoding="utf-8")
    return done


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="download.py", description=__doc__.split("\n")[0],
                                 epilog="See the module docstring for the checksum table format.")
    ap.add_argument("url")
    ap.add_argument("dest_dir", help="where the downloaded file is kept")
    ap.add_argument("--checksums", help="table of expected sizes and checksums (NAME must be listed)")
    ap.add_argument("--md5", help="expected MD5 (overrides the table)")
    ap.add_argument("--sha256", help="expected SHA-256 (overrides the table)")
    ap.add_argument("--size", type=int, help="expected size in bytes (overrides the table)")
    ap.add_argument("--unpack", metavar="DIR", help="unpack the verified tar or zip archive into DIR")
    ap.add_argument("--marker", help="file written once all is done; its presence skips everything")
    ap.add_argument("--remove-archive", action="store_true", help="delete the archive after unpacking it")
    ap.add_argument("--retries", type=int, default=3, help="attempts before giving up (default 3)")
    ap.add_argument("--retry-wait", type=float, default=5.0, help="seconds between attempts after a network error")
    ap.add_argument("--timeout", type=float, default=60.0, help="socket timeout in seconds")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.retries < 1:
        ap.error("--retries must be >= 1")
    if args.remove_archive and not args.unpack:
        ap.error("--remove-archive needs --unpack")
    name = Path(urllib.parse.urlparse(args.url).path).name
    expected = Expected()
    if args.checksums:
        try:
            table = read_checksum_table(args.checksums)
        except (OSError, ValueError) as exc:
            print(f"download.py: {exc}", file=sys.stderr)
            return 2
        if name not in table and not (args.md5 or args.sha256 or args.size is not None):
            print(f"download.py: {name} is not listed in {args.checksums}; add a line for it "
                  f"(with '-' for what is unknown) or pass --md5/--sha256/--size", file=sys.stderr)
            return 2
        expected = table.get(name, expected)
    expected = Expected(md5=(args.md5 or expected.md5 or "").lower() or None,
                        sha256=(args.sha256 or expected.sha256 or "").lower() or None,
                        size=args.size if args.size is not None else expected.size)
    try:
        done = fetch_resource(args.url, args.dest_dir, expected, args.unpack, args.marker, args.remove_archive,
                              args.retries, args.retry_wait, args.timeout, not args.quiet)
    except DownloadError as exc:
        print(f"download.py: {exc}", file=sys.stderr)
        return 1
    print(f"download.py: {name} done ({done})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
