"""Imports go one way (ARCHITECTURE.md): cli -> pipeline, train, score -> models, lm, data -> nets, audio, text
-> checkpoint, config -> atomic; and code asks whether a model has a part, never probes it with hasattr."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "asrkit"
LEVEL = {"atomic": -1, "rundir_lock": -1, "config": 0, "checkpoint": 0, "text": 1, "audio": 1, "nets": 1,
         "data": 2, "models": 2, "lm": 2,
         "pipeline": 3, "train": 3, "score": 3, "cli": 4, "__init__": 5, "__main__": 5,
         "extras": -1}  # extras.py (optional packages) imports nothing of asrkit: any module may import it


def _package(module_path: pathlib.Path) -> str:
    rel = module_path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _asrkit_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "asrkit" and len(parts) > 1:
                yield node.lineno, parts[1]


MODULES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
    src = _package(path)
    for lineno, dst in _asrkit_imports(path):
        if dst == src:
            continue
        where = f"{path.relative_to(ROOT.parent)}:{lineno} imports asrkit.{dst}"
        if src == "search":
            pytest.fail(f"{where}: search/ imports torch only")
        if src == "nets":
            pytest.fail(f"{where}: nets/ imports torch only")
        assert dst != "search" or LEVEL[src] >= 3, f"{where}: only pipeline/cli may drive search/"
        if dst == "search":
            continue
        assert LEVEL[dst] < LEVEL[src], f"{where}: against the import direction"


def test_walker_sees_the_package():
    assert len(MODULES) > 20


@pytest.mark.parametrize("package", ["pipeline", "train", "models"])
def test_no_capability_probing(package):
    """A model's abilities are its parts (``model.ctc is not None``), never hasattr/getattr on a model."""
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr",
                                                                                                   "getattr"):
                pytest.fail(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.func.id}() probes an object")
