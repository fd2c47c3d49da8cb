"""Attention rescoring of a CTC prefix-search N-best (the second pass of WeNet-style decoding).

Every hypothesis y of the N-best gets the teacher-forced decoder score
``att(y) = log P_att(y_1 .. y_L, <eos> | x)`` and the new score

    score'(y) = ctc_weight * ctc_score(y) + (1 - ctc_weight) * att(y) + (score(y) - ctc_score(y))

where ``score - ctc_score`` is what the first pass fused besides CTC (LM, length bonus), kept as is.
ctc_weight 1 keeps the first-pass order; ctc_weight 0 ranks by the decoder (+ LM/bonus).
Empty slots (score -inf) are not scored and stay last. The live hypotheses are scored in chunks of at most
``max_rows``, grouped by length (a beam of 1000 over a batch of 32 is 32k decoder rows: one pass would need
the encoder output copied 32k times).
"""
from __future__ import annotations

from typing import Callable

import torch

from asrkit.search.hypotheses import NBest

NEG_INF = float("-inf")

ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MAX_ROWS = 512  # decoder rows per pass


def attention_rescore(nbest: NBest, score_fn: ScoreFn, ctc_weight: float, max_rows: int = MAX_ROWS) -> NBest:
    """Rescore and re-sort ``nbest`` (B, N); see the module docstring.

    score_fn(utts (M,), tokens (M, L) padded -1, lengths (M,)) -> (M,) log P_att(y <eos> | x): row m is a
    hypothesis of utterance ``utts[m]`` (an index into the batch); M <= max_rows, and L is the longest
    of the M. E.g. with a model's ``score_tokens`` and encoder output enc (B, T, D)::

        score_fn = lambda utts, tokens, lengths: model.score_tokens(enc[utts], enc_lens[utts], tokens, lengths)

    Returns an NBest of the same shape, best first: scores are the new scores, ctc_scores and
    token_frames are carried with their hypotheses.
    """
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    batch, n = nbest.scores.shape
    dead = nbest.scores == NEG_INF  # (B, N) empty slots
    flat_tokens = nbest.tokens.reshape(batch * n, -1)
    flat_lengths = nbest.lengths.reshape(batch * n)
    live = (~dead).reshape(-1).nonzero().squeeze(1)  # flat b*N + n of the live slots
    live = live[flat_lengths[live].argsort(stable=True)]  # similar lengths share a pass: less padding
    widths = flat_lengths[live].tolist()  # ascending; one host copy, not one per pass
    att = torch.zeros(batch * n, dtype=nbest.scores.dtype, device=nbest.scores.device)
    with torch.no_grad():
        for start in range(0, len(widths) if ctc_weight < 1.0 else 0, max_rows):  # weight 1: no decoder say
            rows = live[start:start + max_rows]
            width = widths[start + len(rows) - 1]  # the pass's longest hypothesis
            att[rows] = score_fn(rows // n, flat_tokens[rows, :width], flat_lengths[rows]).to(att.dtype)
    att = att.reshape(batch, n)
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
