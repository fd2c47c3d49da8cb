"""Scorer protocol shared by every batched search (structural typing, no inheritance).

A search over B utterances with beam K works on N = B*K flat hypotheses, row n = b*K + k.
Token id 0 is the CTC blank and is never scored by an LM (a scorer returns 0 for it);
``unk_id = 1`` and ``sos_eos_id = 2``. Nothing here may synchronise with the host
(no ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool(tensor)`` or Python ``if`` on tensor
values), so a search can call scorers inside its per-frame loop.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

BLANK_ID = 0
UNK_ID = 1
SOS_EOS_ID = 2


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
