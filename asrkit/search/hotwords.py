"""Hotwords: contextual biasing of any search toward a list of phrases, as one more scorer.

The phrases (each a token-id sequence, spelled with the model's own units) are compiled into an
Aho-Corasick automaton: the token trie of the phrases with failure links, resolved into a next-state
function (icefall's and sherpa's context graph, written as tables). A hypothesis's automaton state is the
longest suffix of its tokens that begins a phrase (its *partial match*).

Scores, defined by a potential ``Phi = C + pend(state)``:

* ``C``: the bonus of every phrase occurrence completed so far, ``weight(p) * |p|`` each (``|p|`` counts
  the tokens of ``p`` that carry a bonus: the word-boundary token of a char model carries none); nested and
  overlapping occurrences each count ("NEW" and "NEW YORK" listed: "NEW YORK" earns both).
* ``pend``: the provisional bonus of the partial match, for its tokens past the last whole phrase along it;
  a token of the trie carries the largest weight of the phrases through it, except the first
  :data:`HELD_TOKENS` bonus-carrying tokens of a phrase, which hold none (their bonus is paid when the phrase
  completes): nearly every word begins as some phrase of a long list does, and a bonus on those first letters
  went to each hypothesis that starts a new word, which split words in the beam ("AMUSING" -> "TO MUSING")
  before the failure took it back.

Appending a token scores ``Phi(after) - Phi(before)``: a matching token past the held ones gains its bonus at
once (so a hotword survives the beam while it is being spelled), a partial match that fails loses what it had gained
(the *failure-cancel*), and ending the hypothesis (``final_score``, or the <eos> token of a label-synchronous
search) cancels the unfinished partial match. A finished hypothesis has scored exactly ``C``.

Tables (on the search's device; a compiled graph is cached by content): ``root_next`` (V,) the state after
each token from the empty match; the arcs that differ from it, as sorted keys ``state * V + token`` with a
sentinel, and their targets; ``reach`` (S,) ``= out + pend`` of a state (``out``: the bonus of every phrase
that ends there) and ``pend`` (S,). Where the whole step function fits in :data:`DENSE_MAX_ENTRIES` entries
(S rows of V + 1: "prefix unchanged" (-1), then the V tokens) it is also kept as two tables, ``step_next``
(the next state's row) and ``step_gain`` (the score), so a step is one add and one read per candidate on
both loops, whatever the number of phrases; else a ``searchsorted`` over the arcs finds the move (its cost
grows with the logarithm of the arc count: 1000 names made the demo's search 1.7-2x slower that way).
A hypothesis's state is its automaton state's row in those tables, ``id * (V + 1) + 1``, so that a token's
entry is the row plus the token (on both layouts). The blank (id 0) and "prefix unchanged" (-1) score 0 and
keep the state; every other token outside the phrases (``<unk>``, ``<sos/eos>``) leads back to the start.

Word starts: with a word-boundary token of its own (a char model's ``▁``), a phrase is spelled with that
token first (it carries no bonus) and a hypothesis starts as if after one, so a hotword matches at the start
of a word only (it still boosts longer words it begins: "ANN" in "ANNA"). BPE phrases start with a
word-initial piece anyway.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Callable, Collection, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from asrkit.search.interfaces import BLANK_ID, GainBound

HOTWORDS = "hotwords"  # the scorer's name in a search's weights dict
BOUNDARY_MARKS = ("\u2581", "|")  # the standalone word-boundary tokens (as asrkit.search.api.WORD_MARKS)
PhraseSpec = Union[str, Tuple[str, float]]  # a phrase, or a phrase and its weight (a factor of the global one)


class Phrase(NamedTuple):
    """A phrase to bias toward: its text, the per-token weight factor, and where it came from (for messages)."""

    text: str
    weight: float = 1.0
    where: str = ""


# The largest S x (V + 1) step tables kept whole (int64 + float32: 48 MiB); larger automata search their arcs.
DENSE_MAX_ENTRIES = 1 << 22
# Tokens at the start of a phrase that hold no provisional bonus (see the module docstring). Measured with
# tools/bench/bench_hotwords.py on the demo (beam 100), 1000 unrelated phrases: on its dev set the WER moved
# 24.44 -> 25.42 with 1 held, 24.53 with 2, 24.36 with 3 (the test set: 22.42 -> 22.97 with 1, 22.33 with 2);
# on the tuning names set, class score -9: recall / false alarms 40.8 / 4.2% with 1, 38.3 / 2.5% with 2.
HELD_TOKENS = 2


class HotwordGraph(NamedTuple):
    """The compiled automaton (see the module docstring); S states, state 0 the empty match."""

    root_next: torch.Tensor  # (V,) int64
    arc_keys: torch.Tensor  # (E+1,) int64 sorted state * V + token, then a sentinel
    arc_dst: torch.Tensor  # (E+1,) int64
    reach: torch.Tensor  # (S,) float: out + pend of reaching a state
    pend: torch.Tensor  # (S,) float: the provisional bonus held in a state
    start: int  # the state id of an empty hypothesis
    max_out: float  # the most one token can complete (the largest out)
    step_next: Optional[torch.Tensor] = None  # (S * (V + 1),) int64 at row + token: the next row, if it fits
    step_gain: Optional[torch.Tensor] = None  # (S * (V + 1),) float at row + token: the score

    def to(self, device: torch.device) -> "HotwordGraph":
        names = ("root_next", "arc_keys", "arc_dst", "reach", "pend") + (
            ("step_next", "step_gain") if self.step_next is not None else ())
        return self._replace(**{k: getattr(self, k).to(device) for k in names})


def compile_hotwords(phrases: Sequence[Tuple[Sequence[int], float]], vocab: int, free: Collection[int] = (),
                     start_token: Optional[int] = None, held: int = HELD_TOKENS) -> HotwordGraph:
    """The automaton of ``phrases`` ((token ids, per-token weight) each; duplicates keep the largest weight)
    over a vocabulary of ``vocab`` ids; tokens in ``free`` carry no bonus; ``start_token``: an empty
    hypothesis starts in the state after it (a word boundary); the first ``held`` bonus-carrying tokens of a
    phrase hold no provisional bonus. Cached by content."""
    merged: Dict[Tuple[int, ...], float] = {}
    for ids, weight in phrases:
        key = tuple(int(i) for i in ids)
        if not key:
            raise ValueError("compile_hotwords: a phrase has no tokens")
        if not all(0 < i < vocab for i in key):
            raise ValueError(f"compile_hotwords: phrase {list(key)} has ids outside 1..{vocab - 1}")
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"compile_hotwords: phrase {list(key)} has weight {weight}; weights must be > 0")
        merged[key] = max(float(weight), merged.get(key, 0.0))
    if not merged:
        raise ValueError("compile_hotwords: no phrases")
    return _compile(tuple(sorted(merged.items())), vocab, tuple(sorted(set(free))), start_token, held)


@functools.lru_cache(maxsize=16)
def _compile(phrases: Tuple[Tuple[Tuple[int, ...], float], ...], vocab: int, free: Tuple[int, ...],
             start_token: Optional[int], held: int) -> HotwordGraph:
    children: List[Dict[int, int]] = [{}]
    node_weight, end_bonus = [0.0], [0.0]
    parent, token_of, depth = [0], [0], [0]  # depth: the bonus-carrying tokens from the phrase start
    for ids, weight in phrases:
        node = 0
        for tok in ids:
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = children[node][tok] = len(children)
                children.append({}), node_weight.append(0.0), end_bonus.append(0.0)
                parent.append(node), token_of.append(tok), depth.append(depth[node] + (tok not in free))
            if tok not in free and depth[nxt] > held:
                node_weight[nxt] = max(node_weight[nxt], weight)
            node = nxt
        end_bonus[node] = weight * sum(tok not in free for tok in ids)
    states = len(children)
    acc, last_end = [0.0] * states, [0.0] * states
    fail, out = [0] * states, [0.0] * states
    arcs: List[Dict[int, int]] = [{} for _ in range(states)]  # the non-root moves that differ from root_next
    order = [0]
    for node in order:  # breadth first: a node's failure state is shallower, so it is done
        if node:
            par = parent[node]
            acc[node] = acc[par] + node_weight[node]
            last_end[node] = acc[node] if end_bonus[node] else last_end[par]
            fail[node] = 0 if par == 0 else _move(arcs, children[0], fail[par], token_of[node])
            out[node] = end_bonus[node] + out[fail[node]]
            arcs[node] = {**arcs[fail[node]], **children[node]}
        order.extend(children[node].values())
    root_next = torch.zeros(vocab, dtype=torch.long)
    for tok, nxt in children[0].items():
        root_next[tok] = nxt
    keys = sorted((s * vocab + t, d) for s in range(1, states) for t, d in arcs[s].items())
    sentinel = states * vocab  # larger than any key
    pend = torch.tensor([a - e for a, e in zip(acc, last_end)], dtype=torch.float32)
    start = int(root_next[start_token]) if start_token is not None else 0
    arc_keys = torch.tensor([k for k, _ in keys] + [sentinel], dtype=torch.long)
    arc_dst = torch.tensor([d for _, d in keys] + [0], dtype=torch.long)
    reach = torch.tensor(out, dtype=torch.float32) + pend
    step_next = step_gain = None
    if states * (vocab + 1) <= DENSE_MAX_ENTRIES:
        nxt = root_next.repeat(states)  # every state moves as the root does, but for its arcs
        nxt[arc_keys[:-1]] = arc_dst[:-1]
        nxt = nxt.view(states, vocab)
        gain = reach[nxt] - pend[:, None]  # what HotwordScorer computes on the arcs, in the same float order
        own = torch.arange(states)[:, None]
        nxt, gain = torch.cat([own, own, nxt[:, 1:]], 1), torch.cat([torch.zeros(states, 2), gain[:, 1:]], 1)
        step_next, step_gain = (nxt * (vocab + 1) + 1).view(-1), gain.view(-1)  # -1 and the blank: stay, 0
    return HotwordGraph(root_next=root_next, arc_keys=arc_keys, arc_dst=arc_dst, reach=reach, pend=pend, start=start,
                        max_out=max(out), step_next=step_next, step_gain=step_gain)


def _move(arcs: List[Dict[int, int]], root_children: Dict[int, int], state: int, tok: int) -> int:
    """The next state from ``state`` by ``tok`` while the tables are built."""
    return arcs[state].get(tok, root_children.get(tok, 0))  # arcs[0] is empty: the root reads root_children


class HotwordScorer:
    """A :class:`~asrkit.search.interfaces.BatchScorer` biasing toward the phrases of ``graph`` (see the module
    docstring). Weighted by the global hotword weight in the search's weights dict. The state is (N,) int64
    automaton states. ``words``: the words of its phrases (a word-LM search adds those outside its lexicon)."""

    def __init__(self, graph: HotwordGraph, words: Sequence[str] = ()) -> None:
        self.graph = graph
        self.vocab = int(graph.root_next.shape[0])
        self.words = tuple(words)

    def _next(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Next state ids of state ids ``state`` (broadcast to tokens' shape) by ``tokens`` (>= 0), from the arcs."""
        g = self.graph
        key = state * self.vocab + tokens
        pos = torch.searchsorted(g.arc_keys, key.reshape(-1)).view(key.shape)
        return torch.where(g.arc_keys[pos] == key, g.arc_dst[pos], g.root_next[tokens])

    def _ids(self, state: torch.Tensor) -> torch.Tensor:
        """The state ids of states (table rows ``id * (V + 1) + 1``)."""
        return torch.div(state, self.vocab + 1, rounding_mode="floor")

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        self.graph = self.graph.to(device)
        return torch.full((batch * beam,), self.graph.start * (self.vocab + 1) + 1, dtype=torch.long, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, C) -> (N, C) the change of the potential; 0 for the blank and -1."""
        g = self.graph
        if g.step_gain is not None:
            return g.step_gain.take(state[:, None] + tokens)
        ids = self._ids(state)
        gain = g.reach[self._next(ids[:, None].expand(tokens.shape), tokens.clamp(min=0))] - g.pend[ids][:, None]
        return gain.masked_fill(tokens <= BLANK_ID, 0.0)

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (M,) extended by ``tokens`` (M,); the blank and -1 keep the row's state."""
        old = state.index_select(0, index)
        if self.graph.step_next is not None:
            return self.graph.step_next.take(old + tokens)
        moved = self._next(self._ids(old), tokens.clamp(min=0)) * (self.vocab + 1) + 1
        return torch.where(tokens > BLANK_ID, moved, old)

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        """(N,) the unfinished partial match is cancelled."""
        return -self.graph.pend[self._ids(state)]

    def max_gain(self) -> GainBound:
        """A token completes at most ``max_out``; a failure or the end only takes back."""
        return 0.0, self.graph.max_out, False

    def native_form(self) -> Tuple[str, Dict[str, torch.Tensor]]:
        """The tables the native CPU search reads (asrkit.search.interfaces.NativeScorer): kind "hotwords"."""
        g = self.graph
        tables = dict(root_next=g.root_next, arc_keys=g.arc_keys, arc_dst=g.arc_dst, reach=g.reach, pend=g.pend,
                      vocab=torch.tensor(self.vocab), start_state=torch.tensor(g.start * (self.vocab + 1) + 1))
        if g.step_next is not None:
            tables.update(step_next=g.step_next, step_gain=g.step_gain)
        return "hotwords", tables


def parse_hotwords(lines: Iterable[str], source: str) -> List[Phrase]:
    """Phrases of a hotword list: one a line, optionally a tab and a weight factor (> 0); blank lines and
    ``#`` comments skipped. Errors name ``source`` and the line."""
    phrases = []
    for n, line in enumerate(lines, 1):
        text, _, weight = line.partition("\t")  # both are stripped below
        text = " ".join(text.split())
        if not text or text.startswith("#"):
            continue
        factor = 1.0
        if weight.strip():
            try:
                factor = float(weight)
            except ValueError:
                raise ValueError(f"{source} line {n}: the weight {weight.strip()!r} is not a number") from None
            if not (math.isfinite(factor) and factor > 0):
                raise ValueError(f"{source} line {n}: the weight {factor} must be a number > 0")
        phrases.append(Phrase(text, factor, f"{source} line {n}"))
    return phrases


def read_hotwords(path: Union[str, os.PathLike]) -> List[Phrase]:
    """The phrases of a hotword file (see :func:`parse_hotwords`); a file with none is an error naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            phrases = parse_hotwords(f, str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"hotwords file {path}: cannot read it ({exc})") from None
    if not phrases:
        raise ValueError(f"hotwords file {path}: no phrases (one phrase a line, optionally a tab and a weight)")
    return phrases


def as_phrases(hotwords: Iterable[Union[PhraseSpec, Phrase]], source: str = "hotwords") -> List[Phrase]:
    """Phrases from a list of strings, (phrase, weight) pairs or :class:`Phrase`; errors name the item."""
    if isinstance(hotwords, (str, bytes)):
        raise TypeError(f"{source} must be a list of phrases, got the string {hotwords!r}")
    phrases = []
    for n, item in enumerate(hotwords):
        if isinstance(item, str):
            item = Phrase(item)
        elif isinstance(item, tuple) and not isinstance(item, Phrase) and len(item) == 2:
            item = Phrase(str(item[0]), float(item[1]))
        if not isinstance(item, Phrase):
            raise TypeError(f"{source}[{n}]: a phrase is a string or a (phrase, weight) pair, got {item!r}")
        text = " ".join(item.text.split())
        if not (math.isfinite(item.weight) and item.weight > 0):
            raise ValueError(f"{source}[{n}] {text!r}: the weight {item.weight} must be a number > 0")
        if text:
            phrases.append(Phrase(text, item.weight, item.where or f"{source}[{n}]"))
    if not phrases:
        raise ValueError(f"{source}: no phrases")
    return phrases


def hotword_scorer(hotwords: Iterable[Union[PhraseSpec, Phrase]], encode: Callable[[str], Sequence[int]],
                   token_list: Sequence[str], unk_id: Optional[int] = None,
                   warn: Callable[[str], None] = lambda message: None) -> HotwordScorer:
    """A :class:`HotwordScorer` of phrases spelled by ``encode`` (text -> ids of ``token_list``; the model's
    tokenizer). A phrase spelled with ``unk_id`` or with nothing (letters the model has no token for) is skipped
    and reported through ``warn`` with where it came from; none left is a ValueError. With a standalone
    word-boundary token (``▁`` or ``|``), phrases start with it and hypotheses start after one. The scorer's
    ``words``: those of the phrases kept, each once, in the order first met."""
    tokens = list(token_list)
    marks = [i for i, t in enumerate(tokens) if t in BOUNDARY_MARKS]
    boundary = marks[0] if marks else None
    spelled, words = [], {}
    for phrase in as_phrases(hotwords):
        ids = [int(i) for i in encode(phrase.text)]
        if not ids or (unk_id is not None and unk_id in ids) or not all(0 < i < len(tokens) for i in ids):
            warn(f"hotword {phrase.text!r} ({phrase.where}) skipped: the model's units cannot spell it")
            continue
        if boundary is not None and ids[0] != boundary:
            ids = [boundary] + ids
        spelled.append((ids, phrase.weight))
        words.update(dict.fromkeys(phrase.text.split()))
    if not spelled:
        raise ValueError("hotwords: no phrase can be spelled with the model's units")
    return HotwordScorer(compile_hotwords(spelled, len(tokens), free=marks, start_token=boundary), list(words))


def spell_with_tokens(token_list: Sequence[str]) -> Callable[[str], List[int]]:
    """An ``encode`` for a bare token list (:func:`asrkit.search.decode_ctc`): each word, after the list's
    word-boundary mark where word-initial tokens carry one, is split greedily into its longest tokens; a
    letter no token starts is ``[]`` (the phrase cannot be spelled)."""
    tokens = list(token_list)
    index = {t: i for i, t in enumerate(tokens) if t and not (t.startswith("<") and t.endswith(">"))}
    mark = next((m for m in BOUNDARY_MARKS if any(t.startswith(m) for t in index)), "")
    longest = max(len(t) for t in index)

    def encode(text: str) -> List[int]:
        ids: List[int] = []
        for word in text.split():
            rest = mark + word
            while rest:
                size = next((k for k in range(min(longest, len(rest)), 0, -1) if rest[:k] in index), 0)
                if not size:
                    return []
                ids.append(index[rest[:size]])
                rest = rest[size:]
        return ids

    return encode
