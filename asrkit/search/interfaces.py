"""Scorer protocol shared by every batched search (structural typing, no inheritance).

A search over B utterances with beam K works on N = B*K flat hypotheses, row n = b*K + k.
Token id 0 is the CTC blank and is never scored by an LM (a scorer returns 0 for it);
``unk_id = 1`` and ``sos_eos_id = 2``. Nothing here may synchronise with the host
(no ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(tensor)`` or Python ``if`` on tensor
values), so a search can call scorers inside its per-frame loop.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Protocol, Tuple, runtime_checkable

import torch

BLANK_ID = 0
UNK_ID = 1
SOS_EOS_ID = 2
LENGTH_BONUS = "length_bonus"  # a weight of this name without a scorer adds a constant per emitted token
# Prefix hashes of the CTC prefix search (the torch loop, its fused kernel and native/api.h): hash(p + c) =
# c + hash(p) * HASH_MUL mod 2**64.
HASH_MUL = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64; odd, so the hash mixes all bits
SENT_HASH = -0x3C6EF372FE94F82B  # hash of an impossible hypothesis: never equals a parent hash
SENT_PARENT = 0x5BE0CD19137E2179  # parent hash of the empty prefix and of impossible hypotheses


@runtime_checkable
class BatchScorer(Protocol):
    """A partial scorer fused into a search through a weights dict.

    The search adds ``weights[name] * score`` to a hypothesis each time it appends a token, and
    ``weights[name] * final_score`` when the hypothesis ends.
    """

    def init_state(self, batch: int, beam: int, device: torch.device) -> Any:
        """State for N = batch*beam hypotheses, all at sentence start.

        Any pytree of tensors whose leading dim is N.
        """
        ...

    def score(self, state: Any, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (N, C) candidate next-token ids -> (N, C) log-scores of appending each candidate.

        C may be the whole vocabulary (tokens = arange(V) expanded) or a pre-beam subset
        ("partial scoring").
        """
        ...

    def select_state(self, state: Any, index: torch.Tensor, tokens: torch.Tensor) -> Any:
        """index: (M,) rows into the old N hypotheses; tokens: (M,) token appended to that row,
        or -1 for 'prefix unchanged' (CTC blank/repeat). Returns the state of the M new hypotheses.
        """
        ...

    def final_score(self, state: Any) -> torch.Tensor:
        """(N,) log-score of ending the hypothesis here (e.g. log P(</s> | history)); zeros if not
        applicable."""
        ...


# (kind, named tables) of a scorer that the native CPU search evaluates itself; see NativeScorer.
NativeForm = Tuple[str, Dict[str, torch.Tensor]]
# (once, per_token, nonnegative): the most a scorer can still add to a hypothesis; see BoundedScorer.
GainBound = Tuple[float, float, bool]


@runtime_checkable
class BoundedScorer(Protocol):
    """A scorer that states the most its scores can still add to a hypothesis.

    A label-synchronous search stops once no running hypothesis can overtake the finished ones
    (:mod:`asrkit.search.beam_search`); that needs, from every scorer, a bound on what is still to come. A
    scorer without one could add anything: the search then runs every hypothesis to its end.
    """

    def max_gain(self) -> GainBound:
        """``(once, per_token, nonnegative)``: from any state the scorer can reach, appending r more tokens and
        then ending (``final_score``, or the score of an <eos> token) adds at most ``once + per_token * r``
        (log-probabilities: 0, 0). ``nonnegative``: no score is ever below 0 (a count), so weighted negatively
        the scorer adds nothing."""
        ...


@runtime_checkable
class NativeScorer(Protocol):
    """A scorer whose scores the native (C++) CPU prefix search computes from the scorer's own tables.

    :func:`asrkit.search.ctc_prefix_beam_search` runs its native loop only when every active scorer meets
    this protocol and ``native_form()`` returns a form of a kind it knows (None: this configuration has none).
    The kinds and the tables each needs are listed in :mod:`asrkit.search.native_loop`; the GPU's one-launch
    search reads the same forms (:mod:`asrkit.search.fused_search`, its kinds in ``FUSED_KINDS``, among them
    ``token_ngram_lookup``, which the C++ loop does not run); tables are plain tensors on the scorer's device (the
    search moves the scorer to its device first, through ``init_state``), 0-d tensors for integer parameters.
    """

    def native_form(self) -> Optional[NativeForm]:
        """(kind, tables) for the native search, or None."""
        ...


def active_scorers(scorers: Mapping[str, BatchScorer], weights: Mapping[str, float]
                   ) -> Tuple[Dict[str, BatchScorer], Dict[str, float], float]:
    """Check a fusion's scorers against its weights; drop the scorers weighted 0.

    Every scorer needs a weight and every weight a scorer, except ``length_bonus``, which without a
    scorer of that name is a constant per emitted token; every weight is a finite number (a NaN or an
    infinite weight would empty every hypothesis). Returns (active scorers, their weights as floats, that
    constant bonus or 0).
    """
    for name, weight in weights.items():
        if name not in scorers and name != LENGTH_BONUS:
            raise ValueError(f"weight {name!r} has no scorer; scorers: {sorted(scorers)}")
        if not math.isfinite(float(weight)):
            raise ValueError(f"weight {name!r} is {float(weight)}: weights must be finite numbers")
    for name in scorers:
        if name not in weights:
            raise ValueError(f"scorer {name!r} has no weight; give weights={{{name!r}: ...}}")
    bonus = float(weights.get(LENGTH_BONUS, 0.0)) if LENGTH_BONUS not in scorers else 0.0
    active = {n: sc for n, sc in scorers.items() if float(weights[n]) != 0.0}
    return active, {n: float(weights[n]) for n in active}, bonus
