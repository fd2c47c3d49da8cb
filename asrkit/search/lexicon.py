"""Lexicon-constrained search as a scorer: only prefixes of listed words may be spelled.

Graves & Jaitly's dictionary-constrained CTC decoding, and flashlight's lexicon decoder, restrict the
output to words of a word list. Here the constraint is one more scorer of the search's weights dict
(``scorers={"lm": word_lm, "lexicon": LexiconScorer(words, tokens)}, weights={"lm": 0.5, "lexicon":
1.0}``), so no search function changes and the word LM fuses at word ends as it does without it.

The word list is compiled into the **letter trie** of its words on the search's device: node 0 is
the empty word, node 1 a dead end. Per (node, token) a table gives the next node: letters that stay
on a word's prefix move down the trie; a word-boundary token (one starting with the boundary mark,
"▁", "|" or " ") is allowed where the partial word is empty or a whole listed word and starts the
next word with its own letters; ``<sos/eos>`` is allowed at the same places; everything else (the
tokenizer's ``<unk>`` too) leads to the dead end. ``score`` is 0 for an allowed token and -inf
otherwise, ``final_score`` -inf for a hypothesis that stops inside a word. Any segmentation of a
word into tokens is accepted (a BPE model may spell "THE" as "▁TH"+"E" or "▁THE"). The state is an
(N,) int64 node id (times V+1); each call is one or two gathers, no host sync.

When it helps: closed vocabularies (commands, names, digits, a domain word list): the search cannot
spend beam slots on misspellings, so a small beam does what a larger one does without it, and the
output is always made of real words. What it costs: a word not in the list can never be output; the
search spells the nearest listed words instead (an OOV word is at least one word error, often two
when it is split into shorter listed words), and an utterance that no listed words fit ends empty.
For open vocabularies use the word LM's ``unk_offset`` instead, which only penalises OOV words.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from asrkit.search.interfaces import GainBound

BOUNDARY_MARKS = ("\u2581", "|", " ")  # as asrkit.lm.word_ngram (search/ imports torch only)
ROOT, DEAD = 0, 1
NEG_INF = float("-inf")
DENSE_MAX_ENTRIES = 2 ** 24  # (trie nodes x (V+1)) entries: 8 + 4 bytes each
_SKIP, _LETTERS, _START, _END = 0, 1, 2, 3


class LexiconScorer:
    """A :class:`~asrkit.search.interfaces.BatchScorer` allowing only words of ``words`` (see the module docstring).

    ``token_list``: the search's tokens; ``blank_id`` scores 0 and changes nothing; ``sos_eos_id``
    (None: the token named ``<sos/eos>``, ``</s>`` or ``<eos>``, if any) ends a sentence; ``unk_id``
    (None: the token named ``<unk>``, if any) is never allowed. ``word_boundary``: the mark that
    word-initial tokens start with (None: whichever of "▁", "|", " " the tokens use). Words are
    matched letter for letter (case too): a warning counts the words that the tokens cannot spell.
    """

    def __init__(self, words: Iterable[str], token_list: Sequence[str], blank_id: int = 0,
                 sos_eos_id: Optional[int] = None, unk_id: Optional[int] = None,
                 word_boundary: Optional[str] = None, dense_max_entries: int = DENSE_MAX_ENTRIES) -> None:
        tokens = list(token_list)
        sos_eos_id = _special(tokens, sos_eos_id, ("<sos/eos>", "</s>", "<eos>"), "sos_eos_id")
        unk_id = _special(tokens, unk_id, ("<unk>",), "unk_id")
        blank_id = _special(tokens, blank_id, (), "blank_id")
        special = {blank_id, sos_eos_id, unk_id} - {None}
        mark = _boundary(tokens, special, word_boundary)
        self.word_boundary = mark
        lexicon = sorted({w for w in (str(x).strip() for x in words) if w})
        if not lexicon:
            raise ValueError("LexiconScorer: the word list is empty")
        kinds: List[int] = []
        letters: List[str] = []
        for i, tok in enumerate(tokens):
            if i == blank_id or (i not in special and not tok):
                kinds.append(_SKIP), letters.append("")
            elif i == sos_eos_id:
                kinds.append(_END), letters.append("")
            elif i == unk_id:
                kinds.append(_LETTERS), letters.append("\uffff\uffff")  # spells no word
            elif tok.startswith(mark):
                kinds.append(_START), letters.append(tok[len(mark):])
            else:
                kinds.append(_LETTERS), letters.append(tok)
        alphabet = set("".join(s for k, s in zip(kinds, letters) if k in (_LETTERS, _START)))
        unspellable = [w for w in lexicon if not set(w) <= alphabet]
        if len(unspellable) == len(lexicon):  # not a word list for this model: quote none of it (any file)
            raise ValueError(f"LexiconScorer: none of the {len(lexicon)} words of the list can be spelled with these "
                             f"tokens (is it a word list? token letters: {''.join(sorted(alphabet))[:60]!r})")
        if unspellable:  # a word list: a few of its words, each short and escaped
            warnings.warn(f"LexiconScorer: {len(unspellable)} of {len(lexicon)} words have letters no token has and "
                          f"can never be output, e.g. {', '.join(repr(w[:20]) for w in unspellable[:3])}",
                          stacklevel=2)
        self._build(lexicon, kinds, letters, dense_max_entries)

    def _build(self, lexicon: List[str], kinds: List[int], letters: List[str], dense_max: int) -> None:
        node_of: Dict[str, int] = {"": ROOT}
        is_word = [True, False]  # the empty word may end (or be followed by a boundary); the dead end not
        for w in lexicon:
            for j in range(1, len(w) + 1):
                if w[:j] not in node_of:
                    node_of[w[:j]] = len(is_word)
                    is_word.append(False)
            is_word[node_of[w]] = True
        width = self.width = len(kinds) + 1  # column 0: the search's -1 (no change)
        by_letters: Dict[str, List[int]] = {}
        for i, (k, s) in enumerate(zip(kinds, letters)):
            if k == _LETTERS:
                by_letters.setdefault(s, []).append(i + 1)
        longest = max(map(len, by_letters), default=0)
        edges: Dict[Tuple[int, int], int] = {}  # (node, column) -> node, for letters that stay in the trie
        for w in lexicon:
            for i in range(len(w)):
                for j in range(i + 1, min(len(w), i + longest) + 1):
                    for col in by_letters.get(w[i:j], ()):
                        edges[(node_of[w[:i]], col)] = node_of[w[:j]]
        col_kind = [_SKIP] + kinds
        col_start = [node_of.get(s, DEAD) if k == _START else DEAD for k, s in zip(col_kind, [""] + letters)]
        n_nodes = len(is_word)
        self.n_nodes, self.dense = n_nodes, n_nodes * width <= dense_max
        kind_t = torch.tensor(col_kind)
        self.col_stay = kind_t == _SKIP  # (V+1,)
        self.col_closes = (kind_t == _START) | (kind_t == _END)  # allowed only after a whole word
        self.col_start = torch.where(kind_t == _START, torch.tensor(col_start), -1)  # -1: keep the node (END)
        self.is_word = torch.tensor(is_word)  # (nodes,)
        if edges:
            keys = torch.tensor([s * width + c for s, c in edges], dtype=torch.long)
            dst = torch.tensor(list(edges.values()), dtype=torch.long)
        else:
            keys, dst = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        if self.dense:
            table = self._default(torch.arange(n_nodes)[:, None], torch.arange(width)[None, :]).reshape(-1)
            table[keys] = dst
            self.next_base = table * width  # (nodes * (V+1),) the next node's row offset
            self.score_table = torch.where(table == DEAD, NEG_INF, 0.0)  # float32
        else:
            keys, order = keys.sort()
            self.edge_keys = torch.cat([keys, torch.tensor([torch.iinfo(torch.long).max])])
            self.edge_dst = torch.cat([dst[order], torch.tensor([DEAD])])

    _TENSORS = ("col_stay", "col_closes", "col_start", "is_word", "next_base", "score_table", "edge_keys", "edge_dst")

    def _default(self, node: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """The next node where no letter edge applies (broadcasts): blank keeps the node; a boundary or
        </s> after a whole word starts the next word (or keeps the node); anything else is a dead end."""
        closes = self.col_closes[col] & self.is_word[node]
        start = self.col_start[col]
        moved = torch.where(start >= 0, start, node)
        return torch.where(self.col_stay[col], node, torch.where(closes, moved, DEAD))

    def _next(self, base: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        """Next node from row offsets ``base`` = node * (V+1) and columns ``col`` = token + 1."""
        key = base + col
        pos = torch.searchsorted(self.edge_keys, key)
        node = torch.div(base, self.width, rounding_mode="floor")
        return torch.where(self.edge_keys.take(pos) == key, self.edge_dst.take(pos), self._default(node, col))

    # -- protocol --
    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        for name in self._TENSORS:
            if hasattr(self, name) and getattr(self, name).device != torch.device(device):
                setattr(self, name, getattr(self, name).to(device))
        return torch.zeros(batch * beam, dtype=torch.long, device=device)  # node * (V+1)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C): 0 where the token keeps the hypothesis on listed words, else -inf."""
        if self.dense:
            return self.score_table.take(state.unsqueeze(1) + (tokens + 1))
        return torch.where(self._next(state.unsqueeze(1), tokens + 1) == DEAD, NEG_INF, 0.0)

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (M,) extended by ``tokens`` (M,) (-1: unchanged)."""
        if self.dense:
            return self.next_base.take(state.take(index) + (tokens + 1))
        return self._next(state.take(index), tokens + 1) * self.width

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        """(N,) 0 where the hypothesis ends after a whole word (or nothing), -inf inside a word."""
        node = torch.div(state, self.width, rounding_mode="floor")
        return torch.where(self.is_word.take(node), 0.0, NEG_INF)

    def max_gain(self) -> GainBound:
        """0 or -inf: nothing to gain."""
        return 0.0, 0.0, False

    def native_form(self) -> Tuple[str, Dict[str, torch.Tensor]]:
        """The tables the native CPU search reads (asrkit.search.interfaces.NativeScorer): kind "lexicon"."""
        out = {name: getattr(self, name) for name in self._TENSORS if hasattr(self, name)}
        out.update(dense=torch.tensor(int(self.dense)), width=torch.tensor(self.width))
        return "lexicon", out


def read_word_list(path: str | os.PathLike) -> List[str]:
    """Words of a word-list file: the first field of each non-empty line, so a plain list (one word a line)
    and a lexicon file (``WORD  W O R D |``, flashlight's format) both work. Errors name the file and line."""
    words = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not UTF-8 ({exc.reason})") from None
            fields = line.split()
            if fields:
                words.append(fields[0])
    if not words:
        raise ValueError(f"{path}: the word list is empty")
    return words


def _special(tokens: Sequence[str], given: Optional[int], names: Sequence[str], what: str) -> Optional[int]:
    if given is None:
        return next((i for i, t in enumerate(tokens) if t in names), None)
    if not 0 <= given < len(tokens):
        raise ValueError(f"LexiconScorer: {what}={given} is outside the token list (0 .. {len(tokens) - 1})")
    return given


def _boundary(tokens: Sequence[str], special: set, given: Optional[str]) -> str:
    ordinary = [t for i, t in enumerate(tokens) if i not in special]
    marks = [given] if given is not None else [m for m in BOUNDARY_MARKS if any(t.startswith(m) for t in ordinary)]
    if given is not None and (not given or not any(t.startswith(given) for t in ordinary)):
        marks = []
    if len(marks) != 1:
        shown = ", ".join(repr(t) for t in ordinary[:12]) + (", ..." if len(ordinary) > 12 else "")
        wanted = repr(given) if given is not None else " or ".join(repr(m) for m in BOUNDARY_MARKS)
        what = f"several marks {marks}: pass word_boundary=" if len(marks) > 1 else f"no token starts with {wanted}"
        raise ValueError(f"LexiconScorer needs one word-boundary mark ({what}); tokens: [{shown}]")
    return marks[0]
