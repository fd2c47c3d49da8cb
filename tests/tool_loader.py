"""Import a ``tools/`` script (the scripts are not a package) as a module the tests can call."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    """``tools/<name>.py`` (``name`` may hold a folder: ``bench/bench_decode``) executed as the module named
    by its file name, registered in ``sys.modules`` first (dataclasses and pickling look a class's module up
    there, and the scripts of one folder import each other by that name)."""
    path = TOOLS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no tool script {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
