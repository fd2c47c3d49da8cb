"""Scorers whose per-step calls run through ``torch.compile`` (an experiment of the GPU path, off by default).

Inside the captured loop of :mod:`asrkit.search.prefix_graph` each frame step runs the fused CTC kernel plus the
scorers' torch ops: with a word 3-gram about 67 kernels a step, each a few microseconds on a GPU. Compiled by
inductor, a scorer's ``score`` and ``select_state`` (gathers, adds, a searchsorted) become a few fused Triton
kernels, which the CUDA graph then replays. ``ASRKIT_COMPILE_SCORERS=1`` turns it on (``prefix_graph.COMPILE_SCORERS``).

What is compiled is the scorer's class function (``type(scorer).score``), not a bound method, so that every object
of a class shares one compiled function: dynamo guards on the object's tensors' shapes and on its Python
attributes, and recompiles only for a new shape (``dynamic=False``). Compiling is slow and must never happen inside
a CUDA graph capture: prefix_graph runs the loop once eagerly before it captures it.
``init_state`` and ``final_score`` run once a batch and stay eager.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Mapping

import torch

from asrkit.search.interfaces import BatchScorer


@functools.lru_cache(maxsize=None)
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One compiled function per class function (dynamo keys its cache by code object anyway)."""
    return torch.compile(fn, fullgraph=False, dynamic=False)


class CompiledScorer:
    """``scorer`` with its per-step calls (``score``, ``select_state``) compiled; the same scores and states."""

    def __init__(self, scorer: BatchScorer) -> None:
        self.scorer = scorer
        self._score = _compiled(type(scorer).score)
        self._select = _compiled(type(scorer).select_state)

    def init_state(self, batch: int, beam: int, device: torch.device) -> Any:
        return self.scorer.init_state(batch, beam, device)

    def score(self, state: Any, tokens: torch.Tensor) -> torch.Tensor:
        return self._score(self.scorer, state, tokens)

    def select_state(self, state: Any, index: torch.Tensor, tokens: torch.Tensor) -> Any:
        return self._select(self.scorer, state, index, tokens)

    def final_score(self, state: Any) -> torch.Tensor:
        return self.scorer.final_score(state)


def compile_scorers(scorers: Mapping[str, BatchScorer]) -> Dict[str, BatchScorer]:
    """Each scorer wrapped in a :class:`CompiledScorer` (same names, same order)."""
    return {name: CompiledScorer(sc) for name, sc in scorers.items()}
