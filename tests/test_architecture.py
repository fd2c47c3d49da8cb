"""Imports go one way (ARCHITECTURE.md): cli -> serve -> pipeline, train, score -> models, lm, data -> nets, audio,
text -> checkpoint, config -> atomic; and code asks whether a model has a part, never probes it with hasattr."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "asrkit"
LEVEL = {"atomic": -1, "rundir_lock": -1, "config": 0, "checkpoint": 0, "text": 1, "audio": 1, "nets": 1,
         "data": 2, "models": 2, "lm": 2,
         "pipeline": 3, "train": 3, "score": 3, "serve": 3.5, "cli": 4, "__init__": 5, "__main__": 5,
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


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """asrkit/pipeline/export.py -> asrkit.pipeline.export; a package's __init__.py -> the package."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = ROOT) -> dict:
    """module -> the asrkit modules it imports anywhere in its source (module level, inside functions and under
    TYPE_CHECKING alike: each is a dependency, and a circle of them is one concept split over two files).
    ``from asrkit.x import name`` counts as importing asrkit.x.name when that is a module, else asrkit.x. Imports
    of one's own ancestor packages and a package's imports of its own children are not edges: Python runs a
    package's __init__ before its children, whatever they import."""
    modules = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in found:
                while target and target not in modules:  # asrkit.pipeline.export.load_exported -> the module
                    target = target.rpartition(".")[0]
                if not target or target == name or name.startswith(target + "."):
                    continue  # not asrkit's, itself, or an ancestor package
                if path.name == "__init__.py" and target.startswith(name + "."):
                    continue  # a package importing its own children
                targets.add(target)
        graph[name] = targets
    return graph


def import_cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted; [] when imports form no
    circle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_two_modules_import_each_other():
    """No circle of imports between modules (ARCHITECTURE.md: no two modules import each other), however indirect."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_circles(tmp_path):
    """The check above can fail: direct, indirect, function-level and TYPE_CHECKING circles are found; a package
    importing its children and a child importing its package are not circles."""
    pkg = tmp_path / "asrkit"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "def f():\n    from asrkit.sub import a\n",
             "sub/__init__.py": "from asrkit.sub.a import x\n",
             "sub/a.py": "from asrkit import __version__\nfrom asrkit.sub import b\nx = 1\n",
             "sub/b.py": "def g():\n    from asrkit.sub.c import y\n",
             "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from asrkit.sub.a import x\n",
             "d.py": "import asrkit.e\n", "e.py": "from . import d\n", "f.py": "from asrkit.sub import a\n"}
    for name, text in files.items():
        (pkg / name).write_text(text, encoding="utf-8")
    graph = import_graph(pkg)
    assert graph["asrkit.sub.b"] == {"asrkit.sub.c"} and graph["asrkit.e"] == {"asrkit.d"}
    assert graph["asrkit.f"] == {"asrkit.sub.a"}  # from a package import a module: that module
    assert import_cycles(graph) == [["asrkit.d", "asrkit.e"], ["asrkit.sub.a", "asrkit.sub.b", "asrkit.sub.c"]]


def test_no_other_yaml_parser_in_the_package_or_its_tools():
    """YAML is parsed by asrkit.config.read_yaml alone: catches a new ``yaml.safe_load`` of a user's file (aliases
    and whole values in errors again)."""
    repo = ROOT.parent
    # tools/mutation.py reads the project's own tools/mutation/modules.yaml, and must not import the asrkit modules
    # it mutates; apply_overrides parses a --set value with the same loader.
    allowed = {"asrkit/config.py": {"_StrictLoader"}, "tools/mutation.py": {"safe_load"}}
    parsers = {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "full_load_all",
               "unsafe_load_all", "compose", "compose_all", "parse"}
    found = []
    for path in sorted([*repo.glob("asrkit/**/*.py"), *repo.glob("tools/**/*.py"), *repo.glob("recipes/**/*.py")]):
        rel = path.relative_to(repo).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in parsers
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "yaml"):
                loader = next((kw.value.id for kw in node.keywords if kw.arg == "Loader"
                               and isinstance(kw.value, ast.Name)), node.func.attr)
                if loader not in allowed.get(rel, ()):
                    found.append(f"{rel}:{node.lineno}: yaml.{node.func.attr}")
    assert not found, "parse YAML with asrkit.config.read_yaml: " + ", ".join(found)



def test_test_files_have_unique_names():
    """pytest imports test modules by their file name (tests/ is not a package): two test files of one name in two
    folders stop the whole run at collection, which running either file alone does not show."""
    names: dict = {}
    for path in sorted((ROOT.parent / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT.parent)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}
