"""asrkit.search.native_build: the cache location, the cache key (an independent sha256 of the sources and
the command), the compiler command, errors that name their cause, and loading with its ABI check.

A fake compiler (a shell script that logs its arguments and writes its -o file) stands in for g++ where the
command itself is under test; the ABI check compiles a two-line library with the real compiler.
"""
from __future__ import annotations

import ctypes
import hashlib
import inspect
import re
import shutil
from pathlib import Path

import pytest

from asrkit.search import native_build

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")



def fake_compiler(where: Path, name: str = "fake-cxx") -> Path:
    """A 'compiler' that appends its arguments to <name>.log and writes 'built' to the file after -o."""
    script = where / name
    script.write_text('#!/bin/sh\necho "$@" >> "$0.log"\nout=""\nprev=""\nfor a in "$@"; do\n'
                      '  [ "$prev" = "-o" ] && out="$a"\n  prev="$a"\ndone\necho built > "$out"\n')
    script.chmod(0o755)
    return script


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASRKIT_NATIVE_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert native_build.cache_dir() == tmp_path / "a"
    monkeypatch.setenv("ASRKIT_NATIVE_CACHE", "")  # empty: not set
    assert native_build.cache_dir() == tmp_path / "x" / "asrkit"
    monkeypatch.delenv("ASRKIT_NATIVE_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert native_build.cache_dir() == tmp_path / "home" / ".cache" / "asrkit"


def expected_name(source: Path, compiler: str) -> str:
    """The cache file name by the documented rule: sha256 of the source, then each header (sorted by name)
    as name NUL contents, then the command joined by NULs; 16 hex digits."""
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    digest.update("\0".join([compiler, *native_build.FLAGS]).encode())
    return f"prefix_search-{digest.hexdigest()[:16]}.so"


def test_library_path_is_keyed_by_source_headers_and_compiler(fresh_native_cache, monkeypatch, tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for f in [native_build.SOURCE, *native_build.SOURCE.parent.glob("*.h")]:
        shutil.copy(f, src / f.name)
    monkeypatch.setattr(native_build, "SOURCE", src / native_build.SOURCE.name)
    first = native_build.library_path()
    assert first == fresh_native_cache / expected_name(native_build.SOURCE, "g++")
    assert native_build.library_path("clang++") == fresh_native_cache / expected_name(native_build.SOURCE, "clang++")
    monkeypatch.setenv("CXX", "clang++")
    assert native_build.library_path() == native_build.library_path("clang++") != first
    monkeypatch.delenv("CXX")
    names = set()
    for change in ("edit", "rename", "add"):  # every header's contents and name count
        if change == "edit":
            (src / "scorers.h").write_text((src / "scorers.h").read_text() + "\n// changed\n")
        elif change == "rename":
            (src / "scorers.h").rename(src / "scorers2.h")
        else:
            (src / "extra.h").write_text("// new\n")
        path = native_build.library_path()
        assert path == fresh_native_cache / expected_name(native_build.SOURCE, "g++")
        names.add(path.name)
    assert len(names) == 3 and first.name not in names


def test_build_runs_the_documented_command_once_into_the_cache(fresh_native_cache, monkeypatch, tmp_path) -> None:
    cxx = fake_compiler(tmp_path)
    monkeypatch.setenv("CXX", str(cxx))
    target = native_build.build()
    assert target == native_build.library_path(str(cxx)) and target.read_text() == "built\n"
    args = (tmp_path / "fake-cxx.log").read_text().split()
    assert args[:len(native_build.FLAGS) + 2] == [*native_build.FLAGS, str(native_build.SOURCE), "-o"]
    tmp = Path(args[-1])
    assert len(args) == len(native_build.FLAGS) + 3
    assert tmp.parent == fresh_native_cache and tmp.name.startswith(target.stem + ".") and tmp.name.endswith(".tmp")
    assert sorted(p.name for p in fresh_native_cache.iterdir()) == [target.name]  # renamed into place, nothing left over
    assert native_build.build() == target  # cached: not run again
    assert len((tmp_path / "fake-cxx.log").read_text().splitlines()) == 1
    other = fake_compiler(tmp_path, "other-cxx")
    assert native_build.build(str(other)) != target  # an explicit compiler beats $CXX
    assert (tmp_path / "other-cxx.log").exists()


def test_cache_dir_is_created_with_its_parents(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ASRKIT_NATIVE_CACHE", str(tmp_path / "deep" / "er" / "cache"))
    path = native_build.build(str(fake_compiler(tmp_path)))
    assert path.parent == tmp_path / "deep" / "er" / "cache" and path.exists()


def test_missing_compiler_is_named(fresh_native_cache) -> None:
    with pytest.raises(RuntimeError) as err:
        native_build.build("no-such-cxx-xyz")
    assert str(err.value) == "no C++ compiler: 'no-such-cxx-xyz' is not on PATH (set $CXX to use another)"


def test_a_failing_build_reports_the_end_of_its_messages(fresh_native_cache, tmp_path) -> None:
    bad = tmp_path / "bad-cxx"
    bad.write_text("#!/bin/sh\nprintf 'HEAD%.0s' $(seq 600) >&2\nprintf 'x%.0s' $(seq 1985) >&2\n"
                   "echo ' TAIL-error ' >&2\nexit 7\n")
    bad.chmod(0o755)
    with pytest.raises(RuntimeError) as err:
        native_build.build(str(bad))
    msg = str(err.value)
    assert msg.startswith(f"{bad} failed on prefix_search.cpp (exit 7): ")
    assert msg.endswith("TAIL-error")  # stripped
    assert "HEAD" in msg and "HEADHEAD" not in msg  # only the last 2000 characters: one whole HEAD
    assert len(msg) - len(f"{bad} failed on prefix_search.cpp (exit 7): ") == 2000
    assert not any(fresh_native_cache.iterdir())


@needs_compiler
def test_a_library_of_another_abi_is_refused_once_then_retried_after_reset(fresh_native_cache, monkeypatch, tmp_path) -> None:
    src = tmp_path / "old.cpp"
    src.write_text('#include <cstdint>\nextern "C" int64_t asrkit_native_abi() { return 3; }\n')
    monkeypatch.setattr(native_build, "SOURCE", src)
    with pytest.warns(RuntimeWarning, match=rf"native CTC prefix search is unavailable \(library ABI 3 != "
                                            rf"{native_build.ABI}\); "
                                            r"using the torch loop"):
        assert native_build.load() is None
    assert native_build.build_error() == f"library ABI 3 != {native_build.ABI}"
    with _no_warning():
        assert native_build.load() is None  # tried once: no second build, no second warning
    native_build.reset()
    assert native_build.build_error() is None
    stubs = "".join(f'extern "C" void* {name}(...) {{ return 0; }}\n' for name in native_build.SIGNATURES
                    if name != "asrkit_prefix_search")
    src.write_text(f'#include <cstdint>\nextern "C" int64_t asrkit_native_abi() {{ return {native_build.ABI}; }}\n'
                   'extern "C" int64_t asrkit_prefix_search(void*) { return 5; }\n' + stubs)
    lib = native_build.load()
    assert lib is not None and native_build.build_error() is None and native_build.load() is lib
    assert lib.asrkit_native_abi() == native_build.ABI
    assert lib.asrkit_prefix_search.restype is ctypes.c_int64
    assert lib.asrkit_prefix_search.argtypes == [ctypes.c_void_p]
    assert lib.asrkit_prefix_search(None) == 5


@needs_compiler
def test_a_library_without_a_function_of_the_api_is_refused(fresh_native_cache, monkeypatch, tmp_path) -> None:
    src = tmp_path / "partial.cpp"
    src.write_text(f'#include <cstdint>\nextern "C" int64_t asrkit_native_abi() {{ return {native_build.ABI}; }}\n'
                   'extern "C" int64_t asrkit_prefix_search(void*) { return 5; }\n')
    monkeypatch.setattr(native_build, "SOURCE", src)
    with pytest.warns(RuntimeWarning, match=r"unavailable \(the library has no function asrkit_stream_create\)"):
        assert native_build.load() is None


@needs_compiler
def test_abi_above_32_bits_is_read_whole(fresh_native_cache, monkeypatch, tmp_path) -> None:
    # asrkit_native_abi returns int64: a library answering 2**32 + ABI must not pass for the ABI.
    src = tmp_path / "wide.cpp"
    wide = 2 ** 32 + native_build.ABI
    src.write_text(f'#include <cstdint>\nextern "C" int64_t asrkit_native_abi() {{ return {wide}LL; }}\n')
    monkeypatch.setattr(native_build, "SOURCE", src)
    with pytest.warns(RuntimeWarning, match=f"library ABI {wide} != {native_build.ABI}"):
        assert native_build.load() is None


def test_a_library_that_cannot_be_loaded_falls_back_with_its_reason(fresh_native_cache, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path)))  # writes a text file: dlopen fails (OSError)
    with pytest.warns(RuntimeWarning, match="native CTC prefix search is unavailable"):
        assert native_build.load() is None
    assert native_build.build_error() and "prefix_search-" in native_build.build_error()


class _no_warning:
    """Fail if a warning is raised inside the block."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings(record=True)
        self._seen = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        assert not self._seen, [str(w.message) for w in self._seen]


def test_the_python_side_expects_the_abi_the_source_declares() -> None:
    # Bumped together with the C structs (a new scorer kind): a mismatch would turn the native loop off.
    source = native_build.SOURCE.read_text(encoding="utf-8")
    assert f'extern "C" int64_t asrkit_native_abi(void) {{ return {native_build.ABI}; }}' in source


def test_every_function_of_the_native_api_has_a_caller_in_asrkit() -> None:
    # An entry point only tests call is dead weight in two languages (asrkit_stream_blank_run was one): api.h
    # declares what ctypes is told of, and every public function of native_loop is called from another module.
    from asrkit.search import native_loop

    header = (native_build.SOURCE.parent / "api.h").read_text(encoding="utf-8")
    assert set(re.findall(r"\b(asrkit_\w+)\(", header)) == set(native_build.SIGNATURES) | {"asrkit_native_abi"}
    loop = Path(native_loop.__file__)
    for name in native_build.SIGNATURES:
        assert re.search(rf"\.{name}\b", loop.read_text(encoding="utf-8")), name
    others = "".join(p.read_text(encoding="utf-8") for p in loop.parents[1].rglob("*.py") if p != loop)
    public = [name for name, fn in vars(native_loop).items() if inspect.isfunction(fn) and not name.startswith("_")
              and fn.__module__ == native_loop.__name__]
    test_hooks = {"live_streams"}  # the leak check's reading of the library's count
    assert "stream_advance" in public
    assert [name for name in public if f"native_loop.{name}(" not in others and name not in test_hooks] == []
