"""A word-level n-gram LM applied to a search over sub-word tokens (chars or sentencepiece pieces).

Word boundaries follow the tokenizer's "▁" marker: a token whose string starts with "▁"
begins a new word, so the word being spelled so far is complete. The char tokenizer's
space token "▁" is the same rule with no letters; a sentencepiece piece "▁THE" completes
the previous word and starts "THE". A completed word is scored with the word LM
(ln P(word | previous words); words not in the LM score as ``<unk>``), and
``final_score`` scores the last partial word plus ``</s>``. "▁" inside a token is taken as
a letter. The tokenizer's ``<unk>`` token is a letter that no LM word contains, so a
word holding it scores as ``<unk>``.

Partial words are identified by a rolling polynomial hash of their **letters** (not token
ids), so "▁TH"+"E" and "▁THE" are the same word. Two independent 31-bit hashes are packed
into one int64 key (0 = the empty word). One sorted table of the keys of the LM words' prefixes
gives, with one ``torch.searchsorted``, a partial word's look-ahead and, taken as a whole word,
its LM id. Two vocabulary words with equal keys are reported at load time.

The word history is an LM context-state id (:meth:`NgramLM.state_tables`: the longest suffix of
the history that is in the model). Whenever a partial word changes, the state also gets the word's
score ln P(word | history) and ``closed_state``, the history's state once the word closes, from one
n-gram searchsorted (:meth:`NgramLM.state_logprob`): a word boundary is then a select, and
``</s>`` a gather from the per-state ln P(</s> | state) table.

Partial-word option ``lookahead`` (default on): while a word is being spelled, its score
is LA(prefix) = the best ln unigram probability among LM words that start with the prefix
(``<unk>``'s when none does), found in that table. Each token adds
LA(new prefix) - LA(old prefix), and completing the word adds ln P(word | history) - LA(word),
so a finished sentence gets exactly the word LM score while the search can already prune
misspelt prefixes. With ``lookahead=False`` letters score 0 and the whole word score lands
on the boundary (add a per-token length bonus scorer in the search if needed).

``unk_offset`` (ln, default 0 = the LM's own ``<unk>`` score) is added to every word outside the LM
and, with look-ahead, to partial words that no LM word starts with (their look-ahead is then
``<unk>``'s plus the offset): a negative offset keeps the search from spelling out-of-vocabulary
words, as pyctcdecode's ``unk_score_offset`` does.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

import torch

from asrkit.lm.arpa import BOS, EOS, UNK
from asrkit.lm.ngram import NgramLM

WORD_MARK = "\u2581"  # "▁"
_P1, _P2 = 2147483647, 2147483629  # primes below 2**31: products of two residues fit in int64
_B1, _B2 = 1000003, 911382323
_MASK = (1 << 31) - 1
_UNK_LETTER = 0x110001  # beyond Unicode: never a letter of an LM word
_SENTINEL = torch.iinfo(torch.int64).max
SKIP, CONT, START, END = 0, 1, 2, 3  # token kinds


def _letters_hash(codes: Sequence[int]) -> Tuple[int, int, int, int]:
    """(h1, h2, B1**len, B2**len) of letter codes, each mod its prime."""
    h1 = h2 = 0
    for c in codes:
        h1, h2 = (h1 * _B1 + c) % _P1, (h2 * _B2 + c) % _P2
    return h1, h2, pow(_B1, len(codes), _P1), pow(_B2, len(codes), _P2)


def _codes(text: str) -> List[int]:
    return [ord(ch) + 1 for ch in text]  # +1 keeps every letter non-zero


class WordNgramState(NamedTuple):
    """Per-hypothesis state (leading dim N). LM histories are context-state ids (see
    :meth:`NgramLM.state_tables`); ``closed_state == hist_state`` while the partial word is empty."""

    hist_state: torch.Tensor  # (N,) int64 LM state of the completed words
    key: torch.Tensor  # (N,) int64 hash key of the partial word's letters (0 when empty)
    nchar: torch.Tensor  # (N,) letters in the partial word
    word: torch.Tensor  # (N,) LM id of the partial word taken as a whole word (<unk> if unknown)
    word_lp: torch.Tensor  # (N,) ln P(word | hist) (+ unk_offset for <unk>)
    la: torch.Tensor  # (N,) lookahead score already given to the partial word (0 if none)
    closed_state: torch.Tensor  # (N,) int64 LM state after closing the partial word


class WordNgramScorer:
    """Batched scorer (asrkit.search protocol) applying a word LM at word boundaries of tokens.

    Per call, with no host sync: ``score`` one searchsorted (the look-ahead of the (N, C) extended
    prefixes; none without look-ahead), ``select_state`` two over (N,) rows (the prefix table, which
    gives word id and look-ahead, and the n-gram lookup of :meth:`NgramLM.state_logprob`),
    ``final_score`` gathers only: the state keeps the LM state the history reaches when the partial
    word closes. Memory: the LM's state tables (:meth:`NgramLM.state_tables`) and 20 bytes per
    prefix of an LM word (per word without look-ahead).
    """

    def __init__(self, lm: NgramLM, token_list: Sequence[str], lookahead: bool = True,
                 blank_id: int = 0, unk_id: int = 1, sos_eos_id: int = 2, unk_offset: float = 0.0) -> None:
        self.lm, self.lookahead, self.unk_offset = lm, lookahead, float(unk_offset)
        device = lm.device
        kinds, hashes, nchars = [], [], []
        for i, tok in enumerate(token_list):
            kind, letters = CONT, _codes(tok)
            if i == blank_id:
                kind, letters = SKIP, []
            elif i == sos_eos_id:
                kind, letters = END, []
            elif i == unk_id:
                letters = [_UNK_LETTER]
            elif tok.startswith(WORD_MARK):
                kind, letters = START, _codes(tok[1:])
            h1, h2, pow1, pow2 = _letters_hash(letters)
            if kind == START:  # a new word: the old key times 0, so _extend needs no select
                pow1 = pow2 = 0
            kinds.append(kind)
            hashes.append((h1, h2, pow1, pow2))
            nchars.append(len(letters))
        # one more entry, for the token -1 of select_state (no change), reached as -1 % (V_tok + 1)
        kinds.append(SKIP)
        hashes.append(_letters_hash([]))
        nchars.append(0)
        self.n_entries = len(kinds)
        kind_t = torch.tensor(kinds, dtype=torch.long, device=device)
        self.tok_start, self.tok_end = kind_t == START, kind_t == END  # (V_tok + 1,) bool
        self.tok_nchar = torch.tensor(nchars, dtype=torch.long, device=device)  # (V_tok + 1,)
        # per token: letter hashes h1, h2 and the multipliers B1**len, B2**len, each (V_tok + 1,);
        # blank and sos/eos leave a key unchanged (h = 0, multiplier 1)
        self.tok_h1, self.tok_h2, self.tok_pow1, self.tok_pow2 = (
            torch.tensor(col, dtype=torch.long, device=device) for col in zip(*hashes))
        lm.state_tables()  # built now, not inside the search
        self._build_tables(lm)

    def _build_tables(self, lm: NgramLM) -> None:
        """One sorted key table of the LM words' prefixes (words only without look-ahead), with each
        prefix's look-ahead and, where it is a whole LM word, the word's id (else ``<unk>``'s)."""
        words: Dict[int, int] = {}
        prefixes: Dict[int, float] = {}
        unigram = lm.prob_1.tolist()
        for wid, word in enumerate(lm.vocab):
            if word in (BOS, EOS, UNK):
                continue
            h1 = h2 = 0
            for c in _codes(word):  # every prefix's key, then the word's
                h1, h2 = (h1 * _B1 + c) % _P1, (h2 * _B2 + c) % _P2
                key = (h1 << 31) | h2
                if self.lookahead and prefixes.get(key, -float("inf")) < unigram[wid]:
                    prefixes[key] = unigram[wid]
            if key in words:
                raise ValueError(f"word hash collision between '{lm.vocab[words[key]]}' and '{word}'; "
                                 f"rename one of them in the LM")
            words[key] = wid
            prefixes.setdefault(key, 0.0)  # no look-ahead: the words alone, with LA 0
        if 0 in prefixes:
            raise ValueError("an LM word hashes like the empty word; rename it in the LM")
        prefixes[0] = 0.0  # the empty partial word: no look-ahead, no word
        device = lm.device
        keys = sorted(prefixes)
        self.prefix_keys = torch.tensor(keys + [_SENTINEL], dtype=torch.long, device=device)
        self.prefix_la = torch.tensor([prefixes[k] for k in keys] + [0.0], dtype=torch.float32, device=device)
        self.prefix_word = torch.tensor([words.get(k, lm.unk_id) for k in keys] + [lm.unk_id], dtype=torch.long,
                                        device=device)
        self.unk_la = float(unigram[lm.unk_id]) + self.unk_offset if self.lookahead else 0.0

    def _to(self, device: torch.device) -> None:
        device = torch.device(device)
        if self.lm.device != device:
            self.lm.to(device)  # the state tables are LM buffers: they move with it
        for name in ("tok_start", "tok_end", "tok_nchar", "tok_h1", "tok_h2", "tok_pow1", "tok_pow2", "prefix_keys",
                     "prefix_la", "prefix_word"):
            setattr(self, name, getattr(self, name).to(device))

    # -- tensor helpers (no host sync) --
    def _extend(self, key: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Keys of the partial words ``key`` followed by the letters of ``tokens`` (broadcast); a
        word-start token gives the key of its own letters, blank and sos/eos the key unchanged."""
        h1 = ((key >> 31) * self.tok_pow1.take(tokens) + self.tok_h1.take(tokens)) % _P1
        h2 = ((key & _MASK) * self.tok_pow2.take(tokens) + self.tok_h2.take(tokens)) % _P2
        return (h1 << 31) | h2

    def _lookahead(self, key: torch.Tensor) -> torch.Tensor:
        """LA of the partial words ``key`` (0 for the empty word, key 0)."""
        if not self.lookahead:
            return torch.zeros(key.shape, dtype=self.prefix_la.dtype, device=key.device)
        pos = torch.searchsorted(self.prefix_keys, key)
        return torch.where(self.prefix_keys.take(pos) == key, self.prefix_la.take(pos), self.unk_la)

    def _with_word(self, hist: torch.Tensor, key: torch.Tensor, nchar: torch.Tensor) -> WordNgramState:
        """The state of partial words ``key`` after ``hist``: two searchsorteds, the prefix table's
        (word id and look-ahead) and the n-gram lookup's (score and closed state)."""
        pos = torch.searchsorted(self.prefix_keys, key)
        found = self.prefix_keys.take(pos) == key
        word = torch.where(found, self.prefix_word.take(pos), self.lm.unk_id)
        la = torch.where(found, self.prefix_la.take(pos), self.unk_la)
        word_lp, closed = self.lm.state_logprob(hist, word.unsqueeze(1))  # (N, 1) each
        word_lp, closed = word_lp.squeeze(1), closed.squeeze(1)
        if self.unk_offset:  # <unk> is no prefix: every unknown word is <unk>
            word_lp = torch.where(word == self.lm.unk_id, word_lp + self.unk_offset, word_lp)
        closed = torch.where(nchar > 0, closed, hist)
        return WordNgramState(hist, key, nchar, word, word_lp, la, closed)

    # -- protocol --
    def init_state(self, batch: int, beam: int, device: torch.device) -> WordNgramState:
        self._to(device)
        n = batch * beam
        hist = torch.full((n,), self.lm.start_state, dtype=torch.long, device=device)
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        return self._with_word(hist, zeros, zeros)

    def score(self, state: WordNgramState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) ln-score of appending each token (see module docstring)."""
        start = self.tok_start.take(tokens)  # (N, C)
        close = torch.where(state.nchar > 0, state.word_lp - state.la, 0.0)  # (N,)
        if self.lookahead:  # blank and sos/eos keep the key: la_new - la_old is exactly 0
            la_new = self._lookahead(self._extend(state.key.unsqueeze(1), tokens))  # (N, C)
            out = torch.where(start, la_new + close.unsqueeze(1), la_new - state.la.unsqueeze(1))
        else:
            out = torch.where(start, close.unsqueeze(1), 0.0)
        final = self.lm.state_eos.take(state.closed_state) + close  # = final_score(state)
        return torch.where(self.tok_end.take(tokens), final.unsqueeze(1), out)

    def select_state(self, state: WordNgramState, index: torch.Tensor, tokens: torch.Tensor) -> WordNgramState:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); -1, blank and sos/eos leave a row unchanged."""
        tok = tokens % self.n_entries  # -1 -> the last table entry: no change
        start = self.tok_start.take(tok)  # (M,)
        hist = torch.where(start, state.closed_state.take(index), state.hist_state.take(index))
        key = self._extend(state.key.take(index), tok)
        nchar = torch.where(start, 0, state.nchar.take(index)) + self.tok_nchar.take(tok)
        return self._with_word(hist, key, nchar)

    def final_score(self, state: WordNgramState) -> torch.Tensor:
        """(N,) score of ending here: the partial word (minus its lookahead) and then </s>."""
        return self.lm.state_eos.take(state.closed_state) + torch.where(state.nchar > 0, state.word_lp - state.la, 0.0)
