"""Writing a file whole or not at all: every file asrkit writes goes through :func:`atomic_write`.

The data goes to ``<path>.tmp<pid>`` beside the target, which then replaces the target in one rename, so a
kill, a full disk or an exception never leaves a torn file under the target's name, and a failed write
never leaves the temporary file behind. The target's parent directories are created first (``asrkit
train-tokenizer ... data/lang/tokenizer.json`` works before ``data/lang`` exists).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, fsync: bool = False, **open_kw: Any) -> Iterator[IO]:
    """Open a temporary file for writing (``mode`` "w" or "wb"; text is UTF-8 unless ``encoding`` is given);
    on leaving the block without an error it replaces ``path``. An OSError without a file name (a write
    hitting a full disk) is re-raised naming ``path``. ``fsync``: flush to the disk before the rename (files
    a later run relies on, such as checkpoints)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if mode == "w":
        open_kw.setdefault("encoding", "utf-8")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **open_kw) as fh:
            yield fh
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, tmp) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise


def check_writable_dir(path: str | os.PathLike) -> None:
    """Create directory ``path`` (with its parents) and create and remove a file in it; raises the OSError that
    writing there would raise. For commands whose outputs come after their work: they refuse at the start."""
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".asrkit-write-check-", dir=path)
    os.close(fd)
    os.remove(probe)
