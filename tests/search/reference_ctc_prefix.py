"""A deliberately simple CTC prefix beam search (one utterance, python dicts, float64).

Tests compare the batched search in asrkit.search.ctc_prefix against this. It follows Hannun et
al. (2014) literally: for every prefix in the beam and every token, update a dict keyed by the
new prefix; then keep the `beam` best prefixes by ``ctc + fused`` score.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

NEG_INF = float("-inf")
Prefix = Tuple[int, ...]


def logaddexp(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


def reference_prefix_search(
    log_probs: Sequence[Sequence[float]],
    beam: int,
    token_score: Optional[Callable[[Prefix, int], float]] = None,
    final_score: Optional[Callable[[Prefix], float]] = None,
    candidates: Optional[Callable[[int], Sequence[int]]] = None,
    skip_blank_above: Optional[float] = None,
) -> List[Tuple[Prefix, float, float]]:
    """log_probs: T rows of V log-probs (blank id 0). token_score(prefix, c): the weighted fusion
    score of appending c (already multiplied by its weights, length bonus included);
    final_score(prefix): weighted end-of-sentence score. Returns [(prefix, total, ctc)] best first.

    Pruning, as the batched search defines it: candidates(t) lists the tokens that may create a
    new prefix at frame t (default: all non-blank); probability flowing into a prefix that is
    already in the beam is always counted. A frame whose blank probability exceeds
    skip_blank_above is a pure blank frame: every prefix keeps only pb = total + log P(blank).
    """
    vocab = len(log_probs[0]) if log_probs else 0
    beam_probs: Dict[Prefix, Tuple[float, float]] = {(): (0.0, NEG_INF)}  # prefix -> (pb, pnb)
    fused: Dict[Prefix, float] = {(): 0.0}
    for t, row in enumerate(log_probs):
        nxt: Dict[Prefix, List[float]] = defaultdict(lambda: [NEG_INF, NEG_INF])
        if skip_blank_above is not None and row[0] > math.log(skip_blank_above):
            beam_probs = {p: (logaddexp(pb, pnb) + row[0], NEG_INF) for p, (pb, pnb) in beam_probs.items()}
            continue
        allowed = set(range(1, vocab) if candidates is None else candidates(t))
        for prefix, (pb, pnb) in beam_probs.items():
            tot = logaddexp(pb, pnb)
            entry = nxt[prefix]
            entry[0] = logaddexp(entry[0], tot + row[0])  # blank: prefix unchanged
            if prefix:  # repeat of the last token without blank: prefix unchanged
                entry[1] = logaddexp(entry[1], pnb + row[prefix[-1]])
            for c in range(1, vocab):
                new = prefix + (c,)
                if c not in allowed and new not in beam_probs:
                    continue
                # After a non-blank c, a second c only counts as new once a blank separates them.
                source = pb if prefix and prefix[-1] == c else tot
                ext = nxt[new]
                ext[1] = logaddexp(ext[1], source + row[c])
                if new not in fused:
                    fused[new] = fused[prefix] + (token_score(prefix, c) if token_score else 0.0)

        def total(p: Prefix) -> float:
            return logaddexp(*nxt[p]) + fused[p]

        alive = [p for p in nxt if total(p) > NEG_INF]
        alive.sort(key=total, reverse=True)
        beam_probs = {p: (nxt[p][0], nxt[p][1]) for p in alive[:beam]}
    out = []
    for prefix, (pb, pnb) in beam_probs.items():
        ctc = logaddexp(pb, pnb)
        out.append((prefix, ctc + fused[prefix] + (final_score(prefix) if final_score else 0.0), ctc))
    out.sort(key=lambda x: x[1], reverse=True)
    return out
