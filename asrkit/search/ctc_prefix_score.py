"""Label-synchronous CTC prefix score (Watanabe et al. 2017, hybrid CTC/attention) as a BatchScorer.

For a label prefix h the CTC prefix probability is ``psi(h) = sum over all label sequences y that
start with h of P_ctc(y | x)``. Two forward variables per frame t carry it (log space):
``r^n_t(h)`` (frames 1..t collapse to h, frame t emits the last label of h) and ``r^b_t(h)`` (the
same, frame t is blank). A frame index 0 before the first frame gives the empty prefix
``r^b_0 = 0`` (probability 1) and every other start value -inf, so no special first frame exists.
For a candidate c after h (g = h, x_t = log-probabilities of frame t):

    phi_s(h, c)   = r^b_s(h) (+) [r^n_s(h) if c != last(h)]          s = 0 .. T-1  ((+) = logaddexp)
    r^n_t(h+c)    = (r^n_{t-1}(h+c) (+) phi_{t-1}) + x_t(c)
    r^b_t(h+c)    = (r^n_{t-1}(h+c) (+) r^b_{t-1}(h+c)) + x_t(blank)
    psi(h+c)      = (+)_{t=1..T} phi_{t-1} + x_t(c)
    psi(h+<eos>)  = r^n_T(h) (+) r^b_T(h)                             (= log P_ctc(h | x))

and a candidate scores ``psi(h+c) - psi(h)``, so the scores of a sequence and its <eos> sum to
``log P_ctc(y | x)`` (psi of the empty prefix is 0).

No loop over frames: each recursion above is a first-order linear recurrence in probability space,
``a_t = (a_{t-1} + u_{t-1}) * e_t``, whose solution is ``a_t = E_t * sum_{s<t} u_s / E_s`` with
``E_t = prod_{tau<=t} e_tau``: in log space a cumulative sum and one ``logcumsumexp``. The
differences of cumulative sums need float64 (the scorer computes in float64 and returns float64);
log-probabilities are floored at ``logp_floor`` so the cumulative sums stay finite (a probability
of exp(-1e4) is zero for any decision). A score call is then about twenty tensor ops over
(N, C, T), independent of T in Python overhead: O(N * C * T) memory, so keep C a pre-beam subset
for large vocabularies.

Padded frames (t >= the utterance's length) are set to log-probability 0: they only influence
forward variables at frames past the length, which the scores never read (the prefix sum stops at
the length and the end score reads frame T_u).

``score`` caches the candidates' forward variables in the state; ``select_state`` takes the chosen
ones from that cache, so nothing is recomputed. The row layout is the protocol's: row n belongs to
utterance ``n // beam``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from asrkit.search.greedy import check_ctc_inputs
from asrkit.search.interfaces import BLANK_ID, SOS_EOS_ID, GainBound

NEG_INF = float("-inf")


@dataclass
class CTCPrefixState:
    """State of N hypotheses (row n = b*beam + k). Mutable: ``score`` fills the ``cand_*`` cache."""

    r_n: torch.Tensor  # (N, T+1) float64 log r^n_t(h), t = 0 .. T
    r_b: torch.Tensor  # (N, T+1) float64 log r^b_t(h)
    psi: torch.Tensor  # (N,) float64 log prefix probability of h
    last: torch.Tensor  # (N,) long last token of h, -1 for the empty prefix
    frames: torch.Tensor  # (N,) long valid frames T_u of the row's utterance
    cand: Optional[torch.Tensor] = None  # (N, C) tokens of the last score call
    cand_r_n: Optional[torch.Tensor] = None  # (N, C, T+1)
    cand_r_b: Optional[torch.Tensor] = None  # (N, C, T+1)
    cand_psi: Optional[torch.Tensor] = None  # (N, C)


class CTCPrefixScorer:
    """CTC prefix scorer over B utterances; meets :class:`asrkit.search.interfaces.BatchScorer`.

    log_probs: (B, T, V) CTC log-probabilities (blank ``blank_id``); lengths: (B,) valid frames.
    ``score`` of the token ``eos_id`` is the end score ``log P_ctc(h | x) - psi(h)``, of the blank
    -inf (a label-synchronous search never emits it). ``final_score`` is the end score too.
    """

    def __init__(self, log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int = BLANK_ID,
                 eos_id: int = SOS_EOS_ID, logp_floor: float = -1e4) -> None:
        check_ctc_inputs(log_probs, lengths)  # shapes, lengths within the frames, no NaN (host syncs: once)
        batch, frames, vocab = log_probs.shape
        if frames == 0:  # one padded frame keeps every tensor op well-defined
            log_probs, frames = log_probs.new_zeros(batch, 1, vocab), 1
        self.blank_id, self.eos_id, self.vocab_size = blank_id, eos_id, vocab
        self.lengths = lengths.to(log_probs.device, torch.long)
        lp = log_probs.detach().to(torch.float64).clamp(min=logp_floor)
        valid = torch.arange(frames, device=lp.device) < self.lengths[:, None]  # (B, T)
        lp = lp.masked_fill(~valid[..., None], 0.0)
        self.valid = valid
        self.x = lp.transpose(1, 2).contiguous()  # (B, V, T): candidates are gathered along V
        self.blank_cum = lp[..., blank_id].cumsum(1)  # (B, T) log prod of blank probs over frames 1..t

    def init_state(self, batch: int, beam: int, device: torch.device) -> CTCPrefixState:
        """All rows at the empty prefix: r^n = -inf, r^b_t = log prod_{tau<=t} P(blank)."""
        if batch != self.x.shape[0]:
            raise ValueError(f"CTCPrefixScorer holds {self.x.shape[0]} utterances, the search has {batch}")
        r_b = F.pad(self.blank_cum, (1, 0)).repeat_interleave(beam, 0)  # (N, T+1), r^b_0 = 0
        n = batch * beam
        return CTCPrefixState(r_n=torch.full_like(r_b, NEG_INF), r_b=r_b,
                              psi=r_b.new_zeros(n), last=torch.full((n,), -1, dtype=torch.long, device=r_b.device),
                              frames=self.lengths.repeat_interleave(beam))

    def _end(self, state: CTCPrefixState) -> torch.Tensor:
        """(N,) log P_ctc(h | x) = r^n_T(h) (+) r^b_T(h) at the row's own length."""
        at = state.frames[:, None]
        return torch.logaddexp(state.r_n.gather(1, at), state.r_b.gather(1, at))[:, 0]

    def score(self, state: CTCPrefixState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) float64 psi(h+c) - psi(h); caches the candidates' forward variables."""
        batch, vocab, frames = self.x.shape
        n, c = tokens.shape
        beam = n // batch
        tok = tokens.clamp(0, vocab - 1)
        x = self.x.gather(1, tok.reshape(batch, beam * c, 1).expand(batch, beam * c, frames))
        x = x.view(n, c, frames)  # (N, C, T) log P(c) at frames 1..T
        repeat = (tokens == state.last[:, None])[..., None]  # (N, C, 1): c repeats h's last label
        rn_prev = state.r_n[:, None, :frames]  # (N, 1, T) r^n_s(h), s = 0 .. T-1
        phi = torch.logaddexp(state.r_b[:, None, :frames], rn_prev.masked_fill(repeat, NEG_INF))  # (N, C, T)

        # r^n_t = X_t + logcumsumexp_{s<t}(phi_s - X_s), X = cumulative log P(c) (X_0 = 0).
        cum_x = x.cumsum(-1)  # (N, C, T) X_1 .. X_T
        r_n = cum_x + torch.logcumsumexp(phi - F.pad(cum_x[..., :-1], (1, 0)), -1)  # (N, C, T) t = 1..T
        # r^b_t = Z_t + logcumsumexp_{s<t}(r^n_s - Z_s), Z = cumulative log P(blank), r^n_0 = -inf.
        cum_b = self.blank_cum.repeat_interleave(beam, 0)[:, None, :]  # (N, 1, T)
        r_n_prev = F.pad(r_n[..., :-1], (1, 0), value=NEG_INF)
        r_b = cum_b + torch.logcumsumexp(r_n_prev - F.pad(cum_b[..., :-1], (1, 0)), -1)  # (N, C, T)

        valid = self.valid.repeat_interleave(beam, 0)[:, None, :]  # (N, 1, T): only frames 1..T_u
        psi = torch.logsumexp((phi + x).masked_fill(~valid, NEG_INF), -1)  # (N, C)
        psi = torch.where(tokens == self.eos_id, self._end(state)[:, None], psi)
        psi = psi.masked_fill(tokens == self.blank_id, NEG_INF)

        state.cand, state.cand_psi = tokens, psi
        state.cand_r_n = F.pad(r_n, (1, 0), value=NEG_INF)  # frame 0: h+c is not empty
        state.cand_r_b = F.pad(r_b, (1, 0), value=NEG_INF)
        # An impossible prefix (psi = -inf) has only impossible extensions: -inf, not -inf - -inf = NaN.
        old = state.psi[:, None]
        return torch.where(old == NEG_INF, NEG_INF, psi - old)

    def select_state(self, state: CTCPrefixState, index: torch.Tensor, tokens: torch.Tensor) -> CTCPrefixState:
        """Rows ``index`` (M,) extended by ``tokens`` (M,), taken from the last ``score`` call's cache.

        A token that was not a candidate of its row in that call (or -1) leaves the row unchanged.
        """
        r_n, r_b, psi, last = state.r_n[index], state.r_b[index], state.psi[index], state.last[index]
        if state.cand is not None:  # a Python attribute, not a tensor value: no host sync
            match = state.cand[index] == tokens[:, None]  # (M, C)
            found = match.any(1)
            col = match.to(torch.uint8).argmax(1)  # first matching column (0 if none: masked below)
            r_n = torch.where(found[:, None], state.cand_r_n[index, col], r_n)
            r_b = torch.where(found[:, None], state.cand_r_b[index, col], r_b)
            psi = torch.where(found, state.cand_psi[index, col], psi)
            last = torch.where(found, tokens, last)
        return CTCPrefixState(r_n, r_b, psi, last, state.frames[index])

    def final_score(self, state: CTCPrefixState) -> torch.Tensor:
        """(N,) float64 end score log P_ctc(h | x) - psi(h)."""
        return torch.where(state.psi == NEG_INF, NEG_INF, self._end(state) - state.psi)

    def max_gain(self) -> GainBound:
        """Nothing to gain: the paths through a longer prefix are a subset of those through a shorter one, so
        psi never grows (and log P_ctc(h | x) <= psi(h))."""
        return 0.0, 0.0, False
