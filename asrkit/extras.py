"""Optional dependencies: which pip extra installs each, and one error line naming it when it is missing.

The core install holds what transcription and training need; the commands that need more import it through
:func:`require`, so that a missing package reads ``asrkit export --format onnx needs onnx, which is not
installed: pip install -e '.[export]' (in the asrkit checkout)`` instead of a traceback. The package index
holds an unrelated ``asrkit``, so the hint installs from the checkout, never by name. setup.py's ``EXTRAS`` lists the same
extras (tests/test_packaging.py holds the two together).
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# top-level module -> the extra of setup.py that installs it
EXTRA_OF = {
    "onnx": "export",
    "onnxruntime": "export",
    "onnxscript": "export",
    "webdataset": "shards",
    "matplotlib": "plot",
    "scipy": "synth",
    "pyroomacoustics": "augment",
    "silero_vad": "vad",
    "starlette": "serve",
    "uvicorn": "serve",
    "websockets": "serve",
    "httpx": "serve",
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, purpose: str) -> ModuleType:
    """``module`` (e.g. ``"scipy.signal"``) imported, or :class:`MissingExtraError` when its package is not
    installed: '``purpose`` needs <package>, which is not installed: pip install -e '.[<extra>]' (in the asrkit checkout)'. A package
    that is installed but fails to import (a dependency of its own missing) raises as it is."""
    package = module.split(".")[0]
    extra = EXTRA_OF[package]  # a KeyError here is a programming error: every optional package has an extra
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != package:
            raise
        raise _missing(package, purpose) from None


def locate(package: str, purpose: str) -> str:
    """The directory of the installed ``package``, found without importing it (silero_vad's import sets torch's
    thread count), or :class:`MissingExtraError` as :func:`require` raises it."""
    try:
        spec = importlib.util.find_spec(package)
    except ValueError:  # sys.modules holds None for it: importing it fails, as where it is not installed
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise _missing(package, purpose)
    return list(spec.submodule_search_locations)[0]


def _missing(package: str, purpose: str) -> MissingExtraError:
    return MissingExtraError(f"{purpose} needs {package}, which is not installed: "
                             f"pip install -e '.[{EXTRA_OF[package]}]' (in the asrkit checkout)")
