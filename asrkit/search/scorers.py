"""Generic scorers that meet :class:`asrkit.search.interfaces.BatchScorer`.

Only the model-independent pieces live here for now; model and LM adapters come later.
"""
from __future__ import annotations

from typing import Optional

import torch

from asrkit.search.interfaces import BLANK_ID


class LengthBonus:
    """Score 1 per emitted token, or per emitted word-initial token.

    Weighted by ``beta`` in the search's weights dict, this is the ``beta * (#tokens)`` term of
    shallow fusion. With ``word_start`` (a (V,) bool mask, True for tokens that begin a word, e.g.
    sentencepiece pieces starting with "▁"), it counts words instead. The blank always scores 0.
    The bonus does not depend on history, so the state is just an (N,) zero vector (it gives
    ``final_score`` its shape).
    """

    def __init__(self, word_start: Optional[torch.Tensor] = None) -> None:
        if word_start is not None:
            if word_start.dim() != 1:
                raise ValueError(f"LengthBonus: word_start must be a (V,) mask, got shape {tuple(word_start.shape)}")
            word_start = word_start.to(torch.bool).clone()
            word_start[BLANK_ID] = False
        self.word_start = word_start

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch * beam, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if self.word_start is None:
            return (tokens != BLANK_ID).to(torch.get_default_dtype())
        mask = self.word_start.to(tokens.device)
        # Negative ids (padding) are clamped: they never reach a real candidate anyway.
        return mask[tokens.clamp(min=0)].to(torch.get_default_dtype())

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # Shapes are static, so this branch reads no tensor value (no host sync).
        return state if index.shape[0] == state.shape[0] else state.new_zeros(index.shape[0])

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        return state
