"""Build and load the native (C++) CTC prefix search library, once per source version.

The source, ``asrkit/search/native/prefix_search.cpp`` with its headers, is plain C++ with an ``extern "C"`` API (no torch
headers), so it compiles in about 2 s: on first use it is built with ``g++ -O3 -march=x86-64-v2 -shared
-fPIC`` (a baseline every x86-64 CPU of the last decade runs; not ``-march=native``, so a cache shared
between machines stays valid) into a cache directory, under a name keyed by the hash of the source and the
command, and loaded with :mod:`ctypes`. ``make install`` builds it ahead (``from
asrkit.search import native_build; native_build.build()``) so that tests do not pay for it.

Cache directory: ``$ASRKIT_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/asrkit``, else ``~/.cache/asrkit``.
Parallel processes do not race: each compiles to its own temporary file and renames it into place
(atomic on POSIX), so a reader sees no library or a whole one. No compiler, or a failed build: one
warning, and :func:`load` returns None (the search then runs its torch loop); :func:`build_error` says why.
Compiler: ``$CXX``, else :data:`COMPILER`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional

SOURCE = Path(__file__).resolve().parent / "native" / "prefix_search.cpp"
COMPILER = "g++"
FLAGS = ("-O3", "-march=x86-64-v2", "-std=c++17", "-shared", "-fPIC", "-pthread")
ABI = 10  # asrkit_native_abi() of a library this module can drive (bump with the C structs)

_lib: Optional[ctypes.CDLL] = None
_error: Optional[str] = None
_tried = False


def cache_dir() -> Path:
    """Where built libraries are kept (see the module docstring)."""
    given = os.environ.get("ASRKIT_NATIVE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "asrkit"


def _command(compiler: str) -> List[str]:
    return [compiler, *FLAGS]


def library_path(compiler: Optional[str] = None) -> Path:
    """The cache file of the current source (and the headers beside it) built with ``compiler`` (it may not
    exist yet)."""
    compiler = compiler or os.environ.get("CXX") or COMPILER
    digest = hashlib.sha256(SOURCE.read_bytes())
    for header in sorted(SOURCE.parent.glob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    digest.update("\0".join(_command(compiler)).encode())
    return cache_dir() / f"prefix_search-{digest.hexdigest()[:16]}.so"


def build(compiler: Optional[str] = None) -> Path:
    """Compile the library into the cache unless it is there; returns its path. Raises RuntimeError
    naming the compiler and its messages when the build fails."""
    compiler = compiler or os.environ.get("CXX") or COMPILER
    target = library_path(compiler)
    if target.exists():
        return target
    exe = shutil.which(compiler)
    if exe is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (set $CXX to use another)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([exe, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {SOURCE.name} (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent loader sees the old name absent or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
# The functions of native/api.h besides asrkit_native_abi: name -> (return type, argument types); declared so
# that ctypes passes and returns 64-bit values (its default is a C int).
SIGNATURES = {
    "asrkit_prefix_search": (_I64, [_PTR]),
    "asrkit_stream_create": (_PTR, [_PTR]),
    "asrkit_stream_free": (_I64, [_PTR]),
    "asrkit_stream_live": (_I64, []),
    "asrkit_stream_frames": (_I64, [_PTR]),
    "asrkit_stream_width": (_I64, [_PTR, _I64]),
    "asrkit_stream_advance": (_I64, [_PTR]),
    "asrkit_stream_nbest": (_I64, [_PTR]),
}


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise RuntimeError(f"the library has no function {name}") from None
        fn.restype, fn.argtypes = restype, argtypes


def load() -> Optional[ctypes.CDLL]:
    """The loaded library, building it on the first call; None (after one warning) if that fails."""
    global _lib, _error, _tried
    if _tried:
        return _lib
    _tried = True
    try:
        lib = ctypes.CDLL(str(build()))
        lib.asrkit_native_abi.restype = ctypes.c_int64
        if lib.asrkit_native_abi() != ABI:
            raise RuntimeError(f"library ABI {lib.asrkit_native_abi()} != {ABI}")
        _declare(lib)
        _lib = lib
    except (OSError, RuntimeError) as exc:
        _error = str(exc)
        warnings.warn(f"asrkit: the native CTC prefix search is unavailable ({_error}); "
                      f"using the torch loop", RuntimeWarning, stacklevel=3)
    return _lib


def build_error() -> Optional[str]:
    """Why :func:`load` returned None (None if it has not failed)."""
    return _error


def reset() -> None:
    """Forget the loaded library and any failure, so the next :func:`load` tries again (tests)."""
    global _lib, _error, _tried
    _lib, _error, _tried = None, None, False


if __name__ == "__main__":  # build ahead of the first search, print the library's path
    print(build())
