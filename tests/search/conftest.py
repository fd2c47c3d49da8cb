"""Fixtures shared by the native-search test files."""
from __future__ import annotations

from pathlib import Path

import pytest

from asrkit.search import native_build


@pytest.fixture
def fresh_native_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """An empty native-library cache, no $CXX, nothing loaded; the real state comes back afterwards."""
    monkeypatch.setenv("ASRKIT_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    native_build.reset()
    yield tmp_path / "cache"
    native_build.reset()
