"""A guard for the tests that prove a search or scorer never synchronises with the host."""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional

import pytest
import torch

# Every Tensor method that reads a value back to Python (and so waits for a GPU).
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def no_host_sync(fn: Callable[..., Any], ran: Optional[List[str]] = None) -> Callable[..., Any]:
    """``fn`` wrapped so that any of :data:`SYNC_METHODS` raises while it runs; each completed call
    appends ``fn.__name__`` to ``ran`` (so a test can check the guard was reached)."""
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"host sync inside {fn.__name__}")

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with pytest.MonkeyPatch.context() as mp:
            for name in SYNC_METHODS:
                mp.setattr(torch.Tensor, name, forbidden)
            out = fn(*args, **kwargs)
        if ran is not None:
            ran.append(fn.__name__)
        return out

    return guarded
