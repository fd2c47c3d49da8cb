"""The Triton kernels of :mod:`asrkit.search.fused_step` and :mod:`asrkit.search.fused_search` (imported on first
use: triton decides between compiling and interpreting, ``TRITON_INTERPRET=1``, when a function is decorated).

:func:`beam_step` is one frame step of one utterance's beam (registers in, registers out); :func:`ctc_steps` runs it
over host-built tables (the step-major candidate tables of ``FrameTables``), :func:`ctc_search` over the log-probs
themselves (blank skipping and the best C tokens of each frame done in the program), :func:`backtrack_paths` follows
the backpointers :func:`ctc_search` wrote."""
import triton
import triton.language as tl

from asrkit.search.fused_scorers import (from_parent, lx_final, lx_score, lx_select, tk_logprob, tk_select, tn_score,
                                         tn_select, wc_score, wc_select, wn_score, wn_select)


@triton.jit
def logaddexp(a, b):
    hi = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    safe = hi == float("-inf")
    return tl.where(safe, hi, hi + tl.log(1.0 + tl.exp(lo - tl.where(safe, 0.0, hi))))


@triton.jit
def beam_step(pnb, pb, tot, fused, hsh, phsh, last, single, ctok, cv, blank_lp, lp_last, fus_in, bonus, run,
              beam, n_cand, HAS_FUSION: tl.constexpr, HAS_SCORERS: tl.constexpr, BK: tl.constexpr,
              BC: tl.constexpr, SENT_HASH_C: tl.constexpr, SENT_PARENT_C: tl.constexpr, SENT_MIN_C: tl.constexpr,
              HASH_MUL_C: tl.constexpr):
    """One frame: beam (pnb, pb, tot, fused, hsh, phsh, last, single: (BK,)), the frame's candidates ctok / cv
    (BC,) (lanes >= n_cand padding), its log P(blank), lp_last (BK,) log P(own last token), fus_in (BK, BC) the
    scorers' weighted scores (HAS_SCORERS), bonus the length bonus (HAS_FUSION without scorers), run != 0: skipped
    blank frames follow. Returns the new beam, the picks (candidate index k * (C+1) + c), parents and tokens (-1:
    a stay)."""
    cols = n_cand + 1
    ok = tl.arange(0, BK)  # hypothesis slots
    oc = tl.arange(0, BC)  # candidate columns: 0..C-1 extensions, C the stay
    kmask = ok < beam
    k2 = ok[:, None]
    c2 = oc[None, :]
    valid = (k2 < beam) & (c2 <= n_cand)
    is_ext = c2 < n_cand
    pick_id = k2 * cols + c2  # the torch step's candidate index
    big = beam * cols + 1
    neg = float("-inf")
    # extensions: a repeat of the own last token only from pb
    eq = (ctok[None, :] == last[:, None]) & is_ext
    ext = tl.where(eq, pb[:, None], tot[:, None]) + cv[None, :]
    col = tl.min(tl.where(eq, c2, n_cand), axis=1)  # own last token's column; C: none
    # parent in the beam: the first k2 with hash[k2] == parent_hash[k]; K: none
    match = (phsh[:, None] == hsh[None, :]) & (ok[None, :] < beam)
    par = tl.min(tl.where(match, ok[None, :], beam), axis=1)
    # the extension (par[k], col[k]) is k's prefix: it leaves the candidates
    merged = tl.max(((par[:, None, None] == ok[None, :, None]) & (col[:, None, None] == oc[None, None, :])
                     & (col[:, None, None] < n_cand)).to(tl.int32), axis=0) > 0
    ext = tl.where(merged, neg, ext)
    sel_par = par[:, None] == ok[None, :]  # (BK, BK)
    p_pb = tl.max(tl.where(sel_par, pb[None, :], neg), axis=1)
    p_tot = tl.max(tl.where(sel_par, tot[None, :], neg), axis=1)
    src = tl.where(single != 0, p_tot, p_pb)
    stay_nb = logaddexp(pnb, src) + lp_last
    stay_b = tot + blank_lp
    stay_tot = logaddexp(stay_nb, stay_b)
    nb = tl.where(is_ext, ext, stay_nb[:, None])
    bb = tl.where(is_ext, neg, stay_b[:, None])
    tt = tl.where(is_ext, ext, stay_tot[:, None])
    if HAS_FUSION:
        if HAS_SCORERS:
            fus = fus_in
        else:
            fus = tl.where(is_ext, bonus, 0.0)  # in the beam's dtype
        fus = fus + fused[:, None]
        cand = tt + fus
    else:
        fus = tl.where(is_ext, 0.0, fused[:, None])
        cand = tt
    cand = tl.where(valid, cand, neg)
    # the K best, best first, ties to the lower candidate index: two reductions a pick
    taken = (pick_id < 0).to(tl.int32)
    picks = ok * 0
    bests = tl.full([BK], float("-inf"), pnb.dtype)
    for j in range(beam):
        avail = valid & (taken == 0)
        key = tl.where(avail, cand, neg)
        best = tl.max(tl.max(key, axis=1), axis=0)
        pid = tl.min(tl.min(tl.where(avail & (key == best), pick_id, big), axis=1), axis=0)
        taken = taken | ((pick_id == pid) & valid).to(tl.int32)  # padded lanes alias ids of real cells
        picks = tl.where(ok == j, pid, picks)
        bests = tl.where(ok == j, best, bests)
    # the new beam, every slot at once: slot j reads cell picks[j]
    sel = (picks[:, None, None] == pick_id[None, :, :]) & valid[None, :, :] & kmask[:, None, None]
    v_nb = tl.max(tl.max(tl.where(sel, nb[None, :, :], neg), axis=2), axis=1)
    v_b = tl.max(tl.max(tl.where(sel, bb[None, :, :], neg), axis=2), axis=1)
    v_tot = tl.max(tl.max(tl.where(sel, tt[None, :, :], neg), axis=2), axis=1)
    v_fus = tl.max(tl.max(tl.where(sel, fus[None, :, :], neg), axis=2), axis=1)
    # a run of skipped blank frames follows: all mass ends in blank
    v_b = tl.where(run != 0, v_tot, v_b)
    v_nb = tl.where(run != 0, neg, v_nb)
    dead = bests == neg
    if HAS_SCORERS:  # a scorer's -inf leaves a finite CTC score on a dead pick
        v_nb = tl.where(dead, neg, v_nb)
        v_tot = tl.where(dead, neg, v_tot)
    p = picks // cols
    c = picks - p * cols
    sel_p = p[:, None] == ok[None, :]  # (slot, parent)
    tok_c = tl.max(tl.where(c[:, None] == oc[None, :], ctok[None, :], -2), axis=1)
    ext_pick = c < n_cand
    o_hsh = tl.max(tl.where(sel_p, hsh[None, :], SENT_MIN_C), axis=1)
    o_phsh = tl.max(tl.where(sel_p, phsh[None, :], SENT_MIN_C), axis=1)
    o_last = tl.max(tl.where(sel_p, last[None, :], -2), axis=1)
    o_single = tl.max(tl.where(sel_p, single[None, :], -2), axis=1)
    gone = dead | (ok >= beam)  # dead picks and padded slots: impossible hypotheses
    hsh = tl.where(gone, SENT_HASH_C, tl.where(ext_pick, tok_c + o_hsh * HASH_MUL_C, o_hsh))
    phsh = tl.where(gone, SENT_PARENT_C, tl.where(ext_pick, o_hsh, o_phsh))
    last = tl.where(gone, 0, tl.where(ext_pick, tok_c, o_last))
    single = tl.where(gone, 0, tl.where(ext_pick, (tok_c != o_last).to(tl.int64), o_single))
    if HAS_FUSION:
        fused = v_fus
    return v_nb, v_b, v_tot, fused, hsh, phsh, last, single, picks.to(tl.int64), p.to(tl.int64), \
        tl.where(ext_pick, tok_c, -1)


@triton.jit
def load_beam(srow, irow, beam, ok, kmask, SENT_HASH_C: tl.constexpr, SENT_PARENT_C: tl.constexpr):
    """One utterance's beam from its rows of the state tensors: floats (pnb, pb, total, fused; beam + 1 apart)
    and ints (hash, parent hash, last token, single; beam apart); lanes past the beam read as dead."""
    neg = float("-inf")
    pnb = tl.load(srow + ok, mask=kmask, other=neg)
    pb = tl.load(srow + (beam + 1) + ok, mask=kmask, other=neg)
    tot = tl.load(srow + 2 * (beam + 1) + ok, mask=kmask, other=neg)
    fused = tl.load(srow + 3 * (beam + 1) + ok, mask=kmask, other=0.0)
    hsh = tl.load(irow + ok, mask=kmask, other=SENT_HASH_C)
    phsh = tl.load(irow + beam + ok, mask=kmask, other=SENT_PARENT_C)
    last = tl.load(irow + 2 * beam + ok, mask=kmask, other=0)
    single = tl.load(irow + 3 * beam + ok, mask=kmask, other=0)
    return pnb, pb, tot, fused, hsh, phsh, last, single


@triton.jit
def store_beam(srow, irow, beam, ok, kmask, pnb, pb, tot, fused, hsh, phsh, last, single):
    """The beam back into the rows :func:`load_beam` read."""
    tl.store(srow + ok, pnb, mask=kmask)
    tl.store(srow + (beam + 1) + ok, pb, mask=kmask)
    tl.store(srow + 2 * (beam + 1) + ok, tot, mask=kmask)
    tl.store(srow + 3 * (beam + 1) + ok, fused, mask=kmask)
    tl.store(irow + ok, hsh, mask=kmask)
    tl.store(irow + beam + ok, phsh, mask=kmask)
    tl.store(irow + 2 * beam + ok, last, mask=kmask)
    tl.store(irow + 3 * beam + ok, single, mask=kmask)


@triton.jit
def ctc_steps(st, ints, tok_all, cval, lpb, pad_bias, run_after, lp_rows, fusion, hist, parent_out, token_out,
              first, n_steps, batch, beam, n_cand, vocab, bonus_ptr,
              HAS_FUSION: tl.constexpr, HAS_SCORERS: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
              SENT_HASH_C: tl.constexpr, SENT_PARENT_C: tl.constexpr, SENT_MIN_C: tl.constexpr,
              HASH_MUL_C: tl.constexpr):
    b = tl.program_id(0)
    cols = n_cand + 1
    ok = tl.arange(0, BK)
    oc = tl.arange(0, BC)
    kmask = ok < beam
    valid = (ok[:, None] < beam) & (oc[None, :] <= n_cand)
    neg = float("-inf")
    srow = st + b * 4 * (beam + 1)
    irow = ints + b * 4 * beam
    pnb, pb, tot, fused, hsh, phsh, last, single = load_beam(srow, irow, beam, ok, kmask, SENT_HASH_C, SENT_PARENT_C)
    bonus = tl.load(bonus_ptr)
    for t in range(first, first + n_steps):
        tb = b.to(tl.int64) + t * batch  # 64-bit: tb * vocab passes 2**31 at e.g. 256 steps x 2048 x V = 5000
        ctok = tl.load(tok_all + tb * cols + oc, mask=oc < n_cand, other=-2)  # (BC,)
        cv = tl.load(cval + tb * n_cand + oc, mask=oc < n_cand, other=neg)
        blank_lp = tl.load(lpb + tb)
        pad = tl.load(pad_bias + tb)
        run = tl.load(run_after + tb)
        lp_last = tl.load(lp_rows + tb * vocab + last, mask=kmask, other=neg) + pad  # (BK,)
        if HAS_SCORERS:
            fus_in = tl.load(fusion + (b * beam + ok[:, None]) * cols + oc[None, :], mask=valid, other=0.0)
        else:
            fus_in = bonus
        pnb, pb, tot, fused, hsh, phsh, last, single, picks, parents, tokens = beam_step(
            pnb, pb, tot, fused, hsh, phsh, last, single, ctok, cv, blank_lp, lp_last, fus_in, bonus, run,
            beam, n_cand, HAS_FUSION, HAS_SCORERS, BK, BC, SENT_HASH_C, SENT_PARENT_C, SENT_MIN_C, HASH_MUL_C)
        tl.store(hist + tb * beam + ok, picks, mask=kmask)
        if HAS_SCORERS:
            tl.store(parent_out + b * beam + ok, parents, mask=kmask)
            tl.store(token_out + b * beam + ok, tokens, mask=kmask)
    store_beam(srow, irow, beam, ok, kmask, pnb, pb, tot, fused, hsh, phsh, last, single)


@triton.jit
def ctc_search(lp, lengths, limits, bonus_ptr, st, ints, parent_out, token_out, frame_out, count_out, offset_out,
               ctab, vtab, stride_b, stride_t, frames, batch, beam, n_cand, vocab,
               wts, final_out, wc_open0, wc_closes, wc_opens, tn_state0, tn_logp, tn_next, tn_eos, tn_vocab,
               lx_state0, lx_next_base, lx_score_table, lx_edge_keys, lx_edge_dst, lx_col_stay, lx_col_closes,
               lx_col_start, lx_is_word, lx_width, lx_n_edges, lx_iters,
               wn_ints0, wn_floats0, wn_trans, wn_la_next, wn_edge_keys, wn_edge_dst, wn_col_stay, wn_col_start,
               wn_col_is_end, wn_la, wn_col_is_start, wn_token_slot, wn_node_word, wn_node_floats, wn_chain_keys,
               wn_keys, wn_next_state, wn_row_floats, wn_backoff, wn_width, wn_order, wn_n_edges, wn_edge_iters,
               wn_n_keys, wn_key_iters,
               tk_hist0, tk_bo0, tk_hist_width, tk_tok, tk_prob1, tk_bo1, tk_keys2, tk_prob2, tk_bo2, tk_keys3,
               tk_prob3, tk_bo3, tk_keys4, tk_prob4, tk_size1, tk_size2, tk_size3, tk_n2, tk_n3, tk_n4, tk_it2, tk_it3,
               tk_it4, tk_blank, tk_eos_tok, tk_eos_word,
               HAS_FUSION: tl.constexpr, EVERY_TOKEN: tl.constexpr, TABLES: tl.constexpr, BK: tl.constexpr,
               BC: tl.constexpr,
               BV: tl.constexpr, SENT_HASH_C: tl.constexpr, SENT_PARENT_C: tl.constexpr, SENT_MIN_C: tl.constexpr,
               HASH_MUL_C: tl.constexpr, HAS_SCORERS: tl.constexpr = False, HAS_WC: tl.constexpr = False,
               HAS_TN: tl.constexpr = False, HAS_LX: tl.constexpr = False, LX_DENSE: tl.constexpr = True,
               HAS_WN: tl.constexpr = False, WN_DENSE: tl.constexpr = True, HAS_TK: tl.constexpr = False,
               TK_ORDER: tl.constexpr = 1):
    """Every frame of utterance ``b`` (one program each) from the log-probs ``lp`` (B, T, V), last axis contiguous:
    frames whose log P(blank) exceeds limits[0] are skipped (their log P(blank) summed in float64 into
    offset_out[b], and pnb's mass moved into pb before the next kept frame), the best n_cand non-blank tokens of
    each kept frame (every token when EVERY_TOKEN; with TABLES read from ctab / vtab (B*T, n_cand), the tokens and
    their log-probs of every frame, taken before the launch) are its candidates, those under limits[1] dropped. Kept
    frame i writes parents and tokens (T, B, K) row i and frame_out[b, i] = its input frame; count_out[b] = kept
    frames (rows past it are left unwritten).

    With scorers (HAS_SCORERS; at most one of each kind, :mod:`asrkit.search.fused_scorers`: HAS_WC word_count,
    HAS_TN token_ngram, HAS_LX lexicon, HAS_WN word_ngram, HAS_TK token_ngram_lookup of order TK_ORDER, their tables
    those of the scorer's ``native_form()``, weights wts[0..4] in that order) each kept frame adds bonus + the
    weighted scores of every (hypothesis, candidate) to the extensions, and the picks' scorer states follow their
    parents and tokens, in registers from the (B*K,) start states (``init_state``'s) to the end, where final_out
    (B, K) gets their weighted end-of-sentence scores."""
    b = tl.program_id(0)
    ok = tl.arange(0, BK)
    oc = tl.arange(0, BC)
    ov = tl.arange(0, BV)
    kmask = ok < beam
    token_ok = (ov > 0) & (ov < vocab)  # the blank (0) is never a candidate
    neg = float("-inf")
    srow = st + b * 4 * (beam + 1)
    irow = ints + b * 4 * beam
    pnb, pb, tot, fused, hsh, phsh, last, single = load_beam(srow, irow, beam, ok, kmask, SENT_HASH_C, SENT_PARENT_C)
    bonus = tl.load(bonus_ptr)
    skip_above = tl.load(limits)
    min_logp = tl.load(limits + 1)
    n = tl.load(lengths + b)
    utt = lp + b.to(tl.int64) * stride_b
    offset = (n * 0).to(tl.float64)
    pending = b * 0  # skipped frames since the last kept one
    kept = b * 0
    # the scorers' states of the beam's slots (unused kinds: zeros, never read)
    hyp = b * beam + ok
    zero_i = (ok * 0).to(tl.int64)
    zero_f = tl.zeros([BK], tl.float32)
    wc_open, tn_st, lx_st, wn_node, wn_hist, wn_closed, wn_f0, wn_f1, wn_f2 = \
        zero_i, zero_i, zero_i, zero_i, zero_i, zero_i, zero_f, zero_f, zero_f
    tk_h1, tk_h2, tk_h3, tk_b0, tk_b1, tk_b2, tk_b3 = zero_i, zero_i, zero_i, zero_f, zero_f, zero_f, zero_f
    if HAS_WC:
        wc_open = (tl.load(wc_open0 + hyp, mask=kmask, other=0.0) != 0).to(tl.int64)
    if HAS_TN:
        tn_st = tl.load(tn_state0 + hyp, mask=kmask, other=0)
    if HAS_LX:
        lx_st = tl.load(lx_state0 + hyp, mask=kmask, other=0)
    if HAS_WN:
        wn_node = tl.load(wn_ints0 + hyp * 3, mask=kmask, other=0)
        wn_hist = tl.load(wn_ints0 + hyp * 3 + 1, mask=kmask, other=0)
        wn_closed = tl.load(wn_ints0 + hyp * 3 + 2, mask=kmask, other=0)
        wn_f0 = tl.load(wn_floats0 + hyp * 3, mask=kmask, other=0.0)
        wn_f1 = tl.load(wn_floats0 + hyp * 3 + 1, mask=kmask, other=0.0)
        wn_f2 = tl.load(wn_floats0 + hyp * 3 + 2, mask=kmask, other=0.0)
    if HAS_TK:  # NgramState: hist (N, TK_ORDER-1) words, the latest last; bo_sums (N, TK_ORDER)
        if TK_ORDER >= 2:
            tk_h1 = tl.load(tk_hist0 + hyp * tk_hist_width + (TK_ORDER - 2), mask=kmask, other=0)
            tk_b1 = tl.load(tk_bo0 + hyp * TK_ORDER + 1, mask=kmask, other=0.0)
        if TK_ORDER >= 3:
            tk_h2 = tl.load(tk_hist0 + hyp * tk_hist_width + (TK_ORDER - 3), mask=kmask, other=0)
            tk_b2 = tl.load(tk_bo0 + hyp * TK_ORDER + 2, mask=kmask, other=0.0)
        if TK_ORDER >= 4:
            tk_h3 = tl.load(tk_hist0 + hyp * tk_hist_width + (TK_ORDER - 4), mask=kmask, other=0)
            tk_b3 = tl.load(tk_bo0 + hyp * TK_ORDER + 3, mask=kmask, other=0.0)
        tk_b0 = tl.load(tk_bo0 + hyp * TK_ORDER, mask=kmask, other=0.0)
    for t in range(0, n):
        row = utt + t * stride_t
        blank_lp = tl.load(row)
        if blank_lp > skip_above:
            offset += blank_lp.to(tl.float64)
            pending = b * 0 + 1
        else:
            if EVERY_TOKEN:
                ctok = tl.where(oc < n_cand, oc + 1, -2).to(tl.int64)
                cv = tl.load(row + 1 + oc, mask=oc < n_cand, other=neg)
            elif TABLES:
                at_tab = (b.to(tl.int64) * frames + t) * n_cand + oc
                ctok = tl.load(ctab + at_tab, mask=oc < n_cand, other=-2)
                cv = tl.load(vtab + at_tab, mask=oc < n_cand, other=neg)
            else:  # the n_cand best, ties to the lower token id
                x = tl.load(row + ov, mask=token_ok, other=neg)
                ctok = tl.full([BC], -2, tl.int64)
                cv = tl.full([BC], float("-inf"), x.dtype)
                free = token_ok
                for j in range(n_cand):
                    key = tl.where(free, x, neg)
                    best = tl.max(key, axis=0)
                    at = tl.min(tl.where(free & (key == best), ov, BV), axis=0)
                    ctok = tl.where(oc == j, at.to(tl.int64), ctok)
                    cv = tl.where(oc == j, best, cv)
                    free = free & (ov != at)
            cv = tl.where(cv < min_logp, neg, cv)
            lp_last = tl.load(row + last, mask=kmask, other=neg)
            # skipped blank frames since the last kept one: all mass ends in blank
            pb = tl.where(pending != 0, tot, pb)
            pnb = tl.where(pending != 0, neg, pnb)
            pending = b * 0
            fus_in = bonus
            if HAS_SCORERS:  # bonus + the weighted scores of the extensions (prefix_loop._score_candidates)
                cmask = (ok[:, None] < beam) & (oc[None, :] < n_cand)
                add = tl.zeros([BK, BC], cv.dtype) + bonus
                if HAS_WC:
                    add += tl.load(wts) * wc_score(wc_open, ctok, wc_closes).to(cv.dtype)
                if HAS_TN:
                    add += tl.load(wts + 1) * tn_score(tn_st, ctok, cmask, tn_logp, tn_vocab).to(cv.dtype)
                if HAS_LX:
                    add += tl.load(wts + 2) * lx_score(
                        lx_st, ctok, cmask, lx_score_table, lx_edge_keys, lx_edge_dst, lx_n_edges, lx_iters,
                        lx_col_stay, lx_col_closes, lx_col_start, lx_is_word, lx_width, LX_DENSE).to(cv.dtype)
                if HAS_WN:
                    add += tl.load(wts + 3) * wn_score(
                        wn_node, wn_f0, wn_f1, wn_f2, ctok, cmask, wn_la_next, wn_la, wn_trans, wn_edge_keys,
                        wn_edge_dst, wn_n_edges, wn_edge_iters, wn_col_stay, wn_col_start, wn_col_is_start,
                        wn_col_is_end, wn_token_slot, wn_width, WN_DENSE).to(cv.dtype)
                if HAS_TK:  # the blank scores 0 (never a candidate here)
                    words = tl.load(tk_tok + ctok, mask=ctok >= 0, other=0)[None, :]
                    add += tl.load(wts + 4) * tk_logprob(
                        words, tk_h1[:, None], tk_h2[:, None], tk_h3[:, None], tk_b0[:, None], tk_b1[:, None],
                        tk_b2[:, None], tk_b3[:, None], cmask, tk_prob1, tk_keys2, tk_prob2, tk_keys3, tk_prob3,
                        tk_keys4, tk_prob4, tk_size1, tk_size2, tk_size3, tk_n2, tk_n3, tk_n4, tk_it2, tk_it3, tk_it4,
                        TK_ORDER).to(cv.dtype)
                fus_in = tl.where(cmask, add, 0.0)  # the stay column adds nothing
            pnb, pb, tot, fused, hsh, phsh, last, single, picks, parents, tokens = beam_step(
                pnb, pb, tot, fused, hsh, phsh, last, single, ctok, cv, blank_lp, lp_last, fus_in, bonus, pending,
                beam, n_cand, HAS_FUSION, HAS_SCORERS, BK, BC, SENT_HASH_C, SENT_PARENT_C, SENT_MIN_C, HASH_MUL_C)
            if HAS_SCORERS:  # each slot's states: its parent's, extended by its token (-1: a stay)
                sel_p = parents[:, None] == ok[None, :]  # (slot, parent)
                if HAS_WC:
                    wc_open = wc_select(from_parent(sel_p, wc_open, -1), tokens, wc_opens)
                if HAS_TN:
                    tn_st = tn_select(from_parent(sel_p, tn_st, -1), tokens, tn_next, tn_vocab)
                if HAS_LX:
                    lx_st = lx_select(from_parent(sel_p, lx_st, -1), tokens, kmask, lx_next_base, lx_edge_keys,
                                      lx_edge_dst, lx_n_edges, lx_iters, lx_col_stay, lx_col_closes, lx_col_start,
                                      lx_is_word, lx_width, LX_DENSE)
                if HAS_WN:
                    wn_node, wn_hist, wn_closed, wn_f0, wn_f1, wn_f2 = wn_select(
                        from_parent(sel_p, wn_node, -1), from_parent(sel_p, wn_hist, -1),
                        from_parent(sel_p, wn_closed, -1), tokens, kmask, wn_trans, wn_edge_keys, wn_edge_dst,
                        wn_n_edges, wn_edge_iters, wn_col_stay, wn_col_start, wn_col_is_start, wn_node_word,
                        wn_node_floats, wn_chain_keys, wn_keys, wn_n_keys, wn_key_iters, wn_next_state, wn_row_floats,
                        wn_backoff, wn_width, wn_order, WN_DENSE)
                if HAS_TK:
                    tk_h1, tk_h2, tk_h3, tk_b0, tk_b1, tk_b2, tk_b3 = tk_select(
                        from_parent(sel_p, tk_h1, -1), from_parent(sel_p, tk_h2, -1), from_parent(sel_p, tk_h3, -1),
                        from_parent(sel_p, tk_b0, neg), from_parent(sel_p, tk_b1, neg),
                        from_parent(sel_p, tk_b2, neg), from_parent(sel_p, tk_b3, neg), tokens, kmask, tk_tok,
                        tk_blank, tk_eos_tok, tk_bo1, tk_keys2, tk_bo2, tk_keys3, tk_bo3, tk_size1, tk_size2, tk_n2,
                        tk_n3, tk_it2, tk_it3, TK_ORDER)
            at_row = (kept * batch + b) * beam + ok
            tl.store(parent_out + at_row, parents, mask=kmask)
            tl.store(token_out + at_row, tokens, mask=kmask)
            tl.store(frame_out + b * frames + kept, t)
            kept += 1
    tl.store(count_out + b, kept)
    tl.store(offset_out + b, offset)
    store_beam(srow, irow, beam, ok, kmask, pnb, pb, tot, fused, hsh, phsh, last, single)
    if HAS_SCORERS:  # the weighted end-of-sentence scores (prefix_loop.rank)
        fin = tl.zeros([BK], pnb.dtype)
        if HAS_WC:
            fin += tl.load(wts) * wc_open.to(pnb.dtype)
        if HAS_TN:
            fin += tl.load(wts + 1) * tl.load(tn_eos + tn_st, mask=kmask, other=0.0).to(pnb.dtype)
        if HAS_LX:
            fin += tl.load(wts + 2) * lx_final(lx_st, lx_is_word, lx_width, kmask).to(pnb.dtype)
        if HAS_WN:
            fin += tl.load(wts + 3) * wn_f2.to(pnb.dtype)
        if HAS_TK:  # ln P(</s> | history)
            fin += tl.load(wts + 4) * tk_logprob(
                tk_eos_word + zero_i, tk_h1, tk_h2, tk_h3, tk_b0, tk_b1, tk_b2, tk_b3, kmask, tk_prob1, tk_keys2,
                tk_prob2, tk_keys3, tk_prob3, tk_keys4, tk_prob4, tk_size1, tk_size2, tk_size3, tk_n2, tk_n3, tk_n4,
                tk_it2, tk_it3, tk_it4, TK_ORDER).to(pnb.dtype)
        tl.store(final_out + b * beam + ok, fin, mask=kmask)


@triton.jit
def backtrack_paths(parents, tokens, order, count, paths, batch, beam, nbest, frames, BN: tl.constexpr):
    """paths (B, N, T): the token each ranked hypothesis order[b, :] appended at every kept frame (-1: none), from
    the backpointers :func:`ctc_search` wrote (its first count[b] rows)."""
    b = tl.program_id(0)
    on = tl.arange(0, BN)
    nmask = on < nbest
    rows = tl.load(order + b * nbest + on, mask=nmask, other=0)
    n = tl.load(count + b)
    out = paths + (b * nbest + on).to(tl.int64) * frames
    for i in range(n, frames):  # after the utterance's last kept frame
        tl.store(out + i, -1, mask=nmask)
    for j in range(0, n):
        i = n - 1 - j
        at = (i * batch + b) * beam + rows
        tl.store(out + i, tl.load(tokens + at, mask=nmask, other=-1), mask=nmask)
        rows = tl.load(parents + at, mask=nmask, other=0)
