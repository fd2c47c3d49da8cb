"""The torch frame loop of CTC prefix beam search, batched over (utterance, beam) tensors.

Every hypothesis is a distinct label prefix with two log-probabilities (Hannun et al., 2014):
``pb`` (all alignments ending in blank) and ``pnb`` (ending in its last token). Per frame each of
the K hypotheses of an utterance offers C "extension" candidates (prefix + a pre-selected token)
and one "stay" candidate (same prefix: blank or a repeat of its last token); a repeat of the last
token right after a blank is an extension, a repeat without blank is not. One ``topk`` over the
K*(C+1) candidate scores of each utterance picks the next beam.

Merging without dictionaries: an extension ``p + c`` can only duplicate a stay, namely of the
hypothesis whose prefix is ``p + c``. Each hypothesis carries a rolling hash of its prefix and of
its parent prefix (prefix minus last token); a (B, K, K) comparison (a sorted search for beams
over 20) finds, for every hypothesis, its parent inside the beam, whose extension is folded into
the stay (logaddexp) and removed. Hashes are int64 polynomials mod 2**64 (torch integer
arithmetic wraps); a false merge needs two different prefixes with equal hashes, about
K*K*T / 2**64 per utterance.

Shallow fusion: a candidate's score is ``ctc + sum_k w_k * scorer_k``; scorers see only the
(N, C) pre-selected extension tokens of the frame and their states follow the hypotheses through
``select_state``. A stay never re-scores its unchanged prefix: its fused score is carried.
``weights["length_bonus"]`` without a scorer of that name adds a constant per emitted token.

Pruning (approximate; all three off gives the exact search): ``token_topk`` keeps the best C
non-blank tokens per frame and ``token_min_logp`` drops tokens below a log-probability; both
limit which *new* prefixes a frame creates, while probability flowing into a prefix already in
the beam is always counted. ``blank_skip_threshold`` treats frames whose blank probability
exceeds it as pure blank frames (no emissions, repeat paths dropped); runs of such frames
collapse into one state update, so the loop only visits the other ("compacted") frames.
On peaky CTC outputs the defaults agree with the exact search on >= 99% of utterances (tested).

Cost model (why the code looks like this). The (B, T, V) input is read once, before the loop: the
best C tokens of each kept frame (:func:`asrkit.search.candidates.top_tokens`) give the (B, T', C)
candidate table, and everything else works on that
table and on the blank column. The loop reads the full input only for the K "own last token"
log-probabilities per frame (a gather of B*K numbers). A run of skipped blank frames adds the same
log-probability to every hypothesis of an utterance, which changes no ranking: it is applied once,
at the end, and the loop only moves the mass of ``pnb`` into ``pb`` (folded into the gather of the
new beam). A frame step is about 25 small torch ops (it was 70-95), since each costs a few
microseconds of dispatch on CPU; the candidate tables of a step are built whole (ids, hashes,
scores) and the new beam is one gather from them.


The per-frame loop (:func:`frame_loop`) reads no tensor value on the host; results are converted once at the
end. Built ``bucketed`` (:class:`FrameTables`), the tables have a fixed shape for a bucket of batches and
every per-frame branch is data-driven, so that the loop can be captured once and replayed for other batches
(:mod:`asrkit.search.prefix_graph`). The public entry point is :func:`asrkit.search.ctc_prefix_beam_search`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import torch

from asrkit.search import fused_step
from asrkit.search.candidates import top_tokens
from asrkit.search.compaction import compact_frames
from asrkit.search.hypotheses import NBest, backtrack, pack_emissions
from asrkit.search.interfaces import BLANK_ID, HASH_MUL, SENT_HASH, SENT_PARENT, BatchScorer

NEG_INF = float("-inf")
_DENSE_MATCH_MAX_BEAM = 20  # measured crossover of the two parent searches (CPU)
_WIDE_MIN = 32  # exact search over more tokens than this: per-pick hash bookkeeping (measured, CPU)


def _steps(x: torch.Tensor) -> torch.Tensor:
    """(B, T', ...) -> (T', B, ...) contiguous: step i's tensor is a view ``x[i]``."""
    return x.transpose(0, 1).contiguous()


def candidate_count(vocab: int, topk: Optional[int]) -> int:
    """C: the extension candidates per hypothesis and frame (every non-blank token without ``token_topk``)."""
    return vocab - 1 if topk is None else max(1, min(topk, vocab - 1))


def is_wide(vocab: int, n_cand: int) -> bool:
    """Every token a candidate and many of them: per-pick bookkeeping beats whole candidate tables."""
    return n_cand == vocab - 1 and n_cand > _WIDE_MIN


def bucket_steps(width: int) -> int:
    """Compacted frames rounded up to a bucket: a multiple of 16 up to 128, then of 1/8 of the power of two below
    (at most 12.5% padding), so that batches of similar lengths share one captured loop."""
    if width <= 128:
        return max(16, -(-width // 16) * 16)
    quantum = 1 << (width.bit_length() - 4)
    return -(-width // quantum) * quantum


class FrameTables:
    """Per-batch tables, built once before the loop (host syncs allowed here).

    Compacted frame i of utterance b is original frame ``frame[b, i]`` (-1 = padding, a frame that
    changes nothing). Candidate columns per hypothesis: 0..C-1 = extension by token ``tokx[i][b, c]``,
    C = stay (token -1). Per-frame tensors are views of step-major tables so the loop only picks an element;
    the Python bool lists ``pad_steps`` / ``run_steps`` say which steps need padding or skipped-run handling.
    ``bucketed``: the steps are padded to :func:`bucket_steps` and every step does both (data-driven: a step
    without padding adds 0, one before no run reads the plain rows), so that batches of one bucket have tables of
    the same shapes and :meth:`load` can refill the tables of a captured loop.
    """

    def __init__(self, lp: torch.Tensor, lengths: torch.Tensor, beam: int, topk: Optional[int],
                 min_logp: Optional[float], skip_threshold: Optional[float], rows_out: int,
                 bucketed: bool = False) -> None:
        batch, frames, vocab = lp.shape
        dev = lp.device
        frame, skip, offset, identity = compact_frames(lp, lengths, BLANK_ID, skip_threshold)
        if bucketed:
            frame = torch.nn.functional.pad(frame, (0, bucket_steps(frame.shape[1]) - frame.shape[1]), value=-1)
            identity = False
        self.skip = skip
        self.steps = width = frame.shape[1]
        blank = lp[..., BLANK_ID]  # (B, T)
        self.frame = frame
        real = frame >= 0  # (B, T')
        at = frame.clamp(min=0)
        rows = (torch.arange(batch, device=dev)[:, None] * frames + at).flatten()  # (B*T',) input rows
        flat = lp.reshape(batch * frames, vocab)
        self.n_cand = n_cand = candidate_count(vocab, topk)
        if n_cand < vocab - 1:
            # The one full-size read: the best C tokens of each kept frame (candidates.top_tokens:
            # cheaper than torch.topk per row; kept rows are copied in cache-sized chunks).
            cval, cidx = top_tokens(flat, None if identity else rows, n_cand, BLANK_ID)  # (B*T', C)
            ctok = cidx.view(batch, width, n_cand)
        else:  # exact search: every token is a candidate
            cval = (flat if identity else flat.index_select(0, rows))[:, 1:]
            ctok = torch.arange(1, vocab, device=dev).expand(batch, width, n_cand)
        cval = cval.reshape(batch, width, n_cand)
        drop = ~real[..., None]  # padding frames create nothing
        if min_logp is not None:
            drop = drop | (cval < min_logp)
        cval = cval.masked_fill(drop, NEG_INF)
        tok_all = torch.full((batch, width, n_cand + 1), -1, dtype=torch.long, device=dev)
        tok_all[..., :n_cand] = ctok
        self.tok_all = _steps(tok_all)  # (T', B, C+1): column C (stay) is -1
        self.tokx = self.tok_all.unbind(0)  # (B, C+1) views
        self.ctok = [t[:, None, :n_cand] for t in self.tokx]  # (B, 1, C)
        self.ctok_k = [t.expand(batch, beam, n_cand) for t in self.ctok]  # (B, K, C) views
        cval_t = _steps(cval[:, :, None])  # (T', B, 1, C): broadcasts over the beam
        self.cval = cval_t.unbind(0)
        lpb = blank.gather(1, at).masked_fill(~real, 0.0)  # padding: P(blank) = 1 changes nothing
        lpb_t = _steps(lpb[..., None])  # (T', B, 1)
        self.lpb = lpb_t.unbind(0)
        # log P(own last token) per step: a gather from the input frame's (B, V) rows.
        tables = {"tok_all": self.tok_all, "cval": cval_t, "lpb": lpb_t, "frame": frame, "offset": offset}
        self.flat_lp: Optional[torch.Tensor] = None
        self.base: List[torch.Tensor] = []
        if identity:
            self.lp_rows: Optional[List[torch.Tensor]] = list(lp.unbind(1))  # (B, V) views
        elif bucketed:  # the kept frames' rows, step-major: one gather per step, as without compaction
            rows_t = _steps(flat.index_select(0, rows).view(batch, width, vocab))  # (T', B, V)
            self.lp_rows, tables["lp_rows"] = list(rows_t.unbind(0)), rows_t
        else:
            self.lp_rows, self.flat_lp = None, lp.reshape(-1)
            self.base = list(_steps(rows.view(batch, width, 1) * vocab).unbind(0))  # (B, 1) offsets of the rows
        pad = ~real
        self.pad_steps: List[bool] = [True] * width if bucketed else pad.any(0).tolist()
        pad_t = _steps(torch.zeros_like(lpb).masked_fill(pad, NEG_INF)[..., None])  # (T', B, 1)
        self.pad_bias, tables["pad_bias"] = pad_t.unbind(0), pad_t
        # Skipped blank frames: their log P(blank) is the same for every hypothesis of an utterance,
        # so it is added once at the end (offset); after a run, pnb's mass moves into pb, which the
        # gather of the new beam does by reading other table rows (roff) on the steps before a run.
        self.offset = offset
        self.run_steps: List[bool] = [False] * width
        self.roff: List[Optional[torch.Tensor]] = [None] * width
        # bucketed: (T', B) 1 where a run of skipped frames follows the step (the fused kernel's form of roff)
        self.run_after: Optional[torch.Tensor] = None
        if bucketed:
            self.run_after = tables["run_after"] = torch.zeros((width, batch), dtype=torch.int32, device=dev)
        if skip is not None or (bucketed and skip_threshold is not None):
            nxt = torch.nn.functional.pad(frame[:, 1:], (0, 1), value=-1)  # next kept frame
            run_after = (nxt - frame > 1) & (nxt >= 0)  # (B, T'): skipped frames between i and i+1
            self.run_steps = [True] * width if bucketed else run_after.any(0).tolist()
            cols = n_cand + 1
            stride = (beam + 1) * cols  # one row of the candidate table
            plain = torch.arange(rows_out, device=dev) * stride  # rows pnb, pb, tot, fused
            moved = plain.clone()
            moved[0], moved[1] = 4 * stride, 2 * stride  # pnb <- the -inf row, pb <- tot (no host array: no copy)
            roff = _steps(torch.where(run_after[..., None], moved, plain)[..., None])  # (T', B, R, 1)
            self.roff = [r if any_run else None for r, any_run in zip(roff.unbind(0), self.run_steps)]
            tables["roff"] = roff
            if self.run_after is not None:
                self.run_after.copy_(run_after.t())
        self.tables = tables

    def load(self, other: "FrameTables") -> None:
        """Copy the tables of ``other`` (bucketed, of the same shapes) into this one's tensors, which a
        captured loop reads."""
        for name, table in self.tables.items():
            table.copy_(other.tables[name])


class BeamRows(NamedTuple):
    """The search state that carries from one frame to the next (a stream holds it between chunks).

    st: (B, 4, K+1) rows pnb, pb, tot (their logaddexp), fused (sum of weighted scorer scores), slot K -inf;
    ints: (B, 4, K) rows prefix hash, parent-prefix hash, last token (blank for the empty prefix), "single" = 1
    unless the last two tokens are equal (a merge into a prefix comes from its parent's total, or only from the
    parent's pb when the prefix ends in a doubled token); states: each scorer's state, B*K rows.
    """

    st: torch.Tensor
    ints: torch.Tensor
    states: Dict[str, Any]


def fresh_rows(batch: int, beam: int, dtype: torch.dtype, device: torch.device,
               scorers: Mapping[str, BatchScorer]) -> BeamRows:
    """The state before the first frame: one live hypothesis, the empty prefix."""
    st = torch.full((batch, 4, beam + 1), NEG_INF, dtype=dtype, device=device)
    st[:, 1:3, 0] = 0.0
    st[:, 3, :beam] = 0.0
    ints = torch.zeros((batch, 4, beam), dtype=torch.long, device=device)
    ints[:, 0, 1:] = SENT_HASH
    ints[:, 1] = SENT_PARENT
    return BeamRows(st, ints, {name: sc.init_state(batch, beam, device) for name, sc in scorers.items()})


class BeamState:
    """Search state for B utterances x K hypotheses, in buffers updated in place.

    Views into the buffers are made once here, so a frame step creates few tensors. Index K
    stands for "no parent in the beam": it addresses a -inf slot and a trash hypothesis.
    """

    def __init__(self, batch: int, beam: int, steps: int, n_cand: int, dtype: torch.dtype,
                 device: torch.device, scorers: Mapping[str, BatchScorer], bonus: float, wide: bool = False,
                 start: Optional[BeamRows] = None) -> None:
        full: Dict[str, Any] = dict(dtype=dtype, device=device)
        long: Dict[str, Any] = dict(dtype=torch.long, device=device)
        if start is None:
            start = fresh_rows(batch, beam, dtype, device, scorers)
        cols = n_cand + 1
        self.beam, self.cols = beam, cols
        self.fusion = bool(scorers) or bonus != 0.0
        self.rows = rows = 4 if self.fusion else 3  # table rows the new beam is gathered from
        # (B, 4, K+1) rows: pnb, pb, tot (their logaddexp), fused (sum of weighted scorer scores); slot K -inf.
        self.st = start.st
        self.pnb, self.pb, self.tot, self.fused = self.st[:, :, :beam].unbind(1)
        self.pnb3, self.pb3, self.tot3, self.fused3 = (x[:, :, None] for x in (self.pnb, self.pb, self.tot, self.fused))
        self.new = self.st[:, :rows, :beam]  # gather target of the new beam
        self.nb_tot = self.st[:, 0:3:2, :beam]  # pnb, tot: cleared on dead picks
        self.pb_tot = self.st.view(batch, 4 * (beam + 1), 1)[:, beam + 1:]  # pb at k, tot at K+1+k
        # Candidate table (B, 5, (K+1)*(C+1)) rows: pnb, pb (-inf but for stays), tot, fused, -inf;
        # hypothesis k owns columns k*(C+1) .. k*(C+1)+C of a row, the last being its stay.
        width = beam * cols
        self.tab = torch.full((batch, 5, (beam + 1) * cols), NEG_INF, **full)
        tnb = self.tnb = self.tab[:, 0, :width].view(batch, beam, cols)
        self.ext_nb, self.stay_nb3 = tnb[:, :, :n_cand], tnb[:, :, n_cand:]
        self.stay_b3 = self.tab[:, 1, :width].view(batch, beam, cols)[:, :, n_cand:]
        self.stay_b = self.stay_b3[:, :, 0]
        self.stay_tot3 = self.tab[:, 2, :width].view(batch, beam, cols)[:, :, n_cand:]
        self.nb_row, self.b_row, self.tot_row = self.tab[:, 0, :width], self.tab[:, 1, :width], self.tab[:, 2, :width]
        self.nb_cells = self.tab[:, 0, :, None]  # (B, (K+1)*(C+1), 1) scatter target
        self.tab_r = self.tab[:, :rows]
        self.tab_x = self.tab.view(batch, 1, 5 * (beam + 1) * cols).expand(batch, rows, 5 * (beam + 1) * cols)
        self.cand = self.tot_row
        if self.fusion:
            self.fus = self.tab[:, 3, :width].view(batch, beam, cols)
            self.cand = torch.empty((batch, width), **full)
            # What an extension adds to the fused score besides scorers: the length bonus (not the stay).
            self.bonus = torch.full((1, 1, cols), bonus, **full)
            self.bonus[..., n_cand] = 0.0
            self.fusion_buf = self.bonus.expand(batch, beam, cols).clone()  # + weighted scorer scores
            self.fusion_ext = self.fusion_buf[:, :, :n_cand]
            self.bonus_ext = self.bonus[:, :, :n_cand]  # a view made once: indexing costs microseconds per step
        self.ints = start.ints
        self.hash, self.parent_hash, self.last, self.single = self.ints.unbind(1)
        self.hash3, self.last3, self.single3 = self.hash[:, :, None], self.last[:, :, None], self.single[:, :, None]
        self.child_view = self.ints[:, 1, :, None]  # (B, K1, 1) parent-prefix hash of k1
        self.parent_view = self.ints[:, 0, None, :]  # (B, 1, K2) prefix hash of k2
        self.match = torch.ones((batch, beam, beam + 1), dtype=torch.bool, device=device)  # column K: "none"
        self.match_real = self.match[:, :, :beam]
        self.sentinel = torch.tensor([SENT_HASH, SENT_PARENT, BLANK_ID, 0], device=device)[None, :, None]
        # Candidate ints (B, 4, K, C+1), the same rows as ints: built whole per step, then gathered;
        # with every token a candidate (wide) only the K picks get ints (see _pick_ints).
        self.wide = wide
        self.cint = torch.empty((batch, 4, beam, cols if not wide else 1), **long)
        self.ci_hash, self.ci_par, self.ci_last, self.ci_single = self.cint[..., :n_cand].unbind(1)
        self.ci_stay = self.cint[..., -1]
        self.cint_flat = self.cint.view(batch, 4, beam * (cols if not wide else 1))
        # eq[b, k, c]: candidate c is hypothesis k's own last token; column C is always True ("none").
        self.eq = torch.ones((batch, beam, cols if not wide else 1), dtype=torch.bool, device=device)
        self.eq_ext = self.eq[:, :, :n_cand]
        self.col_any = torch.empty((batch, beam, 1), dtype=torch.bool, device=device)  # max's values
        self.col = torch.empty((batch, beam, 1), **long)
        self.par_any, self.par = torch.empty_like(self.col_any), torch.empty_like(self.col)
        self.hash_ext = self.hash3.expand(batch, beam, n_cand)
        self.hist = torch.zeros((steps, batch, beam), **long)  # topk picks
        self.hist_steps = self.hist.unbind(0)
        self.pick_r = self.hist[:, :, None, :].expand(steps, batch, rows, beam).unbind(0)
        self.pick4 = self.hist[:, :, None, :].expand(steps, batch, 4, beam).unbind(0)
        self.top = torch.empty((batch, beam), **full)
        self.lp_last = torch.empty((batch, beam), **full)
        self.lp_last3 = self.lp_last[:, :, None]
        self.parent = torch.empty((batch, beam), **long)
        self.dead = torch.empty((batch, beam), dtype=torch.bool, device=device)
        self.dead4 = self.dead[:, None, :]
        self.row0 = torch.arange(batch, device=device)[:, None] * beam  # (B, 1) flat row offsets
        self.states = dict(start.states)
        self.start_states = dict(start.states)  # what the first step reads (a captured loop's inputs)
        # Streaming (resume_search): per step, (B, 1) rows that are padding, whose pnb/pb split a step must keep.
        self.hold: Optional[List[torch.Tensor]] = None
        self.nb_b = self.st[:, :2, :beam]  # pnb, pb
        self.held = torch.empty_like(self.nb_b)
        # The CTC arithmetic of each step as one Triton kernel (asrkit.search.fused_step; prefix_graph turns it on).
        self.fused_step = False
        self.token = torch.empty((batch, beam), **long)  # the fused step's picked tokens (-1: a stay)

    def restart(self, start: BeamRows) -> None:
        """Refill the buffers with ``start`` (same shapes) so that the loop can run again on other tables."""
        self.st.copy_(start.st)
        self.ints.copy_(start.ints)
        for name, state in start.states.items():
            _copy_into(self.start_states[name], state)


def _copy_into(dst: Any, src: Any) -> None:
    """Copy a scorer state's tensors (a tensor, or tuples / dicts of them) into another of the same structure."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s_ in zip(dst, src):
            _copy_into(d, s_)
    elif isinstance(dst, dict):
        for key in dst:
            _copy_into(dst[key], src[key])
    elif dst != src:
        raise TypeError(f"restart: a scorer state holds {type(dst).__name__} values that differ ({dst!r} vs {src!r})")


def step(i: int, s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer],
          weights: Mapping[str, float]) -> None:
    """Advance every utterance by compacted frame i (no host sync)."""
    beam, cols = s.beam, s.cols
    if fr.lp_rows is not None:  # (B, K) log P(own last token) this frame
        torch.gather(fr.lp_rows[i], 1, s.last, out=s.lp_last)
    else:
        torch.take(fr.flat_lp, torch.add(fr.base[i], s.last), out=s.lp_last)
    if fr.pad_steps[i]:
        s.lp_last.add_(fr.pad_bias[i])
    # Extensions: from pb and pnb, but a repeat of the own last token only from pb.
    ctok = fr.ctok[i]  # (B, 1, C)
    if s.wide:  # every token is a candidate, token v in column v-1: fix the one repeat column per hypothesis
        torch.add(s.tot3, fr.cval[i], out=s.ext_nb)
        col = torch.remainder(torch.sub(s.last3, 1), cols)  # (B, K, 1); the empty prefix's blank -> C
        s.tnb.scatter_(2, col, s.pb3 + s.lp_last3)  # column C (the stay) is rewritten below
    else:
        torch.eq(ctok, s.last3, out=s.eq_ext)  # (B, K, C)
        torch.where(s.eq_ext, s.pb3, s.tot3, out=s.ext_nb)
        s.ext_nb.add_(fr.cval[i])
        col = torch.max(s.eq, 2, True, out=(s.col_any, s.col))[1]  # (B, K, 1) own last token's column; C: none
    # Merge: k2 is the parent of k1 when hash[k2] == parent_hash[k1]; extension (k2, last[k1]) is
    # then k1's prefix: it folds into k1's stay and leaves the candidates. par = K: no parent.
    par = _find_parents(s)  # (B, K, 1)
    s.nb_cells.scatter_(1, torch.add(col, par, alpha=cols), NEG_INF)  # K*cols+: trash; stays rewritten below
    src = s.pb_tot.gather(1, torch.add(par, s.single3, alpha=beam + 1))  # parent's pb or total
    torch.add(torch.logaddexp(s.pnb3, src), s.lp_last3, out=s.stay_nb3)
    torch.add(s.tot, fr.lpb[i], out=s.stay_b)  # stay via blank
    if s.cols > 16:  # logaddexp is costly per element: pb is -inf but for the stays
        s.tot_row.copy_(s.nb_row)
        torch.logaddexp(s.stay_nb3, s.stay_b3, out=s.stay_tot3)
    else:
        torch.logaddexp(s.nb_row, s.b_row, out=s.tot_row)
    if s.fusion:
        if scorers:
            _score_candidates(i, s, fr, scorers, weights)
        torch.add(s.fusion_buf, s.fused3, out=s.fus)
        torch.add(s.tot_row, s.fus.view(s.cand.shape), out=s.cand)
    top, pick = torch.topk(s.cand, beam, 1, True, False, out=(s.top, s.hist_steps[i]))

    # The new beam: (pnb, pb, tot[, fused]) of the chosen candidates; before a run of skipped
    # blank frames pnb reads the -inf row and pb the total.
    hold = s.hold is not None and fr.pad_steps[i]
    if hold:
        s.held.copy_(s.nb_b)
    if fr.run_steps[i]:
        torch.gather(s.tab_x, 2, torch.add(s.pick_r[i], fr.roff[i]), out=s.new)
    else:
        torch.gather(s.tab_r, 2, s.pick_r[i], out=s.new)
    torch.isneginf(top, out=s.dead)  # fewer live candidates than K: no hash, no merges
    if hold:
        keep_padded(s, pick, s.hold[i])
    if scorers or s.wide:
        parent = torch.div(pick, cols, rounding_mode="floor", out=s.parent)
        token = fr.tokx[i].gather(1, torch.sub(pick, parent, alpha=cols))  # (B, K), -1 for stays
    if scorers:
        s.nb_tot.masked_fill_(s.dead4, NEG_INF)  # a scorer's -inf leaves a finite CTC score on a dead pick
        rows = (parent + s.row0).view(-1)
        for name, sc in scorers.items():
            s.states[name] = sc.select_state(s.states[name], rows, token.view(-1))
    if s.wide:  # hash bookkeeping of the K picks only (the candidate tables would be (B, 4, K, V))
        _pick_ints(s, parent, token)
        return
    # Hash bookkeeping: the ints of every candidate, then one gather.
    torch.add(ctok, s.hash3, alpha=HASH_MUL, out=s.ci_hash)
    s.ci_par.copy_(s.hash_ext)
    s.ci_last.copy_(fr.ctok_k[i])
    torch.ne(ctok, s.last3, out=s.ci_single)
    s.ci_stay.copy_(s.ints)
    torch.gather(s.cint_flat, 2, s.pick4[i], out=s.ints)
    torch.where(s.dead4, s.sentinel, s.ints, out=s.ints)


def keep_padded(s: BeamState, pick: torch.Tensor, pad: torch.Tensor) -> None:
    """Streaming: on a padding step (pad (B, 1)) a live pick is a stay with the same total, but the stay moved
    pnb into pb (a blank frame). A stream resumes after its padding, so its rows get their own split back."""
    parent = torch.div(pick, s.cols, rounding_mode="floor")[:, None, :].expand_as(s.held)
    kept = torch.logical_and(pad, torch.logical_not(s.dead))[:, None, :]  # (B, 1, K)
    s.nb_b.copy_(torch.where(kept, s.held.gather(2, parent), s.nb_b))


def _pick_ints(s: BeamState, parent: torch.Tensor, token: torch.Tensor) -> None:
    """Ints of the new beam from the parents' (wide candidate sets): token -1 = a stay."""
    old = torch.gather(s.ints, 2, parent[:, None, :].expand_as(s.ints))  # (B, 4, K) the parents' ints
    old_hash, old_parent, old_last, old_single = old.unbind(1)
    is_ext = token >= 0
    torch.where(is_ext, torch.add(token, old_hash, alpha=HASH_MUL), old_hash, out=s.hash)
    torch.where(is_ext, old_hash, old_parent, out=s.parent_hash)
    torch.where(is_ext, token, old_last, out=s.last)
    torch.where(is_ext, (token != old_last).long(), old_single, out=s.single)
    torch.where(s.dead4, s.sentinel, s.ints, out=s.ints)


def _find_parents(s: BeamState) -> torch.Tensor:
    """(B, K, 1): the beam index of each hypothesis's parent prefix, or K if it is not in the beam."""
    beam = s.beam
    if beam <= _DENSE_MATCH_MAX_BEAM:  # a (B, K, K) comparison is the fewest ops
        torch.eq(s.child_view, s.parent_view, out=s.match_real)
        return torch.max(s.match, 2, True, out=(s.par_any, s.par))[1]  # first True; column K is always True
    # Larger beams: binary search of each parent hash among the sorted hashes, O(K log K).
    hashes, order = s.hash.sort(1)
    parent_hash = s.parent_hash.contiguous()
    at = torch.searchsorted(hashes, parent_hash).clamp_(max=beam - 1)
    return torch.where(hashes.gather(1, at) == parent_hash, order.gather(1, at), beam)[:, :, None]


def _score_candidates(i: int, s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer],
                      weights: Mapping[str, float]) -> None:
    """Weighted scorer scores (+ length bonus) of this frame's extension tokens into s.fusion_ext."""
    batch, beam = s.pnb.shape
    n_cand = fr.n_cand
    tokens = fr.ctok_k[i].reshape(batch * beam, n_cand)  # (N, C): a copy of the expanded (B, K, C) view
    for j, (name, sc) in enumerate(scorers.items()):
        scores = sc.score(s.states[name], tokens).view(batch, beam, n_cand).to(s.fusion_buf.dtype)
        if j == 0:
            torch.add(s.bonus_ext, scores, alpha=weights[name], out=s.fusion_ext)
        else:
            s.fusion_ext.add_(scores, alpha=weights[name])


def frame_loop(s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer],
               weights: Mapping[str, float]) -> None:
    """All frames; tests run this under patches that fail on any host sync."""
    if s.fused_step:
        _fused_loop(s, fr, scorers, weights)
        return
    for i in range(fr.steps):
        step(i, s, fr, scorers, weights)


def _fused_loop(s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer],
                weights: Mapping[str, float]) -> None:
    """The frames through :mod:`asrkit.search.fused_step`: all in one launch without scorers, else one launch per
    step between the scorers' scores and their state selection."""
    if not scorers:
        fused_step.run_steps(s, fr, 0, fr.steps, has_scorers=False)
        return
    for i in range(fr.steps):
        _score_candidates(i, s, fr, scorers, weights)
        fused_step.run_steps(s, fr, i, 1, has_scorers=True)
        rows = (s.parent + s.row0).view(-1)
        for name, sc in scorers.items():
            s.states[name] = sc.select_state(s.states[name], rows, s.token.view(-1))




class Ranked(NamedTuple):
    """The end of a search as tensors: (B, N) totals and CTC scores, best first, and (B, N, T') their paths."""

    total: torch.Tensor
    ctc: torch.Tensor
    paths: torch.Tensor


def rank(s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer], weights: Mapping[str, float],
         nbest: int) -> Ranked:
    """End-of-sentence scores, sort, backtrack (no host sync: a captured loop includes it)."""
    ctc = s.tot + fr.offset[:, None]  # + the skipped blank frames
    total = ctc + s.fused
    for name, sc in scorers.items():
        total = total + weights[name] * sc.final_score(s.states[name]).view(total.shape).to(total.dtype)
    total, order = total.topk(nbest, 1)  # best first
    ctc = ctc.gather(1, order)
    paths = backtrack(*backpointers(s, fr), order)  # (B, N, T')
    return Ranked(total, ctc, paths)


def to_nbest(ranked: Ranked, frame: torch.Tensor) -> NBest:
    """Ranked paths (frame: (B, T') the input frame of each step) -> an NBest (one host sync)."""
    total, ctc, paths = ranked
    dead = total == NEG_INF
    paths = paths.masked_fill(dead[:, :, None], -1)
    tokens, token_frames, lengths = pack_emissions(paths, frame[:, None, :].expand_as(paths))
    return NBest(tokens, lengths, total, ctc.masked_fill(dead, NEG_INF), token_frames)


def finish(s: BeamState, fr: FrameTables, scorers: Mapping[str, BatchScorer], weights: Mapping[str, float],
           nbest: int) -> NBest:
    """End-of-sentence scores, sort, backtrack into an NBest."""
    return to_nbest(rank(s, fr, scorers, weights, nbest), fr.frame)


def backpointers(s: BeamState, fr: FrameTables) -> Tuple[torch.Tensor, torch.Tensor]:
    """(T', B, K) each hypothesis's row in the previous step's beam, and the token it appended there (-1: none)."""
    parents = torch.div(s.hist, s.cols, rounding_mode="floor")
    return parents, fr.tok_all.gather(2, s.hist - parents * s.cols)


@contextlib.contextmanager
def search_threads(device: torch.device) -> Iterator[None]:
    """One intra-op thread on the CPU for the search, the setting restored after."""
    threads = torch.get_num_threads()
    if device.type == "cpu" and threads > 1:
        # Nearly every op works on a few thousand numbers: intra-op threads only add barriers
        # (2-5x slower measured on a loaded 2-core machine).
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def prepare(lp: torch.Tensor, lengths: torch.Tensor, beam: int, scorers: Mapping[str, BatchScorer], bonus: float,
            topk: Optional[int], min_logp: Optional[float], skip: Optional[float],
            start: Optional[BeamRows] = None) -> Tuple[BeamState, FrameTables]:
    """The tables of a batch and the beam to search them with (``start``: a state to resume from)."""
    fr = tables(lp, lengths, beam, scorers, bonus, topk, min_logp, skip)
    return beam_state(fr, lp, beam, scorers, bonus, start), fr


def beam_state(fr: FrameTables, lp: torch.Tensor, beam: int, scorers: Mapping[str, BatchScorer], bonus: float,
               start: Optional[BeamRows] = None) -> BeamState:
    """The beam that searches the tables ``fr`` of log-probs ``lp``."""
    return BeamState(lp.shape[0], beam, fr.steps, fr.n_cand, lp.dtype, lp.device, scorers, bonus,
                     is_wide(lp.shape[2], fr.n_cand), start)


def tables(lp: torch.Tensor, lengths: torch.Tensor, beam: int, scorers: Mapping[str, BatchScorer], bonus: float,
           topk: Optional[int], min_logp: Optional[float], skip: Optional[float],
           bucketed: bool = False) -> FrameTables:
    """A batch's :class:`FrameTables` for a beam of these scorers."""
    rows = 4 if scorers or bonus != 0.0 else 3
    return FrameTables(lp.contiguous(), lengths, beam, topk, min_logp, skip, rows, bucketed)


def blank_run(s: BeamState, rows: torch.Tensor) -> None:
    """After skipped blank frames (rows (B,) bool): all of a hypothesis's mass ends in blank, pnb in pb."""
    ran = rows[:, None]
    s.pb.copy_(torch.where(ran, s.tot, s.pb))
    s.pnb.masked_fill_(ran, NEG_INF)


