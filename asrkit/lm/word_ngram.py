"""A word-level n-gram LM applied to a search over sub-word tokens (chars or sentencepiece pieces).

Word boundaries: a token whose string starts with the boundary mark begins a new word, so the word
spelled so far is complete. The mark is ``▁`` (sentencepiece and asrkit's char tokenizer), ``|``
(wav2vec2 / flashlight token sets) or the space ``" "``, found in the token list, or named with
``word_boundary``; a token list with none of them is an error naming its tokens. A lone mark is a
word boundary with no letters; a piece "▁THE" completes the previous word and starts "THE". A
completed word is scored with the word LM (ln P(word | previous words); words not in the LM score
as ``<unk>``), and ``final_score`` scores the last partial word plus ``</s>``. The mark inside a
token is taken as a letter. The tokenizer's ``<unk>`` token is a letter that no LM word contains,
so a word holding it scores as ``<unk>``. An LM with words that start with the mark is a token LM (its words
are the tokenizer's pieces): :class:`asrkit.lm.ngram.UnitsError`.

Partial words are nodes of the **letter trie of the LM's words** (node 0 = the empty word, node 1 =
"no LM word starts like this", absorbing until the next boundary). A (nodes, V+1) table gives the
node after each token, built once (column 0 is the search's ``-1``, "no change"); with look-ahead a
table of the same shape gives the next node's look-ahead, so a ``score`` call is two gathers plus
one per-row term. Tries too large for dense tables (``dense_max_entries``) keep only the trie's
edges in a sorted key table (one searchsorted per call instead).

The word history is an LM context-state id (:meth:`NgramLM.state_tables`: the longest suffix of
the history that is in the model). Whenever a partial word changes, ``select_state`` also gets the
word's score ln P(word | history) and ``closed_state``, the history's state once the word closes,
from one n-gram searchsorted (:meth:`NgramLM.word_logprob`): a word boundary is then a select, and
``</s>`` a gather from the per-state ln P(</s> | state) table. The state keeps, per hypothesis, what
appending a token of each kind (letters, boundary, ``</s>``) adds beside the trie's look-ahead.

Partial-word option ``lookahead`` (default on): while a word is being spelled, its score
is LA(prefix) = the best ln unigram probability among LM words that start with the prefix
(``<unk>``'s when none does). Each token adds LA(new prefix) - LA(old prefix), and completing the
word adds ln P(word | history) - LA(word), so a finished sentence gets exactly the word LM score
while the search can already prune misspelt prefixes. With ``lookahead=False`` letters score 0 and
the whole word score lands on the boundary (add a per-token length bonus scorer in the search if
needed).

``lexicon`` (a word list): lexicon-constrained search in the same scorer. The trie is then the
listed words' (words outside the LM score as ``<unk>`` plus ``unk_offset``), a token that leaves it
scores -inf, and a boundary or ``</s>`` is allowed only after a whole listed word. Finished
hypotheses score as with this scorer (no lexicon) fused with :class:`asrkit.search.lexicon.LexiconScorer`
(tested); the look-ahead counts listed words only, and the work is one scorer's ops instead of two.
The search's ``token_min_logp`` floor can cut exactly the tokens a lexicon search needs to spell a listed
word near an unlisted one: on tools/bench/bench_decode.py's char inputs (7.5% OOV words, beam 10) WER was 14.3%
with the default floor of -12 and 11.2% without it (no slower): pass ``token_min_logp=None`` with a lexicon.

:meth:`WordNgramScorer.with_words` adds words to the trie for the searches that need them (hotwords outside the
lexicon and the LM), in a copy: outside the LM they score as ``<unk>`` plus the offset, or as a stated class
score, ln P(word) = S after any history, which the word leaves unchanged (its node's word is the LM's pad word:
ln P 0 and the same state, as the empty word's).

``unk_offset`` (ln) is added to every word outside the LM and, with look-ahead, to partial words
that no LM word starts with (their look-ahead is then ``<unk>``'s plus the offset): a negative
offset keeps the search from spelling out-of-vocabulary words, as pyctcdecode's
``unk_score_offset`` does. With 0 (the LM's own ``<unk>`` score) a misspelt word is often cheaper
than two real ones, and the search glues words together. Default :data:`DEFAULT_UNK_OFFSET` = -10,
measured with tools/bench/bench_decode.py's text inputs (32 held-out utterances, word 3-gram, weight 0.5,
beam 10), WER at offsets 0 / -5 / -10 / -15 / -23: chars 11.6 / 7.2 / 5.3 / 5.4 / 5.4%, BPE-500
6.9 / 3.7 / 3.4 / 3.0 / 3.3%.
"""
from __future__ import annotations

import copy
import math
import warnings
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from asrkit.lm.arpa import BOS, EOS, UNK
from asrkit.lm.ngram import NgramLM, UnitsError

WORD_MARK = "\u2581"  # "▁"
BOUNDARY_MARKS = (WORD_MARK, "|", " ")  # the word-boundary marks found automatically
DEFAULT_UNK_OFFSET = -10.0
COPIES_KEPT = 8  # with_words: the copies (tries with words added) kept, by content
DENSE_TRIE_MAX_ENTRIES = 2 ** 23  # (trie nodes x (V+1)) entries of the dense tables: 64 + 32 MB at most
ROOT, SINK = 0, 1  # trie nodes: the empty word; a partial word that no LM word starts with
SKIP, CONT, START, END = 0, 1, 2, 3  # token kinds
_UNK_NAMES = ("<unk>", "<UNK>", "[UNK]", "<oov>")
_EOS_NAMES = ("<sos/eos>", "</s>", "<eos>")


def find_special(token_list: Sequence[str], given: Optional[int], names: Sequence[str], what: str) -> Optional[int]:
    """Validate an explicit special id against the token list, or find it by name (None if absent)."""
    if given is None:
        found = [i for i, t in enumerate(token_list) if t in names]
        return found[0] if found else None
    if not 0 <= int(given) < len(token_list):
        raise ValueError(f"{what}={given} is outside the token list (0 .. {len(token_list) - 1})")
    return int(given)


def find_boundary(token_list: Sequence[str], special: Sequence[Optional[int]],
                  word_boundary: Optional[str] = None) -> str:
    """The word-boundary mark that tokens start with: ``word_boundary`` if given (checked), else the one
    of :data:`BOUNDARY_MARKS` that some token starts with. Errors name the tokens."""
    ordinary = [t for i, t in enumerate(token_list) if i not in special]
    if word_boundary is not None:
        if not word_boundary or not any(t.startswith(word_boundary) for t in ordinary):
            raise ValueError(f"word_boundary {word_boundary!r}: no token starts with it; tokens: {_show(ordinary)}")
        return word_boundary
    marks = [m for m in BOUNDARY_MARKS if any(t.startswith(m) for t in ordinary)]
    if not marks:
        raise ValueError(f"the word LM needs a word-boundary token: no token starts with any of "
                         f"{', '.join(repr(m) for m in BOUNDARY_MARKS)}; tokens: {_show(ordinary)}. "
                         f"Pass word_boundary=... naming the mark, or use a token-unit LM (units='token')")
    if len(marks) > 1:
        raise ValueError(f"tokens start with several word-boundary marks ({', '.join(repr(m) for m in marks)}): "
                         f"pass word_boundary=... to say which one separates words")
    return marks[0]


def _show(items: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(repr(t) for t in items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)} in all)"


class WordNgramState(NamedTuple):
    """Per-hypothesis state (leading dim N)."""

    ints: torch.Tensor  # (N, 3) int64: trie node, LM state of the completed words, LM state after closing
    floats: torch.Tensor  # (N, 3): what a letter, a boundary, </s> adds beside the trie's look-ahead (see score)

    @property
    def node(self) -> torch.Tensor:
        """(N,) trie node of the partial word (0: empty)."""
        return self.ints[:, 0]

    @property
    def hist_state(self) -> torch.Tensor:
        """(N,) LM state of the completed words."""
        return self.ints[:, 1]

    @property
    def closed_state(self) -> torch.Tensor:
        """(N,) LM state after closing the partial word (= hist_state while it is empty)."""
        return self.ints[:, 2]


class WordNgramScorer:
    """Batched scorer (asrkit.search protocol) applying a word LM at word boundaries of tokens.

    Special ids: ``blank_id`` (scores 0, changes nothing), ``unk_id`` (a letter no word has),
    ``sos_eos_id`` (scores ``</s>``); ``None`` for ``unk_id``/``sos_eos_id`` finds them by name
    (``<unk>``, ``<sos/eos>``/``</s>``) or leaves them out. Ids are checked against ``token_list``.

    Per call, with no host sync: ``score`` five gathers/adds over the (N, C) candidates;
    ``select_state`` about 20 ops over (N,) rows with one searchsorted (:meth:`NgramLM.word_logprob`
    inlined, the closing and final terms of a word from one row of a per-n-gram table);
    ``final_score`` one slice. Memory: the LM's state tables (:meth:`NgramLM.state_tables`) and 8
    bytes per (trie node, token) while that fits ``dense_max_entries`` (a 4,284-word LM: 13,301 nodes,
    3.4 MB with 31 char tokens, 51 MB with 500 BPE pieces), else 16 per trie edge and a searchsorted
    per call (about 1.3x the time of the dense path in the CTC prefix search, measured).
    """

    def __init__(self, lm: NgramLM, token_list: Sequence[str], lookahead: bool = True,
                 blank_id: int = 0, unk_id: Optional[int] = None, sos_eos_id: Optional[int] = None,
                 unk_offset: float = DEFAULT_UNK_OFFSET, word_boundary: Optional[str] = None,
                 dense_max_entries: int = DENSE_TRIE_MAX_ENTRIES, lexicon: Optional[Iterable[str]] = None) -> None:
        self.lm, self.lookahead, self.unk_offset, self.order = lm, lookahead, float(unk_offset), lm.order
        token_list = list(token_list)
        blank_id = find_special(token_list, blank_id, (), "blank_id")
        unk_id = find_special(token_list, unk_id, _UNK_NAMES, "unk_id")
        sos_eos_id = find_special(token_list, sos_eos_id, _EOS_NAMES, "sos_eos_id")
        given = [i for i in (blank_id, unk_id, sos_eos_id) if i is not None]
        if len(set(given)) < len(given):
            raise ValueError(f"blank_id={blank_id}, unk_id={unk_id}, sos_eos_id={sos_eos_id}: two are the same token")
        special = (blank_id, unk_id, sos_eos_id)
        marks = BOUNDARY_MARKS if word_boundary is None else (word_boundary,)
        for name, i in (("unk_id", unk_id), ("sos_eos_id", sos_eos_id)):
            if i is not None and token_list[i] and token_list[i].startswith(marks):
                raise ValueError(f"{name}={i} is token {token_list[i]!r}, a word boundary: pass the id of the "
                                 f"tokenizer's {'<unk>' if name == 'unk_id' else '<sos/eos>'} token (or None)")
        self.word_boundary = mark = find_boundary(token_list, special, word_boundary)
        marked = [w for w in lm.vocab if w.startswith(mark)]
        if marked:  # a word never holds the mark that separates words: these are the tokenizer's pieces
            raise UnitsError(f"a token LM (asrkit train-ngram --units token): its words start with the word-boundary "
                             f"mark {mark!r} (e.g. {', '.join(map(repr, marked[:3]))})", "token")
        self.blank_id, self.unk_id, self.sos_eos_id = blank_id, unk_id, sos_eos_id
        kinds: List[int] = []
        letters: List[Optional[str]] = []  # None: the <unk> token (no LM word has it)
        for i, tok in enumerate(token_list):
            if i == blank_id:
                kinds.append(SKIP), letters.append("")
            elif i == sos_eos_id:
                kinds.append(END), letters.append("")
            elif i == unk_id:
                kinds.append(CONT), letters.append(None)
            elif tok.startswith(mark):
                kinds.append(START), letters.append(tok[len(mark):])
            else:
                kinds.append(CONT if tok else SKIP), letters.append(tok)
        self._warn_missing_letters(token_list, letters, kinds)
        # where words close and open (word_marks): a boundary or </s> closes; letters open, a lone mark clears
        self._closes = torch.tensor([k in (START, END) for k in kinds])
        self._opens = torch.tensor([1 if k == CONT or (k == START and s) else 0 if k == START else -1
                                    for k, s in zip(kinds, letters)])
        lm.state_tables()  # built now, not inside the search
        self.lexicon = None if lexicon is None else sorted({w.strip() for w in lexicon if w.strip()} - {BOS, EOS, UNK})
        if self.lexicon is not None and not self.lexicon:
            raise ValueError("WordNgramScorer: the lexicon is empty")
        self._kinds, self._letters, self._dense_max = kinds, letters, dense_max_entries
        self._added: Dict[str, Tuple[int, float]] = {}  # with_words: word -> (LM word id, offset)
        self._copies: Dict[Tuple[Tuple[str, ...], Optional[float]], "WordNgramScorer"] = {}
        self._build_trie(lm, kinds, letters, dense_max_entries)

    def with_words(self, words: Iterable[str], class_score: Optional[float] = None) -> "WordNgramScorer":
        """This scorer with ``words`` added to its trie, for the searches that need them (hotwords): a word
        outside the lexicon may then be output; one outside the LM scores as ``<unk>`` plus the unk offset, or,
        with ``class_score``, scores ln P = ``class_score`` after any history and leaves the history as it was
        (the LM skips it). A copy sharing the LM, cached by content (the last :data:`COPIES_KEPT`); this scorer
        is unchanged, and returned where nothing would change."""
        vocab = self.lm.word_to_id
        listed = set(vocab) if self.lexicon is None else set(self.lexicon)
        new = {w for w in (str(x).strip() for x in words) if w} - listed - {BOS, EOS, UNK}
        if class_score is None and self.lexicon is None:
            new = set()  # an open vocabulary scores them as <unk> + offset already
        if not new:
            return self
        key = (tuple(sorted(new)), None if class_score is None else float(class_score))
        if key not in self._copies:
            if len(self._copies) >= COPIES_KEPT:
                del self._copies[next(iter(self._copies))]  # the oldest
            other = copy.copy(self)
            other._copies = {}
            other._added = {**self._added, **{w: self._entry(w, class_score) for w in key[0]}}
            other._build_trie(self.lm, self._kinds, self._letters, self._dense_max)
            self._copies[key] = other
        return self._copies[key]

    def _entry(self, word: str, class_score: Optional[float]) -> Tuple[int, float]:
        """(LM word id, offset) of a word in the trie: an LM word scores as itself; any other as <unk> plus the
        unk offset, or with a class score as the pad word (ln P 0, the history unchanged) plus the score."""
        wid = self.lm.word_to_id.get(word)
        if wid is not None:
            return wid, 0.0
        return (self.lm.unk_id, self.unk_offset) if class_score is None else (self.lm.pad_id, float(class_score))

    def _warn_missing_letters(self, token_list: Sequence[str], letters: Sequence[Optional[str]],
                              kinds: Sequence[int]) -> None:
        """Tokens with a letter that no LM word contains can only spell <unk> words: warn (case mismatches)."""
        alphabet = set("".join(w for w in self.lm.vocab if w not in (BOS, EOS, UNK)))
        missing = [token_list[i] for i, (k, s) in enumerate(zip(kinds, letters))
                   if k in (CONT, START) and s and not set(s) <= alphabet]
        if missing:
            warnings.warn(f"{len(missing)} of {len(token_list)} tokens have letters that no word of the LM contains, "
                          f"so words spelled with them score as <unk>: {_show(missing, 8)}; "
                          f"LM letters: {''.join(sorted(alphabet))[:60]!r}", stacklevel=3)

    def _build_trie(self, lm: NgramLM, kinds: List[int], letters: List[Optional[str]], dense_max: int) -> None:
        """The letter trie of the LM words (or of the lexicon): per node its look-ahead, LM word and closing
        terms; the (node, token) -> node transitions, dense or as sorted edge keys."""
        unigram = lm.prob_1.tolist()
        unk_la = float(unigram[lm.unk_id]) + self.unk_offset
        closing = lm.max_logprobs().tolist()  # the most ln P(w | h) of each word, over all histories
        unk_closing = closing[lm.unk_id] + self.unk_offset
        node_of: Dict[str, int] = {"": ROOT}
        # the dead end: <unk>'s look-ahead (open vocabulary) or -inf (lexicon: every token into it is refused)
        la = [0.0, (unk_la if self.lookahead else 0.0) if self.lexicon is None else -math.inf]
        reach = [-math.inf, -math.inf]  # per node: the most closing any word it can still become adds (max_gain)
        word = [lm.unk_id, lm.unk_id]
        offset = [0.0, self.unk_offset]  # per node: added to the LM's score of its word (a prefix's word: <unk>)
        if self.lexicon is None:
            words = {w: (wid, 0.0) for wid, w in enumerate(lm.vocab) if w not in (BOS, EOS, UNK)}
        else:
            words = {w: self._entry(w, None) for w in self.lexicon}
        words.update(self._added)
        for w, (wid, off) in words.items():
            # the pad word (a class score): ln P 0 in any history
            score = (0.0 if wid == lm.pad_id else unigram[wid]) + off
            closes = (0.0 if wid == lm.pad_id else closing[wid]) + off
            reach[ROOT] = max(reach[ROOT], closes)
            for j in range(1, len(w) + 1):
                prefix = w[:j]
                node = node_of.get(prefix)
                if node is None:
                    node = node_of[prefix] = len(la)
                    la.append(-math.inf if self.lookahead else 0.0)
                    reach.append(-math.inf)
                    word.append(lm.unk_id)
                    offset.append(self.unk_offset)
                if self.lookahead and la[node] < score:
                    la[node] = score
                reach[node] = max(reach[node], closes)
            word[node_of[w]], offset[node_of[w]] = wid, off
        self._gain = self._gain_bound(np.array(la), np.array(reach), unk_closing, float(lm.state_tables().eos.max()))
        is_word = np.zeros(len(la), dtype=bool)
        is_word[[ROOT] + [node_of[w] for w in words]] = True
        n_nodes, width = len(la), len(kinds) + 1
        self.width = width
        # the edges (node, token) -> node that stay in the trie, found word by word
        cont: Dict[str, List[int]] = {}
        for i, (k, s) in enumerate(zip(kinds, letters)):
            if k == CONT and s:
                cont.setdefault(s, []).append(i)
        longest = max(map(len, cont), default=0)
        edges: Dict[Tuple[int, int], int] = {}
        for w in words:
            for i in range(len(w)):
                src = node_of[w[:i]]
                for j in range(i + 1, min(len(w), i + longest) + 1):
                    for tok in cont.get(w[i:j], ()):
                        edges[(src, tok + 1)] = node_of[w[:j]]
        start_node = [node_of.get(s, SINK) if k == START else ROOT for k, s in zip(kinds, letters)]
        dev = lm.device
        self.dense = n_nodes * width <= dense_max
        col_kind = np.array([SKIP] + kinds, dtype=np.int64)  # column 0: the search's -1 (no change)
        if self.dense:
            table = np.full((n_nodes, width), SINK, dtype=np.int64)
            own = np.arange(n_nodes)[:, None]
            stay = (col_kind == SKIP) | (col_kind == END)
            table[:, stay] = np.broadcast_to(own, (n_nodes, int(stay.sum())))
            table[:, col_kind == START] = np.array(start_node)[col_kind[1:] == START]
            if edges:
                src, col = np.array(list(edges.keys())).T
                table[src, col] = list(edges.values())
            la_next = np.array(la, dtype=np.float32)[table]
            la_next[:, col_kind == END] = 0.0  # </s>: the final score alone (see score)
            self.trans = torch.from_numpy(table.reshape(-1).astype(np.int32)).to(dev)  # (nodes * (V+1),) at node * (V+1) + col
            # read by score at node * (V+1) + token (>= 0): the flat table one entry early
            self.la_next = torch.from_numpy(la_next.reshape(-1)).to(dev)[1:]
        else:
            keys = sorted((src * width + col, dst) for (src, col), dst in edges.items())
            self.edge_keys = torch.tensor([k for k, _ in keys] + [torch.iinfo(torch.int64).max], dtype=torch.long,
                                          device=dev)
            self.edge_dst = torch.tensor([d for _, d in keys] + [SINK], dtype=torch.long, device=dev)
            self.col_stay = torch.tensor((col_kind == SKIP) | (col_kind == END), device=dev)
            self.col_start = torch.tensor([ROOT] + start_node, dtype=torch.long, device=dev)
            self.col_is_end = torch.tensor(col_kind == END, device=dev)
        # score: LA(next) + floats[row, slot of the token]: letters and blank -LA(node), a boundary the closing
        # term, </s> the final score (its LA(next) is 0)
        slot = {SKIP: 0, CONT: 0, START: 1, END: 2}
        self.token_slot = torch.tensor([slot[k] for k in kinds], dtype=torch.long, device=dev)  # (V,)
        self.col_is_start = torch.tensor(col_kind == START, device=dev)  # (V+1,)
        self.col_hist = torch.where(self.col_is_start, 2, 1)[:, None]  # (V+1, 1) the ints column of the next history
        la_t = torch.tensor(la, dtype=torch.float32, device=dev)
        word_t = torch.tensor(word, dtype=torch.long, device=dev)
        c0 = torch.tensor(offset, dtype=torch.float32, device=dev) - la_t  # unk offset (or class score) - LA
        neg_la = -la_t
        if self.lexicon is not None:  # a boundary or </s> only after a whole listed word
            c0 = torch.where(torch.from_numpy(is_word).to(dev), c0, -math.inf)
            neg_la[SINK] = 0.0  # rows there are dead: keep -inf + inf (NaN) out of their scores
        # the empty word: closing it changes nothing (NgramLM.word_logprob of the pad word: ln P 0, the same state)
        c0[ROOT], word_t[ROOT] = 0.0, lm.pad_id
        self.node_word = word_t.unsqueeze(1)  # (nodes, 1) LM word id
        # (nodes, 3): what the node adds to each column of the state's floats (see _state)
        self.node_floats = torch.stack([neg_la, c0, c0], 1)
        self.la = la_t
        self._lm_tables(lm)

    def _gain_bound(self, la: np.ndarray, reach: np.ndarray, unk_closing: float, end: float
                    ) -> Tuple[float, float, bool]:
        """:meth:`max_gain` from the trie: ``la`` (nodes,) the look-ahead already scored at each node, ``reach``
        (nodes,) the most ln P a word the node can still become scores when it closes, ``unk_closing`` that of an
        out-of-vocabulary word (offset included), ``end`` the most ln P(</s> | history).

        Scores telescope: a hypothesis holds the LM score of its closed words plus LA of its partial word, so what
        is still to come is, once, the closing of the partial word (ln P(w | h) - LA(node), positive when the
        context beats w's best unigram) and ``</s>``, and per later word its whole ln P."""
        if self.lexicon is None:
            reach = np.maximum(reach, unk_closing)  # any partial word can still close as <unk>
        spelling = np.isfinite(la)
        spelling[ROOT] = False  # no partial word: closing it adds nothing
        close = float(np.max(reach[spelling] - la[spelling], initial=-math.inf))
        return max(close, 0.0) + max(end, 0.0), max(float(reach[ROOT]), 0.0), False

    def _lm_tables(self, lm: NgramLM) -> None:
        """Per n-gram row of the LM's state key table: [0, ln P, ln P + ln P(</s> | the state it leads to)],
        so that one row gather gives the closing and the final term of a word (see _state)."""
        # cached: NgramLM.state_tables() costs ~13 us a call (module buffer look-ups), once per search step
        self.tables = t = lm.state_tables()
        self.row_floats = torch.stack([torch.zeros_like(t.prob), t.prob, t.prob + t.eos.take(t.next_state)], 1)
        self.backoff_flat = t.backoff.reshape(-1)  # (S * order,)
        self.bo_cols = torch.tensor([0.0, 1.0, 1.0], device=t.prob.device)  # the back-off joins columns 1, 2

    _TENSORS = ("trans", "la_next", "edge_keys", "edge_dst", "col_stay", "col_start", "col_is_start", "col_is_end",
                "col_hist", "token_slot", "node_word", "node_floats", "la", "row_floats", "backoff_flat", "bo_cols")

    def _to(self, device: torch.device) -> None:
        device = torch.device(device)
        if self.lm.device != device:
            self.lm.to(device)  # the state tables are LM buffers: they move with it
        for name in self._TENSORS:
            if hasattr(self, name):
                setattr(self, name, getattr(self, name).to(device))
        self.tables = self.lm.state_tables()  # the moved LM's buffers

    def _next_node(self, node: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """Trie node after columns ``col`` = token + 1 (0: the search's -1, no change) from ``node``; broadcasts."""
        if self.dense:
            return self.trans.take(torch.add(col, node, alpha=self.width))
        key = torch.add(col, node, alpha=self.width)
        pos = torch.searchsorted(self.edge_keys, key)
        other = torch.where(self.col_is_start.take(col), self.col_start.take(col),
                            torch.where(self.col_stay.take(col), node, SINK))
        return torch.where(self.edge_keys.take(pos) == key, self.edge_dst.take(pos), other)

    def _state(self, node: torch.Tensor, hist: torch.Tensor) -> WordNgramState:
        """The state of trie nodes ``node`` (M,) after LM states ``hist`` (M,): one n-gram lookup.

        :meth:`NgramLM.word_logprob` inlined, with 1-D gathers and no concatenation of floats: each op
        costs a few microseconds of dispatch whatever its size, and this runs once per search step."""
        t = self.tables
        # node may be int32 (the dense trie table's dtype): index_select takes it as it is
        query = t.chain_keys.index_select(0, hist).add_(self.node_word.index_select(0, node))  # (M, order)
        pos = torch.searchsorted(t.keys, query)  # sentinel at the end: pos is always a valid row
        # the matching columns are the last ones (suffix closure): the first match is the longest
        col = torch.eq(t.keys.take(pos), query).max(1, keepdim=True)[1]  # (M, 1)
        row = pos.gather(1, col).squeeze(1)  # (M,) the n-gram found
        bo = self.backoff_flat.take(torch.add(col, hist.view(-1, 1), alpha=self.order))  # (M, 1)
        # [0, ln P(word | hist), that + ln P(</s> | closed)] + [-LA, unk offset - LA, the same]: the floats
        floats = torch.addcmul(self.row_floats.index_select(0, row), bo, self.bo_cols)
        floats += self.node_floats.index_select(0, node)
        return WordNgramState(torch.stack([node, hist, t.next_state.take(row)], 1), floats)  # int64 (promoted)

    # -- protocol --
    def init_state(self, batch: int, beam: int, device: torch.device) -> WordNgramState:
        self._to(device)
        n = batch * beam
        hist = torch.full((n,), self.lm.start_state, dtype=torch.long, device=device)
        return self._state(torch.full((n,), ROOT, dtype=torch.long, device=device), hist)

    def score(self, state: WordNgramState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) ln-score of appending each token (see module docstring)."""
        node = state.ints[:, :1]
        if self.dense:
            la_next = self.la_next.take(torch.add(tokens, node, alpha=self.width))
        else:
            col = tokens + 1
            la_next = torch.where(self.col_is_end.take(col), 0.0, self.la.take(self._next_node(node, col)))
        return la_next + state.floats.gather(1, self.token_slot.take(tokens))

    def select_state(self, state: WordNgramState, index: torch.Tensor, tokens: torch.Tensor) -> WordNgramState:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); -1, blank and sos/eos leave a row unchanged."""
        ints = state.ints.index_select(0, index)  # (M, 3)
        col = tokens + 1  # 0 for -1
        node = self._next_node(ints[:, 0], col)
        # a boundary closes the word: the history becomes the closed state (column 2), else stays (column 1)
        hist = ints.gather(1, self.col_hist.index_select(0, col)).view(-1)
        return self._state(node, hist)

    def final_score(self, state: WordNgramState) -> torch.Tensor:
        """(N,) score of ending here: the partial word (minus its lookahead) and then </s>."""
        return state.floats[:, 2]

    def max_gain(self) -> Tuple[float, float, bool]:
        """``(once, per_token, False)``: the most this LM can still add to a hypothesis
        (asrkit.search.interfaces.BoundedScorer), bounded from its tables when it was built (:meth:`_gain_bound`;
        every word at most :meth:`NgramLM.max_logprobs`). A search that stops early needs it: closing a word can
        add more than 0."""
        return self._gain

    def word_marks(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Where this LM closes words, for a word bonus (:class:`asrkit.search.scorers.WordCount`): per token,
        (V,) bool whether appending it closes the partial word (a boundary token or ``</s>``), and (V,) int64
        whether a word is being spelled after it (1: a letter or a boundary with letters, 0: a lone boundary,
        -1: unchanged, the blank, ``</s>`` and empty tokens). The LM scores a word that closes while one is
        spelled; an empty one it leaves unscored."""
        return self._closes.clone(), self._opens.clone()

    def native_form(self) -> Tuple[str, Dict[str, torch.Tensor]]:
        """The tables the native CPU search reads (asrkit.search.interfaces.NativeScorer): kind "word_ngram"."""
        t = self.tables
        out = {name: getattr(self, name) for name in ("trans", "la_next", "edge_keys", "edge_dst", "col_stay",
                                                       "col_start", "col_is_end") if hasattr(self, name)}
        out.update(la=self.la, col_is_start=self.col_is_start, token_slot=self.token_slot, node_word=self.node_word,
                   node_floats=self.node_floats, chain_keys=t.chain_keys, keys=t.keys, next_state=t.next_state,
                   row_floats=self.row_floats, backoff=self.backoff_flat, dense=torch.tensor(int(self.dense)),
                   width=torch.tensor(self.width), order=torch.tensor(self.order),
                   start_state=torch.tensor(self.lm.start_state))
        return "word_ngram", out
