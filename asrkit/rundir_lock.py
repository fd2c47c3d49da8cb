"""One run per output directory: the lock ``asrkit train`` (on its experiment dir) and ``asrkit decode`` (on its
output dir) hold while they run, so that two runs into one directory cannot mix their files.

The lock is the file ``DIR/.asrkit.lock``, held with ``flock``: the kernel releases it when its process ends,
however it ends, so a lock file left behind by a killed run is stale and the next run reclaims it. The file
names its holder (pid, host, start time, command), and a run that finds the lock held is refused with a
message naming that holder. Of a run with several processes (DDP ranks) only one takes it, rank 0.

``flock`` is enforced between processes on one host, and across hosts on NFSv4 and the cluster file systems
that implement it; a shared file system without locks (old NFS) cannot refuse a second host's run.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import sys
import time
from types import TracebackType
from typing import Optional, Type

LOCK_FILE = ".asrkit.lock"

log = logging.getLogger("asrkit")


class RunDirBusy(ValueError):
    """The directory is held by another run; the message names that run and the lock file."""


def _holder() -> str:
    """Who holds a lock: this process, in one line."""
    program = os.path.basename(sys.argv[0]) if sys.argv else "python"
    if program == "__main__.py":  # python -m asrkit
        program = os.path.basename(os.path.dirname(sys.argv[0]))
    command = " ".join([program] + sys.argv[1:])
    command = command if len(command) <= 200 else command[:197] + "..."
    return (f"pid {os.getpid()} on host {socket.gethostname()} since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {command}")


def _read(fd: int) -> str:
    """The holder line of an open lock file, escaped and cut short (it is a file in a directory anyone may write)."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 400).decode("utf-8", "replace").strip()
    return repr(text)[1:-1][:300] if text else "a run that has not written its name yet"


class RunDirLock:
    """``with RunDirLock(directory):`` holds ``directory``'s lock (creating the directory) or raises
    :class:`RunDirBusy`; on leaving, the lock file is removed, and so is the directory if this lock created it
    and nothing was written there. ``enabled=False``: a no-op, for the ranks of a run other than rank 0."""

    def __init__(self, directory: str | os.PathLike, enabled: bool = True):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, LOCK_FILE)
        self.enabled = enabled
        self._fd: Optional[int] = None
        self._created = False

    def acquire(self) -> None:
        if not self.enabled:
            return
        self._created = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                self._remove_dir_if_created()
                raise RunDirBusy(f"{self.directory} is in use by another run ({holder}); wait for it to end or "
                                 f"use another directory (lock file {self.path})") from None
            except OSError as exc:  # a file system without locks: run, but say what is not guarded
                os.close(fd)
                os.remove(self.path)
                log.warning("%s: cannot lock %s (%s): a second run into this directory would not be refused",
                            self.directory, LOCK_FILE, exc.strerror)
                return
            # The holder before us removes the file before it lets go: if it did so after our open, we locked a
            # file no longer at the path, and must lock the one there now.
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        stale = os.fstat(fd).st_size > 0
        if stale:  # written by a run that ended without removing it (killed): its flock went with it
            log.info("%s: reclaimed the stale lock of %s", self.directory, _read(fd))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (_holder() + "\n").encode("utf-8"), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.remove(self.path)  # before closing: a run waiting on this file then sees it is gone and retries
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        self._remove_dir_if_created()

    def _remove_dir_if_created(self) -> None:
        if self._created:
            try:
                os.rmdir(self.directory)  # only if empty: a run refused before writing leaves no trace
            except OSError:
                pass

    def __enter__(self) -> "RunDirLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.release()
