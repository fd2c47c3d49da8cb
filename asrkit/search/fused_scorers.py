"""Triton device functions of the scorers that :func:`asrkit.search.fused_kernel.ctc_search` runs inside its
program: per kind, the score of appending each candidate token to each hypothesis, the state after a pick, and the
end-of-sentence score, each from the tables of the scorer's ``native_form()`` (the tables the native C++ loop reads,
``native/scorers.h``; :mod:`asrkit.search.fused_search` passes them), in the float order of its torch methods.

A hypothesis's state is a few registers per beam slot, vectors of (BK,): ``word_count`` whether a word is open;
``token_ngram`` (dense) the LM state id; ``lexicon`` the trie node times V+1; ``word_ngram`` the trie node, the
LM history state, the state once the partial word closes and the three floats of
:class:`asrkit.lm.word_ngram.WordNgramState` (what a letter, a boundary, ``</s>`` add beside the look-ahead).
Candidate scores are (BK, BC): slot k, candidate column c (token ``ctok[c]``; padding lanes read -2 and score
what masked loads give, never picked). Sorted key tables (sparse tries, the LM's n-gram keys) end with a sentinel
larger than any key and are searched by :func:`lower_bound` (``torch.searchsorted``, left).
"""
import triton
import triton.language as tl

DEAD_NODE = tl.constexpr(1)  # lexicon.DEAD and word_ngram.SINK: the trie node no listed word continues from


@triton.jit
def lower_bound(keys, n, q, iters):
    """The first position of ``keys`` (n sorted int64, ending with a larger sentinel) holding a key >= q (any
    shape), ``iters`` = n.bit_length() halvings."""
    lo = (q * 0).to(tl.int64)
    hi = lo + n
    for _ in range(iters):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(keys + mid, mask=active, other=0)
        go = active & (v < q)
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(active & (v >= q), mid, hi)
    return lo


@triton.jit
def from_parent(sel_p, x, fill):
    """Each slot's value of x (BK,) read at its parent: sel_p (slot, parent) one True per row."""
    return tl.max(tl.where(sel_p, x[None, :], fill), axis=1)


# ---- word_count (asrkit.search.scorers.WordCount): 1.0 for a token that closes an open word ----

@triton.jit
def wc_score(is_open, ctok, closes):
    """(BK, BC): closes[token] where a word is open (is_open (BK,) int)."""
    cl = tl.load(closes + ctok, mask=ctok >= 0, other=0)
    return tl.where((cl[None, :] != 0) & (is_open[:, None] != 0), 1.0, 0.0)


@triton.jit
def wc_select(is_open, tok, opens):
    """The state after appending tok (BK,) (-1: unchanged): opens[tok] unless it is -1."""
    after = tl.load(opens + tok, mask=tok >= 0, other=-1)
    return tl.where((tok < 0) | (after < 0), is_open, after)


# ---- token_ngram (asrkit.lm.ngram.NgramScorer, dense tables) ----

@triton.jit
def tn_score(state, ctok, cmask, logp, vocab):
    """(BK, BC): logp[state, token]."""
    return tl.load(logp + state[:, None] * vocab + ctok[None, :], mask=cmask, other=0.0)


@triton.jit
def tn_select(state, tok, next_state, vocab):
    new = tl.load(next_state + state * vocab + tok, mask=tok >= 0, other=0).to(tl.int64)
    return tl.where(tok >= 0, new, state)


# ---- lexicon (asrkit.search.lexicon.LexiconScorer): 0 on a listed word's prefix, else -inf ----

@triton.jit
def lx_next(base, col, mask, edge_keys, edge_dst, n_edges, iters, col_stay, col_closes, col_start, is_word, width):
    """The next node from row offsets base = node * (V+1) by columns col = token + 1 (sparse trie;
    LexiconScorer._next)."""
    key = base + col
    pos = lower_bound(edge_keys, n_edges, key, iters)
    found = tl.load(edge_keys + pos, mask=mask, other=-1) == key
    dst = tl.load(edge_dst + pos, mask=mask, other=DEAD_NODE)
    node = base // width
    stay = tl.load(col_stay + col, mask=mask, other=0) != 0
    closes = (tl.load(col_closes + col, mask=mask, other=0) != 0) & (tl.load(is_word + node, mask=mask, other=0) != 0)
    start = tl.load(col_start + col, mask=mask, other=-1)
    moved = tl.where(start >= 0, start, node)
    return tl.where(found, dst, tl.where(stay, node, tl.where(closes, moved, DEAD_NODE)))


@triton.jit
def lx_score(base, ctok, cmask, score_table, edge_keys, edge_dst, n_edges, iters, col_stay, col_closes, col_start,
             is_word, width, DENSE: tl.constexpr):
    """(BK, BC): 0 where the token keeps the hypothesis on listed words, else -inf."""
    if DENSE:
        out = tl.load(score_table + base[:, None] + (ctok[None, :] + 1), mask=cmask, other=0.0)
    else:
        nxt = lx_next(base[:, None], ctok[None, :] + 1, cmask, edge_keys, edge_dst, n_edges, iters, col_stay,
                      col_closes, col_start, is_word, width)
        out = tl.where(nxt == DEAD_NODE, float("-inf"), 0.0)
    return out


@triton.jit
def lx_select(base, tok, kmask, next_base, edge_keys, edge_dst, n_edges, iters, col_stay, col_closes, col_start,
              is_word, width, DENSE: tl.constexpr):
    """The row offset after appending tok (BK,); -1 reads column 0, which keeps the node."""
    if DENSE:
        out = tl.load(next_base + base + (tok + 1), mask=kmask, other=0)
    else:
        out = lx_next(base, tok + 1, kmask, edge_keys, edge_dst, n_edges, iters, col_stay, col_closes, col_start,
                      is_word, width) * width
    return out


@triton.jit
def lx_final(base, is_word, width, kmask):
    return tl.where(tl.load(is_word + base // width, mask=kmask, other=1) != 0, 0.0, float("-inf"))


# ---- word_ngram (asrkit.lm.word_ngram.WordNgramScorer, look-ahead and lexicon included) ----

@triton.jit
def wn_next_node(node, col, mask, trans, edge_keys, edge_dst, n_edges, iters, col_stay, col_start, col_is_start,
                 width, DENSE: tl.constexpr):
    """The trie node after columns col = token + 1 (0: no change) from node (WordNgramScorer._next_node)."""
    if DENSE:
        out = tl.load(trans + node * width + col, mask=mask, other=0).to(tl.int64)
    else:
        key = node * width + col
        pos = lower_bound(edge_keys, n_edges, key, iters)
        found = tl.load(edge_keys + pos, mask=mask, other=-1) == key
        dst = tl.load(edge_dst + pos, mask=mask, other=DEAD_NODE)
        is_start = tl.load(col_is_start + col, mask=mask, other=0) != 0
        stay = tl.load(col_stay + col, mask=mask, other=0) != 0
        other = tl.where(is_start, tl.load(col_start + col, mask=mask, other=0), tl.where(stay, node, DEAD_NODE))
        out = tl.where(found, dst, other)
    return out


@triton.jit
def wn_score(node, f0, f1, f2, ctok, cmask, la_next, la, trans, edge_keys, edge_dst, n_edges, iters, col_stay,
             col_start, col_is_start, col_is_end, token_slot, width, DENSE: tl.constexpr):
    """(BK, BC): LA(next node) + the state's float of the token's kind (WordNgramScorer.score)."""
    if DENSE:
        ahead = tl.load(la_next + node[:, None] * width + ctok[None, :], mask=cmask, other=0.0)
    else:
        col = ctok[None, :] + 1
        nxt = wn_next_node(node[:, None], col, cmask, trans, edge_keys, edge_dst, n_edges, iters, col_stay,
                           col_start, col_is_start, width, False)
        is_end = tl.load(col_is_end + col, mask=cmask, other=0) != 0
        ahead = tl.where(is_end, 0.0, tl.load(la + nxt, mask=cmask, other=0.0))
    slot = tl.load(token_slot + ctok, mask=ctok >= 0, other=0)[None, :]
    return ahead + tl.where(slot == 0, f0[:, None], tl.where(slot == 1, f1[:, None], f2[:, None]))


@triton.jit
def wn_select(node, hist, closed, tok, kmask, trans, edge_keys, edge_dst, n_edges, edge_iters, col_stay, col_start,
              col_is_start, node_word, node_floats, chain_keys, keys, n_keys, key_iters, next_state, row_floats,
              backoff, width, order, DENSE: tl.constexpr):
    """The state after appending tok (BK,) (WordNgramScorer.select_state; -1 reads column 0, which keeps the node and
    the history): (node, history, closed state, f0, f1, f2)."""
    col = tok + 1
    node = wn_next_node(node, col, kmask, trans, edge_keys, edge_dst, n_edges, edge_iters, col_stay, col_start,
                        col_is_start, width, DENSE)
    # a boundary closes the word: the history becomes the closed state
    hist = tl.where(tl.load(col_is_start + col, mask=kmask, other=0) != 0, closed, hist)
    closed, f0, f1, f2 = wn_state(node, hist, kmask, node_word, node_floats, chain_keys, keys, n_keys, key_iters,
                                  next_state, row_floats, backoff, order)
    return node, hist, closed, f0, f1, f2


@triton.jit
def wn_state(node, hist, kmask, node_word, node_floats, chain_keys, keys, n_keys, key_iters, next_state, row_floats,
             backoff, order):
    """The state of trie nodes ``node`` after LM states ``hist`` (BK,): the longest n-gram of the history's chain
    ending in the node's word (WordNgramScorer._state). Returns (closed state, f0, f1, f2)."""
    word = tl.load(node_word + node, mask=kmask, other=0)
    col = node * 0 - 1
    row = node * 0
    for j in range(order):  # the first match is the longest suffix (closure under suffixes)
        q = tl.load(chain_keys + hist * order + j, mask=kmask, other=0) + word
        pos = lower_bound(keys, n_keys, q, key_iters)
        hit = tl.load(keys + pos, mask=kmask, other=-1) == q
        first = (col < 0) & hit
        row = tl.where((j == 0) | first, pos, row)  # no match at all: column 0's position, as torch's argmax
        col = tl.where(first, j, col)
    col = tl.maximum(col, 0)
    bo = tl.load(backoff + hist * order + col, mask=kmask, other=0.0)
    f0 = (tl.load(row_floats + row * 3, mask=kmask, other=0.0) + bo * 0.0) + \
        tl.load(node_floats + node * 3, mask=kmask, other=0.0)
    f1 = (tl.load(row_floats + row * 3 + 1, mask=kmask, other=0.0) + bo) + \
        tl.load(node_floats + node * 3 + 1, mask=kmask, other=0.0)
    f2 = (tl.load(row_floats + row * 3 + 2, mask=kmask, other=0.0) + bo) + \
        tl.load(node_floats + node * 3 + 2, mask=kmask, other=0.0)
    closed = tl.load(next_state + row, mask=kmask, other=0)
    return closed, f0, f1, f2


# ---- token_ngram_lookup (asrkit.lm.ngram.NgramScorer without dense tables, orders up to 4) ----
# The state of a hypothesis is its history's last ORDER-1 LM words h1 (the latest) .. h3 and its back-off suffix
# sums b0 .. b3 (NgramState, NgramLM.backoff_sums); the k-gram tables are the LM's own sorted keys_k / prob_k / bo_k.

@triton.jit
def tk_lookup(keys, n, iters, size, first, ids, mask):
    """The row of the k-gram (first, the (k-1)-gram ``ids``) in the order-k table, or -1 (NgramLM._lookup)."""
    query = tl.where(ids >= 0, first * size + ids, -1)
    pos = lower_bound(keys, n, query, iters)
    return tl.where(tl.load(keys + pos, mask=mask, other=-2) == query, pos, -1)


@triton.jit
def tk_logprob(w, h1, h2, h3, b0, b1, b2, b3, mask, prob1, keys2, prob2, keys3, prob3, keys4, prob4, size1, size2,
               size3, n2, n3, n4, it2, it3, it4, ORDER: tl.constexpr):
    """ln P(w | history) (shapes broadcast; NgramLM.logprob): the longest k-gram ending in w, plus the back-offs
    of the longer contexts."""
    score = tl.load(prob1 + w, mask=mask, other=0.0) + b0
    ids = w
    if ORDER >= 2:
        ids = tk_lookup(keys2, n2, it2, size1, h1, ids, mask)
        score = tl.where(ids >= 0, tl.load(prob2 + tl.maximum(ids, 0), mask=mask, other=0.0) + b1, score)
    if ORDER >= 3:
        ids = tk_lookup(keys3, n3, it3, size2, h2, ids, mask)
        score = tl.where(ids >= 0, tl.load(prob3 + tl.maximum(ids, 0), mask=mask, other=0.0) + b2, score)
    if ORDER >= 4:
        ids = tk_lookup(keys4, n4, it4, size3, h3, ids, mask)
        score = tl.where(ids >= 0, tl.load(prob4 + tl.maximum(ids, 0), mask=mask, other=0.0) + b3, score)
    return score


@triton.jit
def tk_backoffs(h1, h2, h3, mask, bo1, keys2, bo2, keys3, bo3, size1, size2, n2, n3, it2, it3, ORDER: tl.constexpr):
    """The back-off suffix sums (b0, b1, b2, b3) of the history h1, h2, h3 (NgramLM.backoff_sums: column k-1 sums
    the back-offs of the contexts of the last k .. ORDER-1 words; columns from ORDER-1 on are 0)."""
    zero = tl.zeros(h1.shape, tl.float32)
    c0, c1, c2 = zero, zero, zero  # the back-off of the context of the last 1, 2, 3 words
    if ORDER >= 2:
        c0 = tl.load(bo1 + h1, mask=mask, other=0.0)
    if ORDER >= 3:
        ids = tk_lookup(keys2, n2, it2, size1, h2, h1, mask)
        c1 = tl.where(ids >= 0, tl.load(bo2 + tl.maximum(ids, 0), mask=mask, other=0.0), 0.0)
    if ORDER >= 4:
        ids = tk_lookup(keys3, n3, it3, size2, h3, ids, mask)
        c2 = tl.where(ids >= 0, tl.load(bo3 + tl.maximum(ids, 0), mask=mask, other=0.0), 0.0)
    # suffix sums from the end, in cumsum's order
    b3 = zero
    b2 = zero
    b1 = zero
    b0 = zero
    if ORDER == 2:
        b0 = zero + c0
    if ORDER == 3:
        b1 = zero + c1
        b0 = b1 + c0
    if ORDER == 4:
        b2 = zero + c2
        b1 = b2 + c1
        b0 = b1 + c0
    return b0, b1, b2, b3


@triton.jit
def tk_select(h1, h2, h3, b0, b1, b2, b3, tok, kmask, tok_to_lm, blank, eos_tok, bo1, keys2, bo2, keys3, bo3, size1,
              size2, n2, n3, it2, it3, ORDER: tl.constexpr):
    """The state after appending tok (BK,) (NgramScorer.select_state): the token's word enters the history, whose
    back-off sums are recomputed, unless the token is -1, the blank or <sos/eos>."""
    grow = (tok >= 0) & (tok != blank) & (tok != eos_tok)
    word = tl.load(tok_to_lm + tok, mask=kmask & (tok >= 0), other=0)
    n_b0, n_b1, n_b2, n_b3 = tk_backoffs(word, h1, h2, kmask, bo1, keys2, bo2, keys3, bo3, size1, size2, n2, n3, it2,
                                         it3, ORDER)
    if ORDER >= 2:  # an order-1 LM has no history
        h3 = tl.where(grow, h2, h3)
        h2 = tl.where(grow, h1, h2)
        h1 = tl.where(grow, word, h1)
    return h1, h2, h3, tl.where(grow, n_b0, b0), tl.where(grow, n_b1, b1), tl.where(grow, n_b2, b2), \
        tl.where(grow, n_b3, b3)
