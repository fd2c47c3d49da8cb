"""Attention rescoring of a CTC prefix-search N-best (the second pass of WeNet-style decoding).

Every hypothesis y of the N-best gets the teacher-forced decoder score
``att(y) = log P_att(y_1 .. y_L, <eos> | x)`` and the new score

    score'(y) = ctc_weight * ctc_score(y) + (1 - ctc_weight) * att(y) + (score(y) - ctc_score(y))

where ``score - ctc_score`` is what the first pass fused besides CTC (LM, length bonus), kept as is.
ctc_weight 1 keeps the first-pass order; ctc_weight 0 ranks by the decoder (+ LM/bonus).
Empty slots (score -inf) are not scored and stay last.
"""
from __future__ import annotations

from typing import Callable

import torch

from asrkit.search.hypotheses import NBest

NEG_INF = float("-inf")

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def attention_rescore(nbest: NBest, score_fn: ScoreFn, ctc_weight: float) -> NBest:
    """Rescore and re-sort ``nbest`` (B, N); see the module docstring.

    score_fn(tokens (B*N, L) padded -1, lengths (B*N,)) -> (B*N,) log P_att(y <eos> | x), rows in
    the order b*N + n; e.g. with a model's ``score_tokens`` and encoder output enc (B, T, D)::

        rows = torch.arange(B).repeat_interleave(N)
        score_fn = lambda tokens, lengths: model.score_tokens(enc[rows], enc_lens[rows], tokens, lengths)

    Returns an NBest of the same shape, best first: scores are the new scores, ctc_scores and
    token_frames are carried with their hypotheses.
    """
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    batch, n = nbest.scores.shape
    dead = nbest.scores == NEG_INF  # (B, N) empty slots
    tokens = nbest.tokens.masked_fill(dead[..., None], -1)
    lengths = nbest.lengths.masked_fill(dead, 0)
    with torch.no_grad():
        att = score_fn(tokens.reshape(batch * n, -1), lengths.reshape(batch * n))
    att = att.reshape(batch, n).to(nbest.scores.dtype)
    # A zero weight drops its term (0 * -inf would be NaN); ctc_weight 1 returns the first-pass scores exactly.
    if ctc_weight == 1.0:
        new = nbest.scores
    else:
        new = nbest.scores - nbest.ctc_scores + (1.0 - ctc_weight) * att  # LM/bonus part + decoder
        if ctc_weight > 0.0:
            new = new + ctc_weight * nbest.ctc_scores
    new = new.masked_fill(dead, NEG_INF)
    new, order = new.sort(dim=1, descending=True, stable=True)  # ties keep the first-pass order

    def pick(x: torch.Tensor) -> torch.Tensor:
        index = order.view(batch, n, *([1] * (x.dim() - 2))).expand(x.shape)
        return x.gather(1, index)

    return NBest(tokens=pick(nbest.tokens), lengths=pick(nbest.lengths), scores=new,
                 ctc_scores=pick(nbest.ctc_scores), token_frames=pick(nbest.token_frames))
