"""Label-synchronous beam search over fused scorers, batched over (utterance, beam) tensors.

One step extends every hypothesis by one token. The weighted sum of the *full* scorers (by default
the attention decoder, scored on all V tokens) picks the ``pre_beam`` best tokens of each
hypothesis; every other (*partial*) scorer — the CTC prefix score, LMs, a LengthBonus — scores only
those; ``weights["length_bonus"]`` without a scorer of that name adds a constant per non-<eos>
token. One ``topk`` over the beam * pre_beam candidates of each utterance picks the next beam
(ESPnet's batch beam search, written for (B, K) tensors). A pick ending in <eos> leaves the beam
(its slot becomes -inf) and enters the utterance's finished pool, a (B, nbest) tensor that keeps
the best finished hypotheses; at ``max_lens[b]`` tokens every running hypothesis of utterance b
ends with its scorers' ``final_score`` (log P(<eos>)). The blank (id 0) is never emitted. Without
a full scorer of nonzero weight every non-blank token is a candidate.

Full or partial is the caller's choice, by name (``full_scorers``): the protocol lets any scorer
score the whole vocabulary, and whether it should is a question of cost and of search quality,
not a property of the scorer. A neural LM computes all V log-probabilities anyway, so naming it
full (as ESPnet does with its LM) costs nothing and lets the LM bring tokens into the pre-beam
that the decoder alone ranks below it; the CTC prefix score on all V costs O(N * V * T).
A full scorer's score is added once, as part of the pre-beam's fused score.

Joint CTC/attention decoding (Watanabe et al. 2017) is this search with
``scorers={"decoder": DecoderScorer(...), "ctc": CTCPrefixScorer(...)}`` and
``weights={"decoder": 1 - ctc_weight, "ctc": ctc_weight}`` (:func:`joint_beam_search` builds it);
attention-only decoding is ``{"decoder": ...}`` with weight 1; beam 1 is greedy attention
decoding; an LM is one more scorer, ``weights["lm"]``. A weight of 0 drops its scorer.

Length penalty (GNMT, Wu et al. 2016, eq. 14). With ``length_penalty`` = alpha != 0 a finished
hypothesis Y of |Y| tokens (<eos> not counted) is ranked by ``score / lp(Y)``,
``lp(Y) = ((5 + |Y|) / 6) ** alpha``; alpha = 0 is the raw score (the default, bit for bit). It
applies where hypotheses of different lengths meet: the finished pool, so the N-best's order and
its reported ``scores`` (the normalised ones; the raw total is ``score * lp``, and ``ctc_scores``
stay unnormalised CTC log-probabilities). Live beams are pruned on raw scores, as in GNMT and
ESPnet: after a step all running hypotheses hold the same number of tokens, so one positive factor
would not change their order; a candidate ending in <eos> competes for a beam slot with its raw
score. It is independent of the additive length bonus, which enters the raw score.

Stopping. An utterance is done once no running hypothesis can still enter its N-best: once the best
running score plus the most the scorers can still add (an upper bound U on any raw final score) ranks
below the worst of a full finished pool. Each scorer states that most (``max_gain``,
:class:`~asrkit.search.interfaces.BoundedScorer`): at most ``once + per_token * r`` over r more tokens
and the end; log-probability scorers (decoder, CTC prefix score, neural LM) never gain, the length
bonus gains 1 a token, and a word n-gram gains when a word closes (ln P(w | h) - LA(w): +6.1 nats for
"NEW YORK" on a 3-line ARPA), bounded from its tables. Weighted, summed (plus the constant bonus) and
taken over the tokens an utterance can still emit, that gives U: the stop is exact, not a heuristic. A
scorer that states no bound, or one with a negative weight that could add anything, turns the stop off
(a count such as the length bonus, weighted negatively, adds nothing). Under a length penalty a longer
hypothesis can overtake a shorter one with a higher raw score (a negative U divided by a larger lp
rises), so the bound is U's best normalised
value over every length the hypothesis can still end at, ``max(U / lp(i + 1), U / lp(max_len))``
for a hypothesis of i + 1 tokens (U / lp(L) is monotone in L), and the search stops only when
that falls below the pool's worst normalised score — or at ``max_len``. Checking it needs the
host, so the loop checks every ``_CHECK_EVERY`` = 8 steps and is otherwise free of host syncs.
"""
from __future__ import annotations

import math
from typing import Any, Collection, Dict, Mapping, Optional, Sequence, Tuple

import torch

from asrkit.search.ctc_prefix_score import CTCPrefixScorer
from asrkit.search.hypotheses import NBest
from asrkit.search.interfaces import BLANK_ID, SOS_EOS_ID, BatchScorer, BoundedScorer, active_scorers
from asrkit.search.scorers import DecoderScorer, StepDecoder

NEG_INF = float("-inf")
CTC = "ctc"  # the scorer whose unweighted total becomes NBest.ctc_scores
_CHECK_EVERY = 8  # steps between host-side end-of-search checks


def length_penalty_factor(length: int, alpha: float) -> float:
    """GNMT's ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` of a hypothesis of ``length`` tokens (<eos> not counted)."""
    return ((5.0 + length) / 6.0) ** alpha


class _Beam:
    """Running hypotheses (B, K) and the finished pool (B, P) of one search."""

    def __init__(self, batch: int, beam: int, pool: int, width: int, dtype: torch.dtype,
                 device: torch.device, alpha: float = 0.0) -> None:
        self.alpha = alpha  # GNMT length penalty of the pool's ranking; 0 = raw scores
        self.score = torch.full((batch, beam), NEG_INF, dtype=dtype, device=device)
        self.score[:, 0] = 0.0  # one live hypothesis per utterance: the empty prefix
        self.tokens = torch.full((batch, beam, width), -1, dtype=torch.long, device=device)
        self.ctc = torch.zeros((batch, beam), dtype=dtype, device=device)  # unweighted "ctc" total
        self.pool_score = torch.full((batch, pool), NEG_INF, dtype=dtype, device=device)  # normalised
        self.pool_tokens = torch.full((batch, pool, width), -1, dtype=torch.long, device=device)
        self.pool_len = torch.zeros((batch, pool), dtype=torch.long, device=device)
        self.pool_ctc = torch.full((batch, pool), NEG_INF, dtype=dtype, device=device)
        self.row0 = torch.arange(batch, device=device)[:, None] * beam  # (B, 1) flat row offsets
        self.states: Dict[str, Any] = {}

    def finish(self, score: torch.Tensor, tokens: torch.Tensor, length: int, ctc: torch.Tensor) -> None:
        """Merge ended hypotheses of ``length`` tokens (raw score (B, K), -inf = not ended; tokens
        (B, K, W)) into the pool, which ranks and keeps ``score / lp(length)``."""
        if self.alpha != 0.0:
            # A Python float: every hypothesis ending here has the same length (no host sync).
            score = score / length_penalty_factor(length, self.alpha)
        pool = self.pool_score.shape[1]
        top, order = torch.cat([self.pool_score, score], 1).topk(pool, 1)  # (B, P)
        self.pool_score = top
        self.pool_tokens = torch.cat([self.pool_tokens, tokens], 1).gather(
            1, order[..., None].expand(-1, -1, tokens.shape[2]))
        self.pool_len = torch.cat([self.pool_len, self.pool_len.new_full(score.shape, length)], 1).gather(1, order)
        self.pool_ctc = torch.cat([self.pool_ctc, ctc], 1).gather(1, order)


class _Setup:
    """Everything a step needs that does not change during the search."""

    def __init__(self, scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], full: Sequence[str],
                 vocab: int, beam: int, pre_beam: int, eos_id: int, bonus: float, batch: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.scorers, self.weights, self.eos_id, self.bonus, self.dtype = scorers, weights, eos_id, bonus, dtype
        self.full = [n for n in scorers if n in full]
        self.partial = [n for n in scorers if n not in full]
        self.n_cand = min(pre_beam, vocab - 1) if self.full else vocab - 1
        self.all_tokens = torch.arange(vocab, device=device).expand(batch * beam, vocab)  # (N, V)
        self.blank_mask = torch.arange(vocab, device=device) == BLANK_ID  # (V,)
        self.non_blank = torch.arange(1, vocab, device=device).expand(batch, beam, vocab - 1)


def _step(i: int, s: _Beam, st: _Setup) -> None:
    """Extend every hypothesis by one token (step i: the hypotheses hold i tokens). No host sync."""
    batch, beam = s.score.shape
    n, c = batch * beam, st.n_cand
    ctc_cand: Optional[torch.Tensor] = None  # (B, K, C) unweighted CTC scores of the candidates
    if st.full:
        fused = None
        for name in st.full:
            sc = st.scorers[name].score(s.states[name], st.all_tokens).view(batch, beam, -1).to(st.dtype)
            fused = sc * st.weights[name] if fused is None else fused + sc * st.weights[name]
            if name == CTC:
                ctc_all = sc
        fused = fused.masked_fill(st.blank_mask, NEG_INF)  # (B, K, V)
        cand_score, cand = fused.topk(c, -1)  # (B, K, C) the pre-beam
        if CTC in st.full:
            ctc_cand = ctc_all.gather(-1, cand)
    else:
        cand = st.non_blank
        cand_score = torch.zeros(cand.shape, dtype=st.dtype, device=cand.device)
    if st.bonus:
        cand_score = cand_score + (cand != st.eos_id).to(st.dtype) * st.bonus
    flat = cand.reshape(n, c)
    for name in st.partial:
        sc = st.scorers[name].score(s.states[name], flat).view(batch, beam, c).to(st.dtype)
        cand_score = cand_score + sc * st.weights[name]
        if name == CTC:
            ctc_cand = sc
    total = s.score[..., None] + cand_score
    total = torch.where(s.score[..., None] == NEG_INF, NEG_INF, total)  # dead slots stay dead (no NaN)
    top, pick = total.view(batch, beam * c).topk(beam, 1)  # (B, K)
    parent = torch.div(pick, c, rounding_mode="floor")
    token = cand.reshape(batch, beam * c).gather(1, pick)  # (B, K)
    tokens = s.tokens.gather(1, parent[..., None].expand_as(s.tokens))
    ctc = s.ctc.gather(1, parent)
    if ctc_cand is not None:
        ctc = ctc + ctc_cand.reshape(batch, beam * c).gather(1, pick)
    ended = token == st.eos_id
    s.finish(top.masked_fill(~ended, NEG_INF), tokens, i, ctc)
    tokens[:, :, i] = token
    s.tokens, s.ctc, s.score = tokens, ctc, top.masked_fill(ended, NEG_INF)
    index, flat_token = (s.row0 + parent).view(n), token.view(n)
    for name, scorer in st.scorers.items():
        s.states[name] = scorer.select_state(s.states[name], index, flat_token)


def _force_end(i: int, ending: torch.Tensor, s: _Beam, st: _Setup) -> None:
    """End the running hypotheses of the utterances ``ending`` (B,) bool, which hold i = max_len tokens."""
    batch, beam = s.score.shape
    total, ctc = s.score, s.ctc
    for name, scorer in st.scorers.items():
        final = scorer.final_score(s.states[name]).view(batch, beam).to(st.dtype)
        total = total + final * st.weights[name]
        if name == CTC:
            ctc = ctc + final
    keep = ending[:, None] & (s.score > NEG_INF)
    s.finish(torch.where(keep, total, NEG_INF), s.tokens, i, ctc)
    s.score = s.score.masked_fill(ending[:, None], NEG_INF)


def _max_gain(scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], bonus: float) -> Tuple[float, float]:
    """(once, per step): the most the weighted scorers and the constant bonus can still add to a running
    hypothesis, ``once + per * r`` over r more steps (see the module docstring); infinite when a scorer states
    no bound, or is weighted negatively and could add anything."""
    once, per = 0.0, max(bonus, 0.0)
    for name, scorer in scorers.items():
        if not isinstance(scorer, BoundedScorer):
            return math.inf, math.inf
        bound_once, bound_per, nonnegative = scorer.max_gain()
        if weights[name] < 0:
            if nonnegative:  # a count weighted negatively: never a gain
                continue
            return math.inf, math.inf
        once, per = once + weights[name] * bound_once, per + weights[name] * bound_per
    return once, per


def _done(i: int, s: _Beam, max_lens: torch.Tensor, gain: Tuple[float, float]) -> bool:
    """After step i: can no running hypothesis reach any utterance's N-best any more? (host sync)"""
    best = s.score.max(1).values  # (B,)
    done = best == NEG_INF
    once, per = gain
    if math.isfinite(once + per):
        remaining = (max_lens - i).clamp(min=0).to(best.dtype)  # tokens still to come, + <eos>
        bound = best + once + per * remaining  # (B,) no raw final score of a running hypothesis exceeds it
        if s.alpha != 0.0:
            # Running hypotheses hold i + 1 tokens and end at i + 1 .. max_len tokens; bound / lp(L)
            # is monotone in L, so its largest value is at one end (a negative bound rises with L
            # when alpha > 0: the longest ending is the dangerous one).
            lp_end = ((5.0 + max_lens.to(best.dtype)) / 6.0) ** s.alpha  # (B,)
            bound = torch.maximum(bound / length_penalty_factor(i + 1, s.alpha), bound / lp_end)
        done |= bound < s.pool_score[:, -1]
    return bool(done.all())


def _loop(s: _Beam, st: _Setup, max_lens: torch.Tensor, max_list: Sequence[int], gain: Tuple[float, float]) -> None:
    width = max(max_list)
    ends = set(max_list)
    for i in range(width + 1):
        if i in ends:
            _force_end(i, max_lens == i, s, st)
        if i == width:
            break
        _step(i, s, st)
        if (i + 1) % _CHECK_EVERY == 0 and _done(i, s, max_lens, gain):
            break


def _nbest(s: _Beam, track_ctc: bool) -> NBest:
    dead = s.pool_score == NEG_INF  # (B, P)
    lengths = s.pool_len.masked_fill(dead, 0)
    width = int(lengths.max()) if lengths.numel() else 0  # one host sync, after the loop
    tokens = s.pool_tokens[..., :width].masked_fill(dead[..., None], -1)
    ctc = s.pool_ctc if track_ctc else s.pool_score
    return NBest(tokens=tokens, lengths=lengths, scores=s.pool_score, ctc_scores=ctc.masked_fill(dead, NEG_INF),
                 token_frames=torch.full_like(tokens, -1))


def _full_names(full_scorers: Optional[Collection[str]], scorers: Mapping[str, BatchScorer]) -> Collection[str]:
    """The names of the full scorers: default the "decoder" if there is one; every name given must be a scorer."""
    if full_scorers is None:
        return ("decoder",)  # absent or weighted 0: then no full scorer, every token is a candidate
    if isinstance(full_scorers, str):
        raise ValueError(f"full_scorers must be a collection of scorer names, got the string {full_scorers!r}")
    for name in full_scorers:
        if name not in scorers:
            raise ValueError(f"full scorer {name!r} has no scorer; scorers: {sorted(scorers)}")
    return tuple(full_scorers)


def beam_search(scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], max_lens: torch.Tensor,
                beam: int = 10, nbest: Optional[int] = None, full_scorers: Optional[Collection[str]] = None,
                pre_beam: Optional[int] = None, eos_id: int = SOS_EOS_ID, vocab_size: Optional[int] = None,
                dtype: torch.dtype = torch.float32, length_penalty: float = 0.0) -> NBest:
    """Label-synchronous beam search of B utterances; see the module docstring.

    scorers/weights: ``score = sum_k weights[k] * scorer_k`` (+ ``weights["length_bonus"]`` per
    token if no scorer has that name); max_lens: (B,) most output tokens (without <eos>) per
    utterance; full_scorers: names of the scorers scored on the whole vocabulary, whose weighted
    sum picks the pre-beam (the rest are partial and score only the pre-beam); default ("decoder",),
    every name given must be a key of ``scorers`` (e.g. ``("decoder", "lm")`` lets a neural LM
    shape the pre-beam); pre_beam: candidates per hypothesis (default int(1.5 * beam));
    vocab_size: default the ``vocab_size`` attribute of a scorer (DecoderScorer, CTCPrefixScorer
    have one); length_penalty: GNMT's alpha, finished hypotheses ranked by
    ``score / ((5 + |Y|) / 6) ** alpha`` (0: raw scores; GNMT uses 0.6 .. 0.7).
    Returns an :class:`NBest` (B, nbest), best first: scores = total weighted score (incl. <eos>),
    divided by the length penalty when alpha != 0 (the ranking key, so the list stays sorted by
    score); ctc_scores = the unweighted (never normalised) total of the scorer named "ctc" if it
    runs, else the same as scores; token_frames = -1.
    """
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    nbest = beam if nbest is None else nbest
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
    pre_beam = int(1.5 * beam) if pre_beam is None else pre_beam
    if pre_beam < 1:
        raise ValueError(f"pre_beam must be >= 1, got {pre_beam}")
    if max_lens.dim() != 1 or max_lens.is_floating_point():
        raise ValueError(f"max_lens must be (batch,) integers, got {max_lens.dtype} of shape {tuple(max_lens.shape)}")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty}")
    full = _full_names(full_scorers, scorers)
    active, w, bonus = active_scorers(scorers, weights)
    if not active:
        raise ValueError("beam_search needs at least one scorer with a nonzero weight")
    gain = _max_gain(active, w, bonus)  # what a running hypothesis can still gain: for the early stop

    batch, device = max_lens.shape[0], max_lens.device
    max_list = [max(int(m), 0) for m in max_lens.tolist()] or [0]  # one host sync, before the loop
    max_lens = max_lens.clamp(min=0)
    with torch.no_grad():
        s = _Beam(batch, beam, nbest, max(max_list), dtype, device, float(length_penalty))
        s.states = {n: sc.init_state(batch, beam, device) for n, sc in active.items()}
        vocab = vocab_size or next((v for v in (getattr(sc, "vocab_size", None) for sc in active.values()) if v),
                                   None)
        if vocab is None:
            raise ValueError("beam_search: give vocab_size (no scorer has a vocab_size attribute)")
        if vocab < 2:
            raise ValueError(f"vocab_size {vocab}: the search needs the blank and at least one token")
        st = _Setup(active, w, full, vocab, beam, pre_beam, eos_id, bonus, batch, dtype, device)
        if batch:
            _loop(s, st, max_lens, max_list, gain)
        return _nbest(s, CTC in active)


def joint_beam_search(decoder: StepDecoder, memory: torch.Tensor, memory_lens: torch.Tensor,
                      ctc_log_probs: Optional[torch.Tensor] = None, ctc_weight: float = 0.3, beam: int = 10,
                      nbest: Optional[int] = None, max_len_ratio: float = 1.0, pre_beam: Optional[int] = None,
                      scorers: Optional[Mapping[str, BatchScorer]] = None,
                      weights: Optional[Mapping[str, float]] = None, length_penalty: float = 0.0,
                      full_scorers: Collection[str] = ()) -> NBest:
    """Joint CTC/attention one-pass search (ctc_weight 0 or no ctc_log_probs: attention only).

    memory (B, T, D), memory_lens (B,): encoder output; ctc_log_probs (B, T, V) on the same frames.
    Score: ``(1 - ctc_weight) * log P_att + ctc_weight * CTC prefix score`` + extra ``scorers``
    (e.g. ``{"lm": NgramScorer}`` with ``weights={"lm": 0.3, "length_bonus": 0.5}``).
    At most ``ceil(max_len_ratio * T_b)`` tokens per utterance (at least 1).
    full_scorers: names of extra ``scorers`` that join the decoder (always full) in picking the
    pre-beam, e.g. ``("lm",)`` for a neural LM; length_penalty: GNMT's alpha (see :func:`beam_search`).
    """
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    all_scorers: Dict[str, BatchScorer] = dict(scorers or {})
    all_weights: Dict[str, float] = dict(weights or {})
    all_scorers["decoder"] = DecoderScorer(decoder, memory, memory_lens)
    all_weights["decoder"] = 1.0
    if ctc_log_probs is not None and ctc_weight > 0:
        all_scorers[CTC] = CTCPrefixScorer(ctc_log_probs, memory_lens)
        all_weights["decoder"], all_weights[CTC] = 1.0 - ctc_weight, ctc_weight
    if isinstance(full_scorers, str):
        raise ValueError(f"full_scorers must be a collection of scorer names, got the string {full_scorers!r}")
    max_lens = (memory_lens.double() * max_len_ratio).ceil().long().clamp(min=1)
    return beam_search(all_scorers, all_weights, max_lens, beam=beam, nbest=nbest, pre_beam=pre_beam,
                       full_scorers=("decoder", *full_scorers), length_penalty=length_penalty)

