"""Frame-synchronous CTC prefix beam search, batched over (utterance, beam) tensors.

Every hypothesis is a distinct label prefix with two log-probabilities (Hannun et al., 2014):
``pb`` (all alignments ending in blank) and ``pnb`` (ending in its last token). Per frame each of
the K hypotheses of an utterance offers one "stay" candidate (same prefix: blank or a repeat of
its last token) and C "extension" candidates (prefix + a pre-selected token); a repeat of the last
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

The per-frame loop (:func:`_frame_loop`) reads no tensor value on the host; results are converted
once at the end. On CUDA, a batch that runs out of memory is split in half and retried. On CPU
the search runs with one intra-op thread (its tensors are tiny) and restores the setting after.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

import torch

from asrkit.search.greedy import check_ctc_inputs
from asrkit.search.hypotheses import NBest, backtrack, pack_emissions
from asrkit.search.interfaces import BLANK_ID, BatchScorer, active_scorers

_HASH_MUL = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64; odd, so the hash mixes all bits
_SENT_HASH = -0x3C6EF372FE94F82B  # hash of an impossible hypothesis: never equals a parent hash
_SENT_PARENT = 0x5BE0CD19137E2179  # parent hash of the empty prefix and of impossible hypotheses
NEG_INF = float("-inf")
_DENSE_MATCH_MAX_BEAM = 20  # measured crossover of the two parent searches (CPU)


class _Frames:
    """Per-batch tables, built once before the loop (host syncs allowed here).

    Compacted frame i of utterance b is original frame ``frame[b, i]`` (-1 = padding, a frame that
    changes nothing). Candidate columns per hypothesis: 0 = stay, 1..C = extension by token
    ``tok[i][b, c]``. Per-frame tensors are frame-major lists so the loop only picks an element.
    """

    def __init__(self, lp: torch.Tensor, lengths: torch.Tensor, beam: int, topk: Optional[int],
                 min_logp: Optional[float], skip_threshold: Optional[float]) -> None:
        batch, frames, vocab = lp.shape
        dev = lp.device
        in_len = torch.arange(frames, device=dev) < lengths[:, None]  # (B, T)
        skip = None
        keep = in_len
        if skip_threshold is not None:
            skip = (lp[..., BLANK_ID] > math.log(skip_threshold)) & in_len
            keep = in_len & ~skip
        counts = keep.sum(1)  # (B,)
        self.steps = width = int(counts.max()) if batch else 0
        slot = torch.where(keep, keep.cumsum(1) - 1, width)  # compacted position, or the spill column
        t_ids = torch.arange(frames, device=dev).expand(batch, frames)
        frame = torch.full((batch, width + 1), -1, dtype=torch.long, device=dev).scatter_(1, slot, t_ids)
        self.frame = frame[:, :width]  # (B, T')
        pad_row = torch.full((vocab,), NEG_INF, dtype=lp.dtype, device=dev)
        pad_row[BLANK_ID] = 0.0  # a pure blank frame with probability 1: leaves every total unchanged
        if skip is not None:
            real = self.frame >= 0
            lpc = lp.gather(1, self.frame.clamp(min=0)[..., None].expand(batch, width, vocab))
            lpc = torch.where(real[..., None], lpc, pad_row)
        elif bool((lengths < width).any()):
            lpc = torch.where(in_len[:, :width, None], lp[:, :width], pad_row)
        else:
            lpc = lp[:, :width]  # nothing to pad or compact: no copy
        lpc = lpc.transpose(0, 1)  # (T', B, V) frame-major view

        non_blank = lpc[..., 1:]  # ids 1.. (blank is id 0)
        self.n_cand = n_cand = vocab - 1 if topk is None else max(1, min(topk, vocab - 1))
        if n_cand < vocab - 1:
            cval, cidx = non_blank.topk(n_cand, dim=-1)
            ctok = cidx + 1
        else:
            cval = non_blank
            ctok = torch.arange(1, vocab, device=dev).expand(width, batch, vocab - 1)
        if min_logp is not None:
            cval = cval.masked_fill(cval < min_logp, NEG_INF)
        self.tok_all = torch.full((width, batch, n_cand + 1), -1, dtype=torch.long, device=dev)
        self.tok_all[..., 1:] = ctok  # (T', B, C+1); column 0 (stay) is -1
        # pos[i][b, v]: candidate column of token v, or 0 (the stay column) if v is not a live candidate.
        col = torch.arange(1, n_cand + 1, device=dev).expand(width, batch, n_cand)
        col = torch.where(cval > NEG_INF, col, 0)
        # Large tables are int32 (a quarter of the memory traffic), widened per frame.
        self.pos_int32 = width * batch * vocab > 1 << 21
        pos_type = torch.int32 if self.pos_int32 else torch.long
        pos = torch.zeros((width, batch, vocab), dtype=pos_type, device=dev).scatter_(2, ctok, col.to(pos_type))

        self.skipping = skip is not None
        self.tail = torch.zeros(batch, dtype=lp.dtype, device=dev)
        if skip is not None:
            # Blank log-prob summed over each run of skipped frames (float64: cumsum differences).
            sb = torch.where(skip, lp[..., BLANK_ID].double(), 0.0)
            csum = torch.nn.functional.pad(sb.cumsum(1), (1, 0))  # csum[:, t] = sum of sb[:, :t]
            prev = torch.nn.functional.pad(self.frame[:, :-1], (1, 0), value=-1)  # previous kept frame
            cur = torch.where(self.frame >= 0, self.frame, lengths[:, None])
            has_run = ((cur - prev) > 1) & (self.frame >= 0)  # (B, T')
            run = torch.where(has_run, csum.gather(1, cur) - csum.gather(1, prev + 1), 0.0).to(lp.dtype)
            self.has_run = has_run.t()[..., None].contiguous().unbind(0)  # (B, 1) per frame
            self.run = run.t()[..., None].contiguous().unbind(0)
            last = frame.gather(1, (counts - 1).clamp(min=0)[:, None])[:, 0]
            last = torch.where(counts > 0, last, -1)
            tail = csum.gather(1, lengths[:, None])[:, 0] - csum.gather(1, (last + 1)[:, None])[:, 0]
            self.tail = tail.to(lp.dtype)
        expand = (width, batch, beam, vocab)  # (B, K, V) per frame: gathered with (B, K, 1) ids
        self.lpk = lpc[:, :, None].expand(expand).unbind(0)
        self.posk = pos[:, :, None].expand(expand).unbind(0)
        self.lpb = lpc[..., BLANK_ID:BLANK_ID + 1].unbind(0)  # (B, 1)
        self.cval = cval[:, :, None, :].unbind(0)  # (B, 1, C): broadcasts over the beam
        self.tok = self.tok_all.unbind(0)  # (B, C+1)


class _Beam:
    """Search state for B utterances x K hypotheses, in buffers updated in place.

    Views into the buffers are made once here, so a frame step creates few tensors. Index K
    stands for "no parent in the beam": it addresses a -inf slot and a trash hypothesis.
    """

    def __init__(self, batch: int, beam: int, steps: int, cols: int, dtype: torch.dtype,
                 device: torch.device, scorers: Mapping[str, BatchScorer], bonus: float) -> None:
        full: Dict[str, Any] = dict(dtype=dtype, device=device)
        # (B, 4, K+1) rows: pnb, pb, fused (sum of weighted scorer scores), tot (scratch); slot K
        # stays -inf.
        self.s = torch.full((batch, 4, beam + 1), NEG_INF, **full)
        self.s[:, 1, 0] = 0.0  # one live hypothesis: the empty prefix
        self.s[:, 2, :beam] = 0.0
        self.pnb, self.pb, self.fused, self.tot = self.s[:, :, :beam].unbind(1)
        self.pnb3, self.pb3, self.fused3, self.tot3 = (x[:, :, None] for x in (self.pnb, self.pb, self.fused, self.tot))
        self.new3 = self.s[:, :3, :beam]  # gather target for (pnb, pb, fused) of the chosen candidates
        self.pb_tot = self.s.view(batch, 4 * (beam + 1), 1)[:, beam + 1:]  # pb at k, tot at 2K+2+k
        # (B, 4, K) rows: prefix hash, parent-prefix hash, last token (blank for the empty prefix),
        # "single" = 1 unless the last two tokens are equal. A merge into a prefix comes from its
        # parent's total, or only from the parent's pb when the prefix ends in a doubled token.
        self.ints = torch.zeros((batch, 4, beam), dtype=torch.long, device=device)
        self.ints[:, 0, 1:] = _SENT_HASH
        self.ints[:, 1] = _SENT_PARENT
        self.hash, self.parent_hash, self.last, self.single = self.ints.unbind(1)
        self.last3, self.single3 = self.last[:, :, None], self.single[:, :, None]
        self.child_view = self.ints[:, 1, :, None]  # (B, K1, 1) parent-prefix hash of k1
        self.parent_view = self.ints[:, 0, None, :]  # (B, 1, K2) prefix hash of k2
        self.match = torch.ones((batch, beam, beam + 1), dtype=torch.bool, device=device)  # column K: "none"
        self.match_real = self.match[:, :, :beam]
        self.sentinel = torch.tensor([_SENT_HASH, _SENT_PARENT, BLANK_ID, 0], device=device)[None, :, None]
        self.hist = torch.zeros((steps, batch, beam), dtype=torch.long, device=device)  # topk picks
        self.hist3 = self.hist[:, :, None, :].expand(steps, batch, 3, beam).unbind(0)  # gather indices
        self.top = torch.empty((batch, beam), **full)
        self.parent = torch.empty((batch, beam), dtype=torch.long, device=device)
        self.parent4 = self.parent[:, None, :].expand(batch, 4, beam)
        self.dead = torch.empty((batch, beam), dtype=torch.bool, device=device)
        self.dead4 = self.dead[:, None, :]
        self.old = torch.empty_like(self.ints)  # the parents' ints, gathered
        self.old_hash, self.old_parent_hash, self.old_last, self.old_single = self.old.unbind(1)
        self.differs = torch.empty((batch, beam), dtype=torch.long, device=device)
        # Candidate tables (B, 3, (K+1)*(C+1)) rows: CTC pnb, CTC pb (-inf but for stays), fused;
        # hypothesis k owns columns k*(C+1) .. k*(C+1)+C of a row, the first being its stay.
        self.table = torch.full((batch, 3, (beam + 1) * cols), NEG_INF, **full)
        self.ctc, self.pbc, self.fus = (x[:, :beam * cols].view(batch, beam, cols) for x in self.table.unbind(1))
        self.ctc_stay3, self.ctc_ext = self.ctc[:, :, :1], self.ctc[:, :, 1:]
        self.ctc_stay, self.pbc_stay = self.ctc[:, :, 0], self.pbc[:, :, 0]
        self.ctc_cells = self.table[:, 0, :, None]  # (B, (K+1)*(C+1), 1) scatter target
        self.cand = torch.empty((batch, beam * cols), **full)
        self.cand3 = self.cand.view(batch, beam, cols)
        self.cand_stay = self.cand3[:, :, 0]
        # What an extension adds to the fused score besides scorers: the length bonus (not the stay).
        self.bonus = torch.full((1, 1, cols), bonus, **full)
        self.bonus[..., 0] = 0.0
        self.fusion = self.bonus.expand(batch, beam, cols).clone()  # + weighted scorer scores
        self.fusion_ext = self.fusion[:, :, 1:]
        self.row0 = torch.arange(batch, device=device)[:, None] * beam  # (B, 1) flat row offsets
        self.states = {name: sc.init_state(batch, beam, device) for name, sc in scorers.items()}


def _step(i: int, s: _Beam, fr: _Frames, scorers: Mapping[str, BatchScorer],
          weights: Mapping[str, float]) -> None:
    """Advance every utterance by compacted frame i (no host sync)."""
    beam = s.pnb.shape[1]
    cols = fr.n_cand + 1
    pb, pnb, tot = s.pb, s.pnb, s.tot
    torch.logaddexp(pb, pnb, out=tot)
    if fr.skipping:  # a run of skipped blank frames before this one: all mass moves to pb
        ran = fr.has_run[i]
        tot.add_(fr.run[i])
        torch.where(ran, tot, pb, out=pb)
        pnb.masked_fill_(ran, NEG_INF)
    lp_last = fr.lpk[i].gather(2, s.last3)  # (B, K, 1) log P(own last token) this frame
    torch.add(tot, fr.lpb[i], out=s.pbc_stay)  # stay via blank

    # Extensions: from pb and pnb, but a repeat of the own last token only from pb.
    torch.add(s.tot3, fr.cval[i], out=s.ctc_ext)
    col = fr.posk[i].gather(2, s.last3)  # (B, K, 1) column of the own last token (0: none, junk)
    if fr.pos_int32:
        col = col.long()
    s.ctc.scatter_(2, col, s.pb3 + lp_last)
    # Merge: k2 is the parent of k1 when hash[k2] == parent_hash[k1]; extension (k2, last[k1]) is
    # then k1's prefix: it folds into k1's stay and leaves the candidates. par = K: no parent.
    par = _find_parents(s)  # (B, K, 1)
    s.ctc_cells.scatter_(1, torch.add(col, par, alpha=cols), NEG_INF)  # K*cols+: trash
    src = s.pb_tot.gather(1, torch.add(par, s.single3, alpha=2 * beam + 2))  # parent's pb or total
    torch.add(torch.logaddexp(s.pnb3, src), lp_last, out=s.ctc_stay3)

    if scorers:
        _score_candidates(i, s, fr, scorers, weights)
    torch.add(s.fusion, s.fused3, out=s.fus)
    torch.add(s.ctc, s.fus, out=s.cand3)
    torch.add(torch.logaddexp(s.pbc_stay, s.ctc_stay), s.fused, out=s.cand_stay)
    top, pick = torch.topk(s.cand, beam, 1, True, False, out=(s.top, s.hist[i]))

    # The new beam: (pnb, pb, fused) of the chosen candidates, hash bookkeeping from parents.
    torch.gather(s.table, 2, s.hist3[i], out=s.new3)
    parent = torch.div(pick, cols, rounding_mode="floor", out=s.parent)
    token = fr.tok[i].gather(1, torch.sub(pick, parent, alpha=cols))  # (B, K), -1 for stays
    is_ext = token >= 0
    dead = torch.isneginf(top, out=s.dead)  # fewer live candidates than K: no hash, no merges
    if scorers:  # a scorer's -inf leaves a finite CTC score on a dead pick
        pnb.masked_fill_(dead, NEG_INF)
        rows = (parent + s.row0).view(-1)
        for name, sc in scorers.items():
            s.states[name] = sc.select_state(s.states[name], rows, token.view(-1))
    torch.gather(s.ints, 2, s.parent4, out=s.old)
    old_hash = s.old_hash
    torch.where(is_ext, torch.add(token, old_hash, alpha=_HASH_MUL), old_hash, out=s.hash)
    torch.where(is_ext, old_hash, s.old_parent_hash, out=s.parent_hash)
    torch.where(is_ext, token, s.old_last, out=s.last)
    torch.where(is_ext, torch.ne(token, s.old_last, out=s.differs), s.old_single, out=s.single)
    torch.where(s.dead4, s.sentinel, s.ints, out=s.ints)


def _find_parents(s: _Beam) -> torch.Tensor:
    """(B, K, 1): the beam index of each hypothesis's parent prefix, or K if it is not in the beam."""
    beam = s.pnb.shape[1]
    if beam <= _DENSE_MATCH_MAX_BEAM:  # a (B, K, K) comparison is the fewest ops
        torch.eq(s.child_view, s.parent_view, out=s.match_real)
        return s.match.max(2, keepdim=True)[1]  # first True; column K is always True
    # Larger beams: binary search of each parent hash among the sorted hashes, O(K log K).
    hashes, order = s.hash.sort(1)
    parent_hash = s.parent_hash.contiguous()
    at = torch.searchsorted(hashes, parent_hash).clamp_(max=beam - 1)
    return torch.where(hashes.gather(1, at) == parent_hash, order.gather(1, at), beam)[:, :, None]


def _score_candidates(i: int, s: _Beam, fr: _Frames, scorers: Mapping[str, BatchScorer],
                      weights: Mapping[str, float]) -> None:
    """Weighted scorer scores (+ length bonus) of this frame's extension tokens into s.fusion_ext."""
    batch, beam = s.pnb.shape
    n_cand = fr.n_cand
    tokens = fr.tok[i][:, None, 1:].expand(batch, beam, n_cand).reshape(batch * beam, n_cand)
    for j, (name, sc) in enumerate(scorers.items()):
        scores = sc.score(s.states[name], tokens).view(batch, beam, n_cand).to(s.fusion.dtype)
        if j == 0:
            torch.add(s.bonus[:, :, 1:], scores, alpha=weights[name], out=s.fusion_ext)
        else:
            s.fusion_ext.add_(scores, alpha=weights[name])


def _frame_loop(s: _Beam, fr: _Frames, scorers: Mapping[str, BatchScorer],
                weights: Mapping[str, float]) -> None:
    """All frames; tests run this under patches that fail on any host sync."""
    for i in range(fr.steps):
        _step(i, s, fr, scorers, weights)


def _finish(s: _Beam, fr: _Frames, scorers: Mapping[str, BatchScorer], weights: Mapping[str, float],
            nbest: int) -> NBest:
    """End-of-sentence scores, sort, backtrack into an NBest."""
    ctc = torch.logaddexp(s.pb, s.pnb) + fr.tail[:, None]
    total = ctc + s.fused
    for name, sc in scorers.items():
        total = total + weights[name] * sc.final_score(s.states[name]).view(total.shape).to(total.dtype)
    total, order = total.topk(nbest, 1)  # best first
    ctc = ctc.gather(1, order)
    cols = fr.n_cand + 1
    parents = torch.div(s.hist, cols, rounding_mode="floor")  # (T', B, K)
    emitted = fr.tok_all.gather(2, s.hist - parents * cols)  # (T', B, K), -1 where none
    paths = backtrack(parents, emitted, order)  # (B, N, T')
    dead = total == NEG_INF
    paths = paths.masked_fill(dead[:, :, None], -1)
    tokens, token_frames, lengths = pack_emissions(paths, fr.frame[:, None, :].expand_as(paths))
    return NBest(tokens, lengths, total, ctc.masked_fill(dead, NEG_INF), token_frames)


def _search_batch(lp: torch.Tensor, lengths: torch.Tensor, beam: int, nbest: int,
                  scorers: Mapping[str, BatchScorer], weights: Mapping[str, float], bonus: float,
                  topk: Optional[int], min_logp: Optional[float], skip: Optional[float]) -> NBest:
    threads = torch.get_num_threads()
    if lp.device.type == "cpu" and threads > 1:
        # Nearly every op works on a few thousand numbers: intra-op threads only add barriers
        # (2-5x slower measured on a loaded 2-core machine). Restored below.
        torch.set_num_threads(1)
    try:
        fr = _Frames(lp, lengths, beam, topk, min_logp, skip)
        s = _Beam(lp.shape[0], beam, fr.steps, fr.n_cand + 1, lp.dtype, lp.device, scorers, bonus)
        _frame_loop(s, fr, scorers, weights)
        return _finish(s, fr, scorers, weights, nbest)
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _search_split(lp: torch.Tensor, lengths: torch.Tensor, **kw: Any) -> NBest:
    """Run one batch; on CUDA out-of-memory, split it in half and recurse."""
    try:
        return _search_batch(lp, lengths, **kw)
    except torch.cuda.OutOfMemoryError:
        if lp.shape[0] <= 1:
            raise
        if lp.is_cuda:
            torch.cuda.empty_cache()
        half = lp.shape[0] // 2
        return NBest.cat([_search_split(lp[:half], lengths[:half], **kw),
                          _search_split(lp[half:], lengths[half:], **kw)])


def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam: int = 10,
    nbest: Optional[int] = None,
    scorers: Optional[Mapping[str, BatchScorer]] = None,
    weights: Optional[Mapping[str, float]] = None,
    token_topk: Optional[int] = 8,
    token_min_logp: Optional[float] = -12.0,
    blank_skip_threshold: Optional[float] = 0.999,
) -> NBest:
    """CTC prefix beam search over a padded batch, with optional shallow fusion.

    log_probs: (B, T, V) log-probabilities, blank id 0 (float64 input is searched in float64,
    anything else in float32); lengths: (B,) valid frames per utterance (later frames are ignored).
    scorers/weights: e.g. ``scorers={"lm": ngram}, weights={"lm": 0.5, "length_bonus": 1.0}`` gives
    ``score = log P_ctc + 0.5 log P_lm + 1.0 * #tokens`` (each scorer needs a weight; a weight of 0
    disables its scorer). Pruning: see the module docstring; ``token_topk=None,
    token_min_logp=None, blank_skip_threshold=None`` searches exactly.
    Returns an :class:`NBest` (B, nbest) on the input's device, best first; ``to_lists()`` converts.
    Its token_frames are the input frame at which each token was emitted on the hypothesis's own
    surviving path. On CPU the call runs with ``torch.set_num_threads(1)`` and restores the setting.
    """
    check_ctc_inputs(log_probs, lengths)
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    nbest = beam if nbest is None else nbest
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}], got {nbest}")
    if token_topk is not None and token_topk < 1:
        raise ValueError(f"token_topk must be >= 1 or None, got {token_topk}")
    if blank_skip_threshold is not None and not 0.0 < blank_skip_threshold < 1.0:
        raise ValueError(f"blank_skip_threshold must be in (0, 1) or None, got {blank_skip_threshold}")
    active, active_weights, bonus = active_scorers(scorers or {}, weights or {})
    dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    lp = log_probs.to(dtype)
    return _search_split(lp, lengths.to(lp.device, torch.long), beam=beam, nbest=nbest, scorers=active,
                         weights=active_weights, bonus=bonus, topk=token_topk,
                         min_logp=token_min_logp, skip=blank_skip_threshold)
