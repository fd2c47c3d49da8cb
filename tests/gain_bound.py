"""A scorer's stated gain bound (asrkit.search.interfaces.BoundedScorer) against its own scores along walks."""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def worst_gain(scorer, walks: Sequence[Sequence[int]], eos: Optional[int] = None, tol: float = 1e-4) -> float:
    """Walk every token list (one row each, all of one length L) and assert the bound: at every split point j, the
    scores of the L - j tokens after it plus the end (``final_score``, and also the score of an ``eos`` token
    when given) are at most ``once + per_token * (L - j)``. Returns the largest such gain beyond
    ``per_token * (L - j)``: a test can then check that the bound is approached, not vacuous."""
    once, per_token = scorer.max_gain()[:2]
    n, steps = len(walks), len(walks[0])
    state = scorer.init_state(n, 1, torch.device("cpu"))
    rows = torch.arange(n)
    scores: List[torch.Tensor] = []
    for t in range(steps):
        tok = torch.tensor([w[t] for w in walks])
        scores.append(scorer.score(state, tok[:, None])[:, 0].double())
        state = scorer.select_state(state, rows, tok)
    ends = [scorer.final_score(state).double()]
    if eos is not None:
        ends.append(scorer.score(state, torch.full((n, 1), eos))[:, 0].double())
    table = torch.stack(scores, 1) if scores else torch.zeros(n, 0, dtype=torch.float64)
    after = torch.cat([table.flip(1).cumsum(1).flip(1), torch.zeros(n, 1, dtype=torch.float64)], 1)  # (N, L + 1)
    count = torch.arange(steps, -1, -1, dtype=torch.float64)  # tokens after each split point
    worst = max(float((after + end[:, None] - per_token * count).max()) for end in ends)
    assert worst <= once + tol, (worst, once, per_token)
    return worst
