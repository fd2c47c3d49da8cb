"""Back-off n-gram LM as device tensors, with batched lookup, and its token-unit search scorer.

Scores are **natural logs** (ARPA stores log10; every value is multiplied by ln 10 at load
time) because the search adds LM scores to CTC/attention log-probabilities in ln.

Table layout. The k-gram ``(w1 .. wk)`` gets an id: its row in the order-k table sorted by
the int64 key ``w1 * M[k-1] + id(w2 .. wk)``, where ``M[k-1]`` is the size of the
order-(k-1) table and the unigram id is the word id. Keys are built right to left, so one
``torch.searchsorted`` per order finds, for every (hypothesis, candidate) pair at once, the
bigram, trigram, ... ending in the candidate; a miss gives id -1, and every longer n-gram
then misses too. That needs every n-gram's suffix ``(w2 .. wk)`` in the model; ARPA files
from SRILM-style pruning can lack some, so the loader inserts them with their back-off
probability and a zero back-off, which leaves every score unchanged. It inserts missing
prefixes ``(w1 .. w(k-1))`` the same way, which makes the model a finite automaton whose state
is the longest suffix of the history in the model (:meth:`NgramLM.dense_tables`).

Back-off: ln P(w | h) = p(longest n-gram ``h_m w`` in the model) + sum of the back-off
weights of the contexts of h longer than ``h_m``. The context back-offs depend on h only, so
a hypothesis state caches their suffix sums (``bo_sums``): a score call is then one
searchsorted per order over (N, C) and a few gathers. :class:`NgramScorer` compiles LMs that
fit (states x tokens) into dense tables instead: one gather per call. For vocabularies too large
for dense tables (word LMs), :meth:`NgramLM.state_tables` keys every n-gram by (context state,
word): one searchsorted then finds the back-off score and the next state of a state id
(:meth:`NgramLM.state_logprob`). Words not in the model map to
``<unk>``; an ARPA without ``<unk>`` gets it with log10 prob -100 (as KenLM does).
The loader is pure Python: fine for pruned models of a few million n-grams.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from asrkit.lm.arpa import BOS, EOS, UNK, ArpaLM, read_arpa

LN10 = math.log(10.0)
UNK_MISSING_LOG10 = -100.0  # KenLM's default when the ARPA has no <unk>
# Largest dense token LM (states x tokens): 2**26 entries = 512 MB of tables; a BPE-500 4-gram on 4000
# sentences needs 35M (264 MB), a char 6-gram well under 1M.
DENSE_MAX_ENTRIES = 2 ** 26
_KEY_SENTINEL = torch.iinfo(torch.int64).max  # appended to every key table: no clamp needed


def _close_contexts(lm: ArpaLM) -> List[Dict[Tuple[str, ...], Tuple[float, float]]]:
    """Copy the tables, inserting every missing suffix (w2..wk) and prefix (w1..w(k-1)) of a listed k-gram.

    An inserted n-gram gets the probability back-off gave it (filled bottom-up from the complete
    lower orders) and back-off 0, so no score changes: a query whose longest match is now an
    inserted n-gram gets that same back-off value (the context back-offs it adds on top are the
    ones it added before), and as a context an inserted n-gram adds 0, like an absent one. Closed
    under suffixes, the lookup chain of :meth:`NgramLM._lookup` finds every n-gram; closed under
    prefixes too, the longest suffix of a history that is in the model decides every score, so
    the model is a finite automaton over those suffixes (:meth:`NgramLM.dense_tables`).
    """
    tables: List[dict] = [dict(t) for t in lm.ngrams]
    for k in range(lm.order, 1, -1):  # top-down: an inserted (k-1)-gram may lack its own suffix or prefix
        lower = tables[k - 2]
        for words in list(tables[k - 1]):
            for sub in (words[1:], words[:-1]):
                if sub not in lower:
                    if k == 2:
                        raise ValueError(f"word '{sub[0]}' occurs in the {k}-gram '{' '.join(words)}' "
                                         f"but not in the 1-grams")
                    lower[sub] = (None, 0.0)
    for k in range(2, lm.order + 1):  # bottom-up: fill probabilities from complete lower orders
        table = tables[k - 1]
        for words, (prob, bo) in table.items():
            if prob is None:
                # back-off: bo(prefix) + log10 P of the suffix, which is in the model (inserted ones filled already)
                table[words] = (tables[k - 2][words[:-1]][1] + tables[k - 2][words[1:]][0], bo)
    return tables


class NgramLM(torch.nn.Module):
    """A back-off n-gram LM on one device. Build with :func:`load_ngram` or ``NgramLM(ArpaLM)``.

    Word ids index :attr:`vocab`; ``pad_id = len(vocab)`` fills the history before ``<s>``
    and matches no n-gram. Hypothesis histories are ``(R, order-1)`` word ids, most recent last.
    """

    def __init__(self, arpa: ArpaLM, device: torch.device | str | None = None) -> None:
        super().__init__()
        tables = _close_contexts(arpa)
        unigrams = tables[0]
        for needed in (BOS, EOS):
            if (needed,) not in unigrams:
                raise ValueError(f"ARPA model has no {needed} in its 1-grams")
        if (UNK,) not in unigrams:
            unigrams[(UNK,)] = (UNK_MISSING_LOG10, 0.0)
        self.order = arpa.order
        self.vocab: List[str] = [w[0] for w in unigrams]
        self.word_to_id: Dict[str, int] = {w: i for i, w in enumerate(self.vocab)}
        self.bos_id, self.eos_id = self.word_to_id[BOS], self.word_to_id[EOS]
        self.unk_id = self.word_to_id[UNK]
        self.pad_id = len(self.vocab)
        v1 = len(self.vocab) + 1  # ids 0..V, pad included
        probs = [p for p, _ in unigrams.values()] + [-math.inf]
        backoffs = [b for _, b in unigrams.values()] + [0.0]
        self.register_buffer("prob_1", torch.tensor(probs, dtype=torch.float64).mul(LN10).float(), False)
        self.register_buffer("bo_1", torch.tensor(backoffs, dtype=torch.float64).mul(LN10).float(), False)
        # lower_ids maps each (k-1)-gram to its id: its row in the sorted order-(k-1) table
        lower_ids: Dict[Tuple[str, ...], int] = {w: i for i, w in enumerate(unigrams)}
        self.sizes = [v1]  # sizes[k-1] = rows of the order-k table (unigrams: ids incl. pad)
        for k in range(2, self.order + 1):
            table = tables[k - 1]
            mult = self.sizes[-1]
            if v1 * mult >= 2 ** 62:
                raise ValueError(f"{k}-gram keys overflow int64 ({v1} words x {mult} contexts)")
            first = np.fromiter((self._known(w[0], w) for w in table), np.int64, len(table))
            rest = np.fromiter((lower_ids[w[1:]] for w in table), np.int64, len(table))
            keys = first * mult + rest
            perm = np.argsort(keys, kind="stable")
            values = np.array(list(table.values()), dtype=np.float64).reshape(-1, 2)[perm] * LN10
            self._register_order(k, keys[perm], values)
            self.sizes.append(len(table))
            if k < self.order:
                entries = list(table)
                lower_ids = {entries[j]: row for row, j in enumerate(perm.tolist())}
        if device is not None:
            self.to(device)

    def _known(self, word: str, ngram: Tuple[str, ...]) -> int:
        wid = self.word_to_id.get(word)
        if wid is None:
            raise ValueError(f"word '{word}' occurs in the {len(ngram)}-gram '{' '.join(ngram)}' "
                             f"but not in the 1-grams")
        return wid

    def _register_order(self, k: int, keys: np.ndarray, values: np.ndarray) -> None:
        keys_t = torch.from_numpy(np.append(keys, _KEY_SENTINEL))
        vals = torch.from_numpy(np.vstack([values, np.zeros((1, 2))])).float()
        self.register_buffer(f"keys_{k}", keys_t, False)
        self.register_buffer(f"prob_{k}", vals[:, 0].contiguous(), False)
        if k < self.order:  # the highest order has no back-off weights
            self.register_buffer(f"bo_{k}", vals[:, 1].contiguous(), False)

    @property
    def device(self) -> torch.device:
        return self.prob_1.device

    def index(self, word: str) -> int:
        """LM id of a word; unknown words map to ``<unk>``."""
        return self.word_to_id.get(word, self.unk_id)

    # Gathers use Tensor.take: on CPU it is ~2.5x faster than advanced indexing for 1-D tables.
    def _lookup(self, k: int, first: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Row of the k-gram (first, <(k-1)-gram ids>) in the order-k table, or -1. Shapes broadcast."""
        keys = getattr(self, f"keys_{k}")
        query = torch.where(ids >= 0, first * self.sizes[k - 2] + ids, -1)
        pos = torch.searchsorted(keys, query)  # sentinel at the end: pos is always a valid row
        return torch.where(keys.take(pos) == query, pos, -1)

    def start(self, rows: int, device: Optional[torch.device] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """History ``(rows, order-1)`` = [pad ... pad, <s>] and its back-off sums ``(rows, order)``."""
        device = device or self.device
        hist = torch.full((rows, self.order - 1), self.pad_id, dtype=torch.long, device=device)
        if self.order > 1:
            hist[:, -1] = self.bos_id
        return hist, self.backoff_sums(hist)

    def backoff_sums(self, hist: torch.Tensor) -> torch.Tensor:
        """(R, order-1) history -> (R, order): column k-1 = sum of ln back-offs of the contexts
        made of the last j words, j = k .. order-1 (column order-1 is 0)."""
        rows, n = hist.shape[0], self.order
        bo = torch.zeros(rows, n, dtype=self.prob_1.dtype, device=hist.device)
        if n == 1:
            return bo
        ids = hist[:, -1]
        bo[:, 0] = self.bo_1.take(ids)
        for j in range(2, n):  # context of the last j words
            ids = self._lookup(j, hist[:, -j], ids)
            bo[:, j - 1] = torch.where(ids >= 0, getattr(self, f"bo_{j}").take(ids.clamp(min=0)), 0.0)
        # suffix sums: S_k = bo_k + ... + bo_{n-1}
        return bo.flip(1).cumsum(1).flip(1)

    def logprob(self, hist: torch.Tensor, bo_sums: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """ln P(word | history) for ``words`` (R, C) after ``hist`` (R, order-1) -> (R, C)."""
        score = self.prob_1.take(words) + bo_sums[:, :1]
        ids = words
        for k in range(2, self.order + 1):
            ids = self._lookup(k, hist[:, self.order - k].unsqueeze(1), ids)
            found_prob = getattr(self, f"prob_{k}").take(ids.clamp(min=0)) + bo_sums[:, k - 1:k]
            score = torch.where(ids >= 0, found_prob, score)
        return score

    def push(self, hist: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """Append ``words`` (R,) to histories (R, order-1), dropping the oldest word."""
        if self.order == 1:
            return hist
        return torch.cat([hist[:, 1:], words.unsqueeze(1)], dim=1)

    @property
    def num_states(self) -> int:
        """States of the LM as an automaton (see :meth:`dense_tables`)."""
        return 1 if self.order == 1 else len(self.vocab) + sum(self.sizes[1:self.order - 1])

    def _levels(self):
        """The states one length at a time, with their links; shared by the state machines below.

        Yields, for k = 1 .. order-1: ``offset``, ``rows`` (the k-word states are offset .. offset+rows-1),
        ``parent`` (rows,) the row of each state's suffix (its last k-1 words) among the (k-1)-word
        states (0, the empty context, for k = 1), ``bo`` (rows,) their ln back-offs, and for the
        (k+1)-grams in table order: ``prefix`` the row of their first k words and ``rest`` that of
        their last k words among the k-word states, and ``last`` their last word.
        """
        n_words = len(self.vocab)
        parent = torch.zeros(n_words, dtype=torch.long, device=self.device)
        offset = 0
        for k in range(1, self.order):
            rows = n_words if k == 1 else self.sizes[k - 1]
            bo = self.bo_1[:n_words] if k == 1 else getattr(self, f"bo_{k}")[:rows]
            keys = getattr(self, f"keys_{k + 1}")[:-1]
            first, rest = keys // self.sizes[k - 1], keys % self.sizes[k - 1]
            if k == 1:
                prefix, last = first, rest
            else:  # the prefix of (w1 .. wk+1) is (w1, <prefix of its suffix w2 .. wk+1>)
                prefix, last = self._lookup(k, first, prefix.take(rest)), last.take(rest)
                if bool((prefix < 0).any()):
                    raise RuntimeError(f"{k + 1}-grams whose prefix is not a {k}-gram; the tables are not closed")
            yield offset, rows, parent, bo, prefix, last, rest
            parent, offset = rest, offset + rows

    @torch.no_grad()
    def dense_tables(self, columns: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The LM as a finite automaton, for the LM word ids ``columns`` (C,).

        Its states are the k-grams of the model, k = 1 .. order-1: the unigram w is state w, row r
        of the order-k table (k >= 2) is state ``V + sizes[1] + .. + sizes[k-2] + r`` (V words);
        an order-1 LM has one state. A history's state is its longest suffix in the model (the
        start is ``<s>``); as the tables are closed under prefixes, it decides every score.
        Returns ``logp`` (S, C) float32, ln P(columns[c] | state s), ``next_state`` (S, C) int32,
        the state after appending columns[c], and ``eos`` (S,) float32, ln P(</s> | s).

        Built one order at a time from the back-off recursion, in float64 (no gather per n-gram
        lookup): row s is the row of s's suffix (s minus its first word) plus bo(s), with the listed
        (k+1)-grams s + w written over it; ``next_state`` the same, with s + w as the next state
        where it is one (k+1 < order). The work rows hold only the distinct words of ``columns`` and
        </s> (U <= C + 1), never the whole vocabulary: memory is 8 bytes per entry, plus 12 bytes per
        entry of one order's (rows, U) work.
        """
        dev = self.device
        cols = columns.to(dev, torch.long)
        words, col_of = torch.unique(torch.cat([cols, cols.new_tensor([self.eos_id])]), return_inverse=True)  # (U,)
        col_of, eos_col = col_of[:-1], col_of[-1]  # each column's and </s>'s place among the U words
        logp = torch.empty(self.num_states, len(cols), dtype=torch.float32, device=dev)
        next_state = torch.zeros(self.num_states, len(cols), dtype=torch.int32, device=dev) if self.order == 1 \
            else torch.empty(self.num_states, len(cols), dtype=torch.int32, device=dev)  # every row written
        eos = torch.empty(self.num_states, dtype=torch.float32, device=dev)
        lp = self.prob_1.take(words).double().unsqueeze(0)  # (1, U): the empty context
        st = words.to(torch.int32).unsqueeze(0)  # (1, U): the unigram states
        if self.order == 1:
            logp.copy_(lp.index_select(1, col_of))
            eos.copy_(lp[:, eos_col])
            return logp, next_state, eos
        for k, (offset, rows, parent, bo, prefix, last, _) in enumerate(self._levels(), 1):
            lp = lp.index_select(0, parent).add_(bo.double().unsqueeze(1))  # (rows, U): backed off to the suffix
            st = st.index_select(0, parent)  # (rows, U)
            at = torch.searchsorted(words, last).clamp_(max=len(words) - 1)  # the listed (k+1)-grams, of the U words
            kept = (words.take(at) == last).nonzero().squeeze(1)
            lp[prefix.take(kept), at.take(kept)] = getattr(self, f"prob_{k + 1}").take(kept).double()
            if k + 1 < self.order:
                st[prefix.take(kept), at.take(kept)] = (kept + (offset + rows)).to(torch.int32)
            logp[offset:offset + rows] = lp.index_select(1, col_of)
            next_state[offset:offset + rows] = st.index_select(1, col_of)
            eos[offset:offset + rows] = lp[:, eos_col]
        return logp, next_state, eos

    # -- context-state ids with one searchsorted per lookup (for vocabularies too large for dense_tables) --
    @property
    def start_state(self) -> int:
        """The state of the empty history (the unigram state ``<s>``; 0 for an order-1 LM)."""
        return 0 if self.order == 1 else self.bos_id

    @torch.no_grad()
    def state_tables(self) -> "NgramStates":
        """The context-state tables (built on the first call, then kept as buffers that move with the LM).

        States as in :meth:`dense_tables` (S = :attr:`num_states`). The empty context gets the id
        ``E`` = S (0 in an order-1 LM, whose one state it is). Every n-gram ``c + w`` of the model, the
        unigrams as ``E + w``, is keyed by ``(state of c) * (V+1) + w`` in one sorted table with its ln
        prob and the state it leads to: ``c + w`` itself if it has at most order-1 words, else its last
        order-1 words. ``chain_keys[s]`` lists (V+1) times the states of s's suffixes, right-aligned,
        longest (s) first and E last, padded on the left with -(V+1): column j holds the suffix of
        order-1-j words. ``backoff[s, j]`` sums the ln back-offs of columns 0 .. j-1.
        As the model is closed under suffixes, the n-grams ``chain[s, j] + w`` that exist are those of
        the last columns, from the longest match j on: :meth:`state_logprob` finds them all with one
        searchsorted, and ln P(w | s) = prob(``chain[s, j] + w``) + ``backoff[s, j]``. The key ``(s, pad)`` of
        every state maps it to itself with ln P 0, so that looking up the pad word changes nothing (a word
        scorer's empty word).

        Memory: ``chain_keys`` and ``backoff`` are S x order (12 bytes an entry), the key table 20 bytes
        per n-gram: fine for pruned models of a few million n-grams.
        """
        if not hasattr(self, "state_keys"):
            self._build_state_tables()
        return NgramStates(self.state_chain_keys, self.state_backoff, self.state_keys, self.state_prob,
                           self.state_next, self.state_eos)

    def _build_state_tables(self) -> None:
        dev, n, width, n_words = self.device, self.order, self.sizes[0], len(self.vocab)
        empty = 0 if n == 1 else self.num_states
        if (empty + 1) * width >= 2 ** 62:
            raise ValueError(f"state keys overflow int64 ({empty} states x {width} words)")
        words = torch.arange(n_words, device=dev)
        chain = torch.full((1, n), -1, dtype=torch.long, device=dev)  # the empty context's own chain
        chain[0, -1] = empty
        backoff = torch.zeros(1, n, dtype=torch.float64, device=dev)
        chains, backoffs = [chain], [backoff]
        keys, probs = [empty * width + words], [self.prob_1[:n_words]]
        nexts = [words if n > 1 else torch.zeros_like(words)]
        for k, (offset, rows, parent, bo, prefix, last, rest) in enumerate(self._levels(), 1):
            chain = chain.index_select(0, parent)  # (rows, n): the suffix's chain, then the state itself
            chain[:, n - 1 - k] = torch.arange(offset, offset + rows, device=dev)
            backoff = backoff.index_select(0, parent)
            backoff[:, n - k:] += bo.double().unsqueeze(1)
            chains.append(chain)
            backoffs.append(backoff)
            keys.append((prefix + offset) * width + last)
            probs.append(getattr(self, f"prob_{k + 1}")[:-1])
            nexts.append(torch.arange(len(last), device=dev) + (offset + rows) if k + 1 < n else rest + offset)
        if n > 1:
            chains, backoffs = chains[1:], backoffs[1:]
        n_states = sum(len(c) for c in chains)
        states = torch.arange(n_states, device=dev)  # (state, pad): the identity, ln P 0 and the same state
        keys.append(states * width + self.pad_id)
        probs.append(torch.zeros(n_states, device=dev))
        nexts.append(states)
        keys_t = torch.cat(keys)
        keys_t, perm = keys_t.sort()
        if bool((keys_t[1:] == keys_t[:-1]).any()):
            raise RuntimeError("two n-grams with the same (state, word) key")
        chain = torch.cat(chains)
        pad = torch.zeros(1, dtype=torch.long, device=dev)
        self.register_buffer("state_chain_keys", torch.where(chain >= 0, chain * width, -width), False)
        self.register_buffer("state_backoff", torch.cat(backoffs).float(), False)
        self.register_buffer("state_keys", torch.cat([keys_t, pad + _KEY_SENTINEL]), False)
        self.register_buffer("state_prob", torch.cat([torch.cat(probs)[perm], pad.float()]), False)
        self.register_buffer("state_next", torch.cat([torch.cat(nexts)[perm], pad]), False)
        self.register_buffer("state_eos", torch.empty(len(chain), device=dev), False)
        eos = [self.state_logprob(states, torch.full_like(states, self.eos_id).unsqueeze(1))[0][:, 0]
               for states in torch.arange(len(chain), device=dev).split(1 << 20)]  # bounded work arrays
        self.state_eos = torch.cat(eos)

    def state_logprob(self, states: torch.Tensor, words: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """ln P(word | state) and the next state for ``words`` (R, C) (ids < V) after ``states`` (R,).

        Returns (R, C) float32 and (R, C) int64. One searchsorted over the (R, C, order) keys of
        (suffix of the state, word); no host sync.
        """
        t = self.state_tables()
        query = t.chain_keys.index_select(0, states).unsqueeze(1) + words.unsqueeze(2)  # (R, C, order)
        pos = torch.searchsorted(t.keys, query)  # sentinel at the end: pos is always a valid row
        found = (t.keys.take(pos) == query).sum(2)  # (R, C) >= 1: the unigram column always matches
        col = self.order - found  # the longest match, from which on every column matches (suffix closure)
        row = pos.gather(2, col.unsqueeze(2)).squeeze(2)
        lp = t.prob.take(row) + t.backoff.index_select(0, states).gather(1, col)
        return lp, t.next_state.take(row)

    def word_logprob(self, states: torch.Tensor, words: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`state_logprob` for one word per state: ``states`` (R,), ``words`` (R, 1) -> (R, 1) ln P and
        (R, 1) next state. The same single searchsorted in fewer ops (a word scorer runs it every search step)."""
        t = self.state_tables()
        query = t.chain_keys.index_select(0, states).add_(words)  # (R, order)
        pos = torch.searchsorted(t.keys, query)  # sentinel at the end: pos is always a valid row
        # the matching columns are the last ones (suffix closure): the first match is the longest
        col = torch.eq(t.keys.take(pos), query).max(1, keepdim=True)[1]  # (R, 1)
        row = pos.gather(1, col)
        lp = t.prob.take(row) + t.backoff.index_select(0, states).gather(1, col)
        return lp, t.next_state.take(row)

    @torch.no_grad()
    def max_logprobs(self) -> torch.Tensor:
        """(V,) float32: for every word w an upper bound of ln P(w | h) over every history h (positive back-off
        weights can lift a backed-off probability above the n-gram's own). From the state tables: a history
        whose longest match for w is the n-gram ``c + w`` scores prob(c + w) plus the back-offs of its longer
        contexts, at most the largest back-off sum any state adds on top of context c."""
        t = self.state_tables()
        width, n_words = self.sizes[0], len(self.vocab)
        valid = t.chain_keys >= 0  # (S, order): the columns that hold a context of the state
        context = torch.div(t.chain_keys, width, rounding_mode="floor")[valid]
        on_top = torch.full((int(context.max()) + 1,), -math.inf, device=self.device)
        on_top.scatter_reduce_(0, context, t.backoff[valid], "amax")  # per context: the most added on top
        keys = t.keys[:-1]  # without the sentinel
        word = keys % width
        real = word < n_words  # not the pad word's identity keys
        best = torch.full((n_words,), -math.inf, device=self.device)
        best.scatter_reduce_(0, word[real], (t.prob[:-1] + on_top.take(keys // width))[real], "amax")
        return best

    def sentence_logprobs(self, words: Sequence[str], eos: bool = True) -> List[float]:
        """ln P of each word (and of </s> when ``eos``) of one sentence after <s>; for checks."""
        hist, bo = self.start(1)
        out = []
        ids = [self.index(w) for w in words] + ([self.eos_id] if eos else [])
        for wid in ids:
            w = torch.tensor([wid], device=self.device)
            out.append(float(self.logprob(hist, bo, w.unsqueeze(1))[0, 0]))
            hist = self.push(hist, w)
            bo = self.backoff_sums(hist)
        return out


def load_ngram(path: str | os.PathLike, device: torch.device | str | None = None) -> NgramLM:
    """Read an ARPA file (plain or gzip) into an :class:`NgramLM` on ``device``."""
    return NgramLM(read_arpa(path), device=device)


class UnitsError(ValueError):
    """An n-gram LM given with the other units than its words have: a word LM as tokens, or a token LM as words.
    ``what`` says what the LM is and why; ``units`` is the units it needs."""

    def __init__(self, what: str, units: str) -> None:
        other = "token" if units == "word" else "word"
        super().__init__(f"{what}, but units='{other}': pass units='{units}'")
        self.what, self.units = what, units


class NgramStates(NamedTuple):
    """The context-state tables of :meth:`NgramLM.state_tables` (S states, G n-grams incl. unigrams)."""

    chain_keys: torch.Tensor  # (S, order) int64: (V+1) x state of each suffix, right-aligned, -(V+1) pads
    backoff: torch.Tensor  # (S, order) float32: ln back-offs of the chain columns before column j, summed
    keys: torch.Tensor  # (G+1,) int64 sorted (state of context) * (V+1) + word, then a sentinel
    prob: torch.Tensor  # (G+1,) float32 ln prob of each n-gram
    next_state: torch.Tensor  # (G+1,) int64 the state after it
    eos: torch.Tensor  # (S,) float32 ln P(</s> | state)


class NgramState(NamedTuple):
    """Per-hypothesis LM state (leading dim N)."""

    hist: torch.Tensor  # (N, order-1) LM word ids, most recent last
    bo_sums: torch.Tensor  # (N, order) ln back-off suffix sums of hist (see NgramLM.backoff_sums)


class NgramScorer:
    """Batched scorer (asrkit.search protocol) for an LM whose words are the tokenizer's tokens.

    ``token_list[i]`` is token i's string; tokens absent from the LM score as ``<unk>`` (a warning gives
    their count and examples); when most tokens are absent, the LM is a word LM and :class:`UnitsError` says
    so (a word LM's dense tables once filled 22 GB). The blank scores 0 and never enters the history;
    ``sos_eos_id`` scores as ``</s>`` (None: the token named ``<sos/eos>``, ``</s>`` or ``<eos>`` if any; -1: none).

    Two paths with the same scores. Dense (the default while ``S * V_tok <= dense_max_entries``,
    S = ``lm.num_states``): the LM compiled at construction into tables on its device,
    ``logp`` (S, V_tok) float32 and ``next_state`` (S, V_tok) int32 (:meth:`NgramLM.dense_tables`,
    blank column 0 / unchanged state, sos/eos column ln P(</s>) / unchanged state); the state is an
    (N,) int64 state id and every call is one gather. Lookup (``dense=False``, or larger LMs): the
    state is an :class:`NgramState` and a score call searches the n-gram tables. ``dense=True`` beyond
    ``dense_max_entries`` is an error giving the size, raised before anything is allocated.
    """

    def __init__(self, lm: NgramLM, token_list: Sequence[str], blank_id: int = 0, sos_eos_id: Optional[int] = None,
                 dense: Optional[bool] = None, dense_max_entries: int = DENSE_MAX_ENTRIES) -> None:
        self.lm = lm
        token_list = list(token_list)
        if not 0 <= blank_id < len(token_list):
            raise ValueError(f"blank_id={blank_id} is outside the token list (0 .. {len(token_list) - 1})")
        if sos_eos_id is None:  # by name; -1 (or a token list without one): no sos/eos token
            sos_eos_id = next((i for i, t in enumerate(token_list) if t in ("<sos/eos>", "</s>", "<eos>")), -1)
        elif not -1 <= sos_eos_id < len(token_list) or sos_eos_id == blank_id:
            raise ValueError(f"sos_eos_id={sos_eos_id} is outside the token list (0 .. {len(token_list) - 1}, "
                             f"-1 for none) or is the blank")
        self.blank_id, self.sos_eos_id = blank_id, sos_eos_id
        ids = [lm.eos_id if i == sos_eos_id else lm.index(t) for i, t in enumerate(token_list)]
        ordinary = [t for i, t in enumerate(token_list) if i not in (blank_id, sos_eos_id)
                    and t.lower() not in ("<unk>", "[unk]")]
        missing = [t for t in ordinary if t not in lm.word_to_id]
        if 2 * len(missing) > len(ordinary):  # a token LM lacks a few rare tokens at most: this is a word LM
            examples = [w for w in lm.vocab if w not in (BOS, EOS, UNK)][:3]
            raise UnitsError(f"a word LM (asrkit train-ngram --units word): {len(missing)} of {len(ordinary)} tokens "
                             f"are not words of the LM (e.g. {', '.join(map(repr, missing[:3]))}; its words: "
                             f"{', '.join(map(repr, examples))}, ...)", "word")
        if missing:
            shown = ", ".join(repr(t) for t in missing[:8]) + (", ..." if len(missing) > 8 else "")
            warnings.warn(f"{len(missing)} of {len(token_list)} tokens are not in the LM's vocabulary and score as "
                          f"<unk>: {shown} (is the LM over these tokens? a word LM needs units='word')", stacklevel=3)
        self.tok_to_lm = torch.tensor(ids, dtype=torch.long, device=lm.device)  # (V_tok,)
        self.vocab = len(ids)
        entries = lm.num_states * self.vocab
        self.dense = entries <= dense_max_entries if dense is None else bool(dense)
        if self.dense and entries > dense_max_entries:  # refused before anything is allocated
            raise ValueError(f"dense tables of {lm.num_states} LM states x {self.vocab} tokens = {entries} entries "
                             f"({entries * 8 / 2 ** 20:.1f} MB) exceed dense_max_entries={dense_max_entries}: leave "
                             f"dense unset (the lookup path) or raise the limit")
        if self.dense:
            self.start_id = 0 if lm.order == 1 else lm.bos_id  # the unigram state <s>
            self.logp, self.next_state, self.eos_logp = lm.dense_tables(self.tok_to_lm)  # (S, V_tok) x2, (S,)
            own = torch.arange(lm.num_states, dtype=torch.int32, device=lm.device)
            for tok in (blank_id, sos_eos_id):  # scored as 0 / </s>; neither enters the history
                if 0 <= tok < self.vocab:
                    self.next_state[:, tok] = own
            if 0 <= blank_id < self.vocab:
                self.logp[:, blank_id] = 0.0

    def _to(self, device: torch.device) -> None:
        # .to is a no-op for a tensor already there; the LM may be shared and moved by another scorer
        self.lm.to(device)
        self.tok_to_lm = self.tok_to_lm.to(device)
        if self.dense:
            self.logp, self.next_state, self.eos_logp = (
                t.to(device) for t in (self.logp, self.next_state, self.eos_logp))

    def init_state(self, batch: int, beam: int, device: torch.device) -> Union[torch.Tensor, NgramState]:
        self._to(device)
        if self.dense:
            return torch.full((batch * beam,), self.start_id, dtype=torch.long, device=device)
        return NgramState(*self.lm.start(batch * beam, device))

    def score(self, state: Union[torch.Tensor, NgramState], tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) ln P(token | history); 0 for the blank."""
        if self.dense:  # one gather from the state rows of the flat (S * V_tok,) table
            return self.logp.view(-1).take(state.unsqueeze(1) * self.vocab + tokens)
        lp = self.lm.logprob(state.hist, state.bo_sums, self.tok_to_lm.take(tokens))
        return torch.where(tokens == self.blank_id, 0.0, lp)

    def select_state(self, state: Union[torch.Tensor, NgramState], index: torch.Tensor,
                     tokens: torch.Tensor) -> Union[torch.Tensor, NgramState]:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); -1, blank and sos/eos leave a row unchanged."""
        if self.dense:
            old = state.take(index)  # (M,)
            new = self.next_state.view(-1).take(old * self.vocab + tokens.clamp(min=0))
            return torch.where(tokens >= 0, new, old)  # int64
        hist, bo = state.hist[index], state.bo_sums[index]
        grow = (tokens >= 0) & (tokens != self.blank_id) & (tokens != self.sos_eos_id)  # (M,)
        new_hist = self.lm.push(hist, self.tok_to_lm.take(tokens.clamp(min=0)))
        hist = torch.where(grow.unsqueeze(1), new_hist, hist)
        return NgramState(hist, torch.where(grow.unsqueeze(1), self.lm.backoff_sums(hist), bo))

    def max_gain(self) -> Tuple[float, float, bool]:
        """The most the LM adds (asrkit.search.interfaces.BoundedScorer): per token its largest ln P, and the end
        once more. Dense: the tables' largest entries; lookup: :meth:`NgramLM.max_logprobs` of the tokens' words."""
        if self.dense:
            per_token, end = float(self.logp.max()), float(self.eos_logp.max())
        else:
            best = self.lm.max_logprobs()
            per_token, end = float(best.take(self.tok_to_lm).max()), float(best[self.lm.eos_id])
        return max(end, 0.0), max(per_token, 0.0), False

    def final_score(self, state: Union[torch.Tensor, NgramState]) -> torch.Tensor:
        """(N,) ln P(</s> | history)."""
        if self.dense:
            return self.eos_logp.take(state)
        eos = torch.full((state.bo_sums.shape[0], 1), self.lm.eos_id, dtype=torch.long,
                         device=state.bo_sums.device)
        return self.lm.logprob(state.hist, state.bo_sums, eos)[:, 0]

    def native_form(self) -> Optional[Tuple[str, Dict[str, torch.Tensor]]]:
        """The tables for the native searches (asrkit.search.interfaces.NativeScorer): kind "token_ngram", the dense
        tables; for the lookup path kind "token_ngram_lookup" (the GPU's fused search runs it, the C++ loop does not):
        ``tok_to_lm``, the LM's own k-gram tables ``prob_k``, ``bo_k``, ``keys_k`` and ``size_k`` (the rows of the
        order-k table, NgramLM._lookup's key multiplier), the special ids and ``eos_word`` (the LM's </s>)."""
        if not self.dense:
            lm = self.lm
            tables = {"prob_1": lm.prob_1, "bo_1": lm.bo_1}
            for k in range(2, lm.order + 1):  # the highest order has no back-offs
                names = (f"keys_{k}", f"prob_{k}") + ((f"bo_{k}",) if k < lm.order else ())
                tables.update({name: getattr(lm, name) for name in names})
            tables.update({f"size_{k}": torch.tensor(size) for k, size in enumerate(lm.sizes, 1)})
            return "token_ngram_lookup", dict(
                tables, tok_to_lm=self.tok_to_lm, order=torch.tensor(lm.order), blank_id=torch.tensor(self.blank_id),
                sos_eos_id=torch.tensor(self.sos_eos_id), eos_word=torch.tensor(lm.eos_id))
        return "token_ngram", dict(logp=self.logp, next_state=self.next_state, eos=self.eos_logp,
                                   vocab=torch.tensor(self.vocab), start_state=torch.tensor(self.start_id))
