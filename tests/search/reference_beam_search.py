"""A deliberately simple label-synchronous beam search and CTC prefix score (one utterance, python
lists and floats).

Tests compare asrkit.search.beam_search and asrkit.search.ctc_prefix_score against these. The
search keeps a list of (prefix, score) hypotheses; every scorer is a function prefix -> list of V
log-scores of the next token (the <eos> entry ends the hypothesis). The CTC reference runs the
textbook CTC forward algorithm over the blank-extended label sequence of every prefix from scratch.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Dict, List, Sequence, Tuple

NEG_INF = float("-inf")
Prefix = Tuple[int, ...]
NextScores = Callable[[Prefix], Sequence[float]]


def logsumexp(values: Sequence[float]) -> float:
    values = [v for v in values if v != NEG_INF]
    if not values:
        return NEG_INF
    m = max(values)
    return m + math.log(sum(math.exp(v - m) for v in values))


class RefCTC:
    """CTC prefix scores of one utterance: lp[t][v] log-probabilities of its T valid frames (V = vocab)."""

    def __init__(self, lp: Sequence[Sequence[float]], vocab: int, blank: int = 0, eos: int = 2) -> None:
        self.lp, self.vocab, self.blank, self.eos = [list(map(float, row)) for row in lp], vocab, blank, eos
        self.alpha = lru_cache(maxsize=None)(self._alpha)
        self.psi = lru_cache(maxsize=None)(self._psi)

    def _alpha(self, labels: Prefix) -> List[List[float]]:
        """alpha[t][s]: log P(frames 1..t+1 pass through state s) of ext = b l1 b l2 .. lL b."""
        ext = [self.blank]
        for lab in labels:
            ext += [lab, self.blank]
        out: List[List[float]] = []
        for t, row in enumerate(self.lp):
            cur = []
            for s, lab in enumerate(ext):
                if t == 0:
                    prev = 0.0 if s < 2 else NEG_INF
                else:
                    terms = [out[-1][s]] + ([out[-1][s - 1]] if s >= 1 else [])
                    if s >= 2 and lab != self.blank and lab != ext[s - 2]:
                        terms.append(out[-1][s - 2])
                    prev = logsumexp(terms)
                cur.append(prev + row[lab] if prev != NEG_INF else NEG_INF)
            out.append(cur)
        return out

    def _before(self, g: Prefix, c: int, s: int) -> float:
        """log P(frames 1..s collapse to g and frame s+1 may start a new c)."""
        if s == 0:
            return 0.0 if not g else NEG_INF
        a = self.alpha(g)[s - 1]
        terms = [a[-1]] + ([a[-2]] if g and g[-1] != c else [])
        return logsumexp(terms)

    def _psi(self, prefix: Prefix) -> float:
        """log sum of P(y | x) over all y starting with prefix."""
        if not prefix:
            return 0.0
        g, c = prefix[:-1], prefix[-1]
        return logsumexp([self._before(g, c, t) + self.lp[t][c] for t in range(len(self.lp))])

    def full(self, labels: Prefix) -> float:
        """log P_ctc(labels | x)."""
        if not self.lp:
            return 0.0 if not labels else NEG_INF
        a = self.alpha(labels)[-1]
        return logsumexp(a[-2:] if labels else a[-1:])

    def __call__(self, prefix: Prefix) -> List[float]:
        base = self.psi(prefix)
        out = []
        for c in range(self.vocab):
            new = NEG_INF if c == self.blank else self.full(prefix) if c == self.eos else self.psi(prefix + (c,))
            out.append(NEG_INF if base == NEG_INF or new == NEG_INF else new - base)
        return out


def length_penalty(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016, eq. 14): lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| = tokens without <eos>."""
    return ((5 + length) / 6) ** alpha


def reference_beam_search(scorers: Dict[str, NextScores], weights: Dict[str, float], vocab: int, beam: int,
                          max_len: int, full: Sequence[str] = ("decoder",), pre_beam: int = 0, eos: int = 2,
                          bonus: float = 0.0, nbest: int = 1, alpha: float = 0.0) -> List[Tuple[Prefix, float, float]]:
    """Best ``nbest`` finished hypotheses as (tokens, score, ctc score); see the module docstring.

    Per step and hypothesis: the weighted full scorers (any names in ``full``, e.g. the decoder and
    an LM) rank the non-blank tokens, the best ``pre_beam`` are scored by all scorers (all tokens
    without a full scorer); the best ``beam`` candidates of all hypotheses survive, by raw score;
    <eos> or reaching ``max_len`` tokens ends one. The finished hypotheses are ranked by
    ``raw score / length_penalty(len, alpha)``, which is also the score returned (the CTC score
    stays raw). No early stop: the search runs until no hypothesis is left.
    """
    active = [n for n in scorers if weights.get(n, 0.0) != 0.0]
    full_names = [n for n in active if n in full]
    ctc_name = "ctc" if "ctc" in active else None
    running: List[Tuple[Prefix, float, float]] = [((), 0.0, 0.0)]
    finished: List[Tuple[Prefix, float, float]] = []
    for step in range(max_len + 1):
        if step == max_len:  # forced end
            for prefix, score, ctc in running:
                tables = {n: scorers[n](prefix) for n in active}
                total = score + sum(weights[n] * tables[n][eos] for n in active)
                ctc_total = ctc + tables[ctc_name][eos] if ctc_name else total
                if total != NEG_INF:
                    finished.append((prefix, total, ctc_total))
            break
        cands = []
        for prefix, score, ctc in running:
            tables = {n: scorers[n](prefix) for n in active}
            tokens = list(range(1, vocab))
            if full_names:
                fused = {c: sum(weights[n] * tables[n][c] for n in full_names) for c in tokens}
                tokens = sorted(tokens, key=lambda c: -fused[c])[:pre_beam]
            for c in tokens:
                add = sum(weights[n] * tables[n][c] for n in active) + (bonus if c != eos else 0.0)
                cands.append((score + add, prefix, c, ctc + tables[ctc_name][c] if ctc_name else 0.0))
        cands.sort(key=lambda x: -x[0])
        running = []
        for total, prefix, c, ctc in cands[:beam]:
            if total == NEG_INF:
                continue
            if c == eos:
                finished.append((prefix, total, ctc if ctc_name else total))
            else:
                running.append((prefix + (c,), total, ctc))
        if not running:
            break
    normalised = []
    for prefix, total, ctc in finished:
        score = total / length_penalty(len(prefix), alpha) if alpha else total
        normalised.append((prefix, score, ctc if ctc_name else score))
    normalised.sort(key=lambda h: -h[1])
    return normalised[:nbest]
