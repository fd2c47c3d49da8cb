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
into one int64 key; completed words are mapped to LM ids through a sorted key table and
``torch.searchsorted``. Two vocabulary words with equal keys are reported at load time.

Partial-word option ``lookahead`` (default on): while a word is being spelled, its score
is LA(prefix) = the best ln unigram probability among LM words that start with the prefix
(``<unk>``'s when none does), found in a sorted table of prefix keys. Each token adds
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
    """Per-hypothesis state (leading dim N)."""

    hist: torch.Tensor  # (N, order-1) completed LM word ids, most recent last
    bo_sums: torch.Tensor  # (N, order) ln back-off suffix sums of hist
    key: torch.Tensor  # (N,) int64 hash key of the partial word's letters (0 when empty)
    nchar: torch.Tensor  # (N,) letters in the partial word
    word: torch.Tensor  # (N,) LM id of the partial word taken as a whole word (<unk> if unknown)
    word_lp: torch.Tensor  # (N,) ln P(word | hist)
    la: torch.Tensor  # (N,) lookahead score already given to the partial word (0 if none)


class WordNgramScorer:
    """Batched scorer (asrkit.search protocol) applying a word LM at word boundaries of tokens."""

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
            kinds.append(kind)
            hashes.append(_letters_hash(letters))
            nchars.append(len(letters))
        self.tok_kind = torch.tensor(kinds, dtype=torch.long, device=device)  # (V_tok,)
        self.tok_nchar = torch.tensor(nchars, dtype=torch.long, device=device)  # (V_tok,)
        # per token: letter hashes h1, h2 and the multipliers B1**len, B2**len, each (V_tok,)
        self.tok_h1, self.tok_h2, self.tok_pow1, self.tok_pow2 = (
            torch.tensor(col, dtype=torch.long, device=device) for col in zip(*hashes))
        self._build_tables(lm)

    def _build_tables(self, lm: NgramLM) -> None:
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
        device = lm.device
        keys = sorted(words)
        self.word_keys = torch.tensor(keys + [_SENTINEL], dtype=torch.long, device=device)
        self.word_ids = torch.tensor([words[k] for k in keys] + [lm.unk_id], dtype=torch.long, device=device)
        pkeys = sorted(prefixes)
        self.prefix_keys = torch.tensor(pkeys + [_SENTINEL], dtype=torch.long, device=device)
        self.prefix_la = torch.tensor([prefixes[k] for k in pkeys] + [0.0], dtype=torch.float32, device=device)
        self.unk_la = float(unigram[lm.unk_id]) + self.unk_offset

    def _to(self, device: torch.device) -> None:
        device = torch.device(device)
        if self.lm.device != device:
            self.lm.to(device)
        for name in ("tok_kind", "tok_nchar", "tok_h1", "tok_h2", "tok_pow1", "tok_pow2", "word_keys",
                     "word_ids", "prefix_keys", "prefix_la"):
            setattr(self, name, getattr(self, name).to(device))

    # -- tensor helpers (no host sync) --
    def _extend(self, key: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Keys of the partial words ``key`` followed by the letters of ``tokens`` (same shape)."""
        h1 = ((key >> 31) * self.tok_pow1.take(tokens) + self.tok_h1.take(tokens)) % _P1
        h2 = ((key & _MASK) * self.tok_pow2.take(tokens) + self.tok_h2.take(tokens)) % _P2
        return (h1 << 31) | h2

    def _word_id(self, key: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(self.word_keys, key)
        return torch.where(self.word_keys.take(pos) == key, self.word_ids.take(pos), self.lm.unk_id)

    def _lookahead(self, key: torch.Tensor, nchar: torch.Tensor) -> torch.Tensor:
        if not self.lookahead:
            return torch.zeros(key.shape, dtype=self.prefix_la.dtype, device=key.device)
        pos = torch.searchsorted(self.prefix_keys, key)
        la = torch.where(self.prefix_keys.take(pos) == key, self.prefix_la.take(pos), self.unk_la)
        return torch.where(nchar > 0, la, 0.0)

    def _with_word(self, hist: torch.Tensor, bo: torch.Tensor, key: torch.Tensor,
                   nchar: torch.Tensor) -> WordNgramState:
        word = self._word_id(key)
        word_lp = self.lm.logprob(hist, bo, word.unsqueeze(1))[:, 0]
        if self.unk_offset:
            word_lp = torch.where(word == self.lm.unk_id, word_lp + self.unk_offset, word_lp)
        return WordNgramState(hist, bo, key, nchar, word, word_lp, self._lookahead(key, nchar))

    # -- protocol --
    def init_state(self, batch: int, beam: int, device: torch.device) -> WordNgramState:
        self._to(device)
        n = batch * beam
        hist, bo = self.lm.start(n, device)
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        return self._with_word(hist, bo, zeros, zeros)

    def score(self, state: WordNgramState, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) ln-score of appending each token (see module docstring)."""
        kind = self.tok_kind.take(tokens)  # (N, C)
        start = kind == START
        la_old = state.la.unsqueeze(1)  # (N, 1)
        if self.lookahead:
            base = torch.where(start, 0, state.key.unsqueeze(1))
            nchar = torch.where(start, 0, state.nchar.unsqueeze(1)) + self.tok_nchar.take(tokens)
            la_new = self._lookahead(self._extend(base, tokens), nchar)  # (N, C)
        else:
            la_new = torch.zeros_like(la_old)
        close = torch.where(state.nchar > 0, state.word_lp - state.la, 0.0).unsqueeze(1)  # (N, 1)
        out = torch.where(start, close + la_new, la_new - la_old)
        out = torch.where(kind == END, self.final_score(state).unsqueeze(1), out)
        return torch.where(kind == SKIP, 0.0, out)

    def select_state(self, state: WordNgramState, index: torch.Tensor, tokens: torch.Tensor) -> WordNgramState:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); -1, blank and sos/eos leave a row unchanged."""
        st = WordNgramState(*(t[index] for t in state))
        tok = tokens.clamp(min=0)
        kind = torch.where(tokens >= 0, self.tok_kind.take(tok), SKIP)  # (M,)
        start = kind == START
        grow = start | (kind == CONT)
        close = (start & (st.nchar > 0)).unsqueeze(1)  # (M, 1)
        hist = torch.where(close, self.lm.push(st.hist, st.word), st.hist)
        bo = torch.where(close, self.lm.backoff_sums(hist), st.bo_sums)
        key = self._extend(torch.where(start, 0, st.key), tok)
        nchar = torch.where(start, 0, st.nchar) + self.tok_nchar.take(tok)
        return self._with_word(hist, bo, torch.where(grow, key, st.key), torch.where(grow, nchar, st.nchar))

    def final_score(self, state: WordNgramState) -> torch.Tensor:
        """(N,) score of ending here: the partial word (minus its lookahead) and then </s>."""
        has_word = state.nchar > 0
        hist = torch.where(has_word.unsqueeze(1), self.lm.push(state.hist, state.word), state.hist)
        eos = torch.full_like(state.word, self.lm.eos_id).unsqueeze(1)
        eos_lp = self.lm.logprob(hist, self.lm.backoff_sums(hist), eos)[:, 0]
        return eos_lp + torch.where(has_word, state.word_lp - state.la, 0.0)
