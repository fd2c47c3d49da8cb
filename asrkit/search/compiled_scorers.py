"""Scorers whose per-step calls run through ``torch.compile`` (the captured loop's default on CUDA).

Inside the captured loop of :mod:`asrkit.search.prefix_graph` each frame step runs the fused CTC kernel plus the
scorers' torch ops: with a word 3-gram about 67 kernels a step, each a few microseconds on a GPU. Compiled by
inductor, a scorer's ``score`` and ``select_state`` (gathers, adds, a searchsorted) become a few fused Triton
kernels, which the CUDA graph then replays (on an H200, word 3-gram at batch 32: 29.1 -> 16.2 ms a batch).
``ASRKIT_COMPILE_SCORERS=0`` turns it off (:func:`env_switch`, ``prefix_graph.COMPILE_SCORERS``).

How the compilations stay few, whatever a decode's batches:

- **The row axis is dynamic.** A step's tensors are (N, ...) with N = batch * beam rows, and N changes with every
  batch size and beam. Each call marks dim 0 of the state's tensors, the tokens and the selected rows
  ``maybe_mark_dynamic``, so the first compile is already symbolic in N and serves every batch size (with
  ``dynamic=False`` each new N compiled again, seconds each). Padding rows to a few size classes was the other
  way; it would need padded rows in every scorer state and the captured loop's tables, for compiles that dynamic
  rows avoid at no cost: the kernels are gathers and elementwise ops, as fast with N as a runtime argument.
  ``maybe_`` because dynamo specializes sizes 0 and 1 (a batch of one with beam one): such a size compiles once
  more instead of raising. The candidates per frame (C) and the tables' sizes stay static until they change;
  then dynamo's automatic dynamic shapes recompile once with them symbolic.
- **What is compiled is the class function** (``type(scorer).score``), one per class for the process, not a
  bound method, so every object of a class shares its compiled code: dynamo guards on the object's attributes
  (tensor shapes, Python ints such as the vocabulary size), so a second object with other constants recompiles
  once, and objects alike reuse it.
- **A bound on compilations, then eager.** Each class function counts the graphs compiled for it (its own
  backend, inductor underneath); past :data:`MAX_COMPILES` its calls run under ``torch.compiler.set_stance(
  "eager_on_recompile")``: code compiled already still runs, a new shape runs eagerly. A compilation that fails
  (no C++ compiler or Triton, an op inductor cannot lower) turns that function eager for the process. Either way
  one warning says so, and the decode goes on with the same results: never an exception mid-decode from
  compiling.
- **Never inside a CUDA graph capture.** prefix_graph runs the loop once eagerly (which compiles) before it
  captures it; during a capture the calls run under ``eager_on_recompile`` too, so a guard that failed there would
  record the eager ops rather than compile.

Which scorers compile (:func:`compilable`): those whose steps are lookups in fixed tables, the ones the native
CPU loop evaluates from their tables (:class:`~asrkit.search.interfaces.NativeScorer`): the token n-gram (dense
and lookup), the word n-gram (with look-ahead and lexicon), the lexicon, the word count and hotwords. Others stay
eager: a neural LM's step is an LSTM (dynamo breaks the graph at ``nn.LSTM``) or a Transformer whose key/value
cache grows a slot per token (a new shape every step), and its time is in matmuls that compiling does not shrink;
its ``score`` is one gather. Measured on the CPU (2026-11-28, N = 80 rows): the 2 x 512 LSTM LM's
``select_state`` compiled into 3 graphs around the LSTM and ran no faster than eager; the Transformer LM's spent
the 4 compilations in its first steps. :class:`~asrkit.search.scorers.LengthBonus` is one comparison, and a
scorer of unknown kind may hold anything.
``init_state`` and ``final_score`` run once a batch and stay eager.
"""
from __future__ import annotations

import functools
import logging
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from torch.utils._pytree import tree_leaves

from asrkit.search.interfaces import BatchScorer, NativeScorer

log = logging.getLogger(__name__)

# Graphs compiled per scorer class function before new shapes run eagerly: one for dynamic rows, one more for
# each of the few things that can change (a batch of one, the candidates per frame, a second LM's table sizes).
MAX_COMPILES = 4
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def env_switch(value: Optional[str], name: str = "ASRKIT_COMPILE_SCORERS") -> bool:
    """An on/off environment variable: unset or empty is on (the default); 1/true/on/yes or 0/false/off/no
    (any case); anything else is an error naming the variable."""
    if value is None or not value.strip():
        return True
    v = value.strip().lower()
    if v in _TRUE + _FALSE:
        return v in _TRUE
    raise ValueError(f"{name}={value!r}: expected 0 or 1 (or false/true, off/on, no/yes)")


def compilable(scorer: BatchScorer) -> bool:
    """Whether compiling ``scorer``'s steps pays: table lookups (see the module docstring)."""
    return isinstance(scorer, NativeScorer)


class CompiledFunction:
    """One scorer class function through ``torch.compile`` with its row axis dynamic, at most
    :data:`MAX_COMPILES` graphs, then eager for what those do not cover (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiles = 0  # graphs compiled for fn (by this object's backend)
        self.eager_reason = ""  # why fn now always runs eagerly ('' while it compiles)
        self._warned = False
        self._compiled = torch.compile(fn, backend=self._backend, fullgraph=False, dynamic=None)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]) -> Callable[..., Any]:
        self.compiles += 1
        return torch._dynamo.lookup_backend("inductor")(gm, example_inputs)

    def _warn(self, what: str) -> None:
        """One warning per function, for the first reason it runs eagerly."""
        if not self._warned:
            self._warned = True
            log.warning("compiled scorers: %s %s (the same results, without the compiled speed)",
                        self.fn.__qualname__, what)

    def __call__(self, scorer: BatchScorer, state: Any, *rows: torch.Tensor) -> Any:
        """``fn(scorer, state, *rows)``: every tensor argument's dim 0 is the hypotheses' rows."""
        if self.eager_reason:
            return self.fn(scorer, state, *rows)
        # dynamo guards on strides too: the tokens of a batch of one are an expanded view (row stride 0), a copy
        # otherwise; contiguous rows (a no-op but for that view) keep one compile for both
        rows = tuple(r.contiguous() for r in rows)
        for t in tree_leaves((state, rows)):
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        spent = self.compiles >= MAX_COMPILES
        if spent:
            self._warn(f"has {self.compiles} graphs compiled, the most allowed (MAX_COMPILES): from now on a "
                       f"shape not compiled yet runs eagerly")
        # no stance set otherwise: the caller's (torch.compiler.set_stance("force_eager"), say) holds
        stance = torch.compiler.set_stance("eager_on_recompile") if spent or _capturing() else nullcontext()
        try:
            with stance:
                return self._compiled(scorer, state, *rows)
        except Exception as exc:  # compiling failed (no compiler, an op inductor cannot lower): eager from now on
            # dynamo wraps the backend's error (inductor's): name that error itself
            root = exc.inner_exception if isinstance(exc, torch._dynamo.exc.BackendCompilerFailed) else exc
            self.eager_reason = f"{type(root).__name__}: {(str(root).splitlines() or [''])[0]}"
            self._warn(f"could not be compiled ({self.eager_reason}): it runs eagerly from now on")
            return self.fn(scorer, state, *rows)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=None)
def compiled(fn: Callable[..., Any]) -> CompiledFunction:
    """The one :class:`CompiledFunction` of a class function (dynamo keys its cache by code object anyway)."""
    return CompiledFunction(fn)


class CompiledScorer:
    """``scorer`` with its per-step calls (``score``, ``select_state``) compiled; the same scores and states."""

    def __init__(self, scorer: BatchScorer) -> None:
        self.scorer = scorer
        self._score = compiled(type(scorer).score)
        self._select = compiled(type(scorer).select_state)

    def init_state(self, batch: int, beam: int, device: torch.device) -> Any:
        return self.scorer.init_state(batch, beam, device)

    def score(self, state: Any, tokens: torch.Tensor) -> torch.Tensor:
        return self._score(self.scorer, state, tokens)

    def select_state(self, state: Any, index: torch.Tensor, tokens: torch.Tensor) -> Any:
        return self._select(self.scorer, state, index, tokens)

    def final_score(self, state: Any) -> torch.Tensor:
        return self.scorer.final_score(state)


def compile_scorers(scorers: Mapping[str, BatchScorer]) -> Dict[str, BatchScorer]:
    """The scorers (same names, same order), those that pay (:func:`compilable`) wrapped in a
    :class:`CompiledScorer`, the others as they are."""
    return {name: CompiledScorer(sc) if compilable(sc) else sc for name, sc in scorers.items()}
