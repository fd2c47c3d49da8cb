"""A file object whose writes fail as on a full disk, for the tests of one-line disk errors."""
from __future__ import annotations

import errno
import os


class FullDisk:
    """A file whose writes fail as on a full disk (the write raises ENOSPC without a file name)."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)
