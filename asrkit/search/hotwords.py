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
    # A union of L lists (union_graph): root_next is (L * V,), list l's at l * V; block (S,) int64 the list of each
    # state; starts the start state of each list. None / (): one list, root_next (V,), starts (start,).
    block: Optional[torch.Tensor] = None
    starts: Tuple[int, ...] = ()

    @property
    def lists(self) -> int:
        """The hotword lists this automaton holds (one block of states each)."""
        return max(1, len(self.starts))

    @property
    def list_starts(self) -> Tuple[int, ...]:
        """The start state of each list."""
        return self.starts or (self.start,)

    def to(self, device: torch.device) -> "HotwordGraph":
        names = ("root_next", "arc_keys", "arc_dst", "reach", "pend") + (
            ("step_next", "step_gain") if self.step_next is not None else ()) + (
            ("block",) if self.block is not None else ())
        if all(getattr(self, k).device == device for k in names):
            return self
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


def empty_graph(vocab: int) -> HotwordGraph:
    """The automaton of no phrases (one state, every step scores 0): the list of a row without hotwords."""
    return HotwordGraph(root_next=torch.zeros(vocab, dtype=torch.long), arc_keys=torch.tensor([vocab]),
                        arc_dst=torch.zeros(1, dtype=torch.long), reach=torch.zeros(1), pend=torch.zeros(1), start=0,
                        max_out=0.0, step_next=torch.ones(vocab + 1, dtype=torch.long),  # every entry: row 1
                        step_gain=torch.zeros(vocab + 1))


def union_graph(graphs: Sequence[HotwordGraph]) -> HotwordGraph:
    """One automaton of several lists (each a compiled graph of one vocabulary): their states concatenated, list
    l's a contiguous block from the states of the lists before it, every move of a block shifted with it, so a
    hypothesis started in a list's block (its ``starts[l]``) never leaves it; a list's states keep their ids
    when lists are appended. The step tables are kept where every list has them and the union fits
    :data:`DENSE_MAX_ENTRIES`; the arcs always. A per-frame step reads the same tables whatever the lists."""
    if not graphs:
        raise ValueError("union_graph: no hotword lists")
    vocab = int(graphs[0].root_next.numel()) // graphs[0].lists
    parts: Dict[str, List[torch.Tensor]] = {k: [] for k in ("root_next", "keys", "dst", "reach", "pend", "block",
                                                           "next", "gain")}
    starts: List[int] = []
    base = 0
    for g in graphs:
        g = g.to(torch.device("cpu"))
        if int(g.root_next.numel()) != vocab * g.lists:
            raise ValueError(f"union_graph: lists of {vocab} and {int(g.root_next.numel()) // g.lists} tokens")
        size = int(g.reach.numel())
        first = len(starts)
        parts["root_next"].append(g.root_next + base)
        parts["keys"].append(g.arc_keys[:-1] + base * vocab)
        parts["dst"].append(g.arc_dst[:-1] + base)
        parts["reach"].append(g.reach)
        parts["pend"].append(g.pend)
        parts["block"].append((torch.zeros(size, dtype=torch.long) if g.block is None else g.block) + first)
        if g.step_next is not None and g.step_gain is not None:
            parts["next"].append(g.step_next + base * (vocab + 1))  # rows id * (V + 1) + 1 move with their ids
            parts["gain"].append(g.step_gain)
        starts.extend(s + base for s in g.list_starts)
        base += size
    dense = len(parts["next"]) == len(graphs) and base * (vocab + 1) <= DENSE_MAX_ENTRIES
    return HotwordGraph(
        root_next=torch.cat(parts["root_next"]), arc_keys=torch.cat(parts["keys"] + [torch.tensor([base * vocab])]),
        arc_dst=torch.cat(parts["dst"] + [torch.zeros(1, dtype=torch.long)]), reach=torch.cat(parts["reach"]),
        pend=torch.cat(parts["pend"]), start=starts[0], max_out=max(g.max_out for g in graphs),
        step_next=torch.cat(parts["next"]) if dense else None, step_gain=torch.cat(parts["gain"]) if dense else None,
        block=torch.cat(parts["block"]), starts=tuple(starts))


def _move(arcs: List[Dict[int, int]], root_children: Dict[int, int], state: int, tok: int) -> int:
    """The next state from ``state`` by ``tok`` while the tables are built."""
    return arcs[state].get(tok, root_children.get(tok, 0))  # arcs[0] is empty: the root reads root_children


class HotwordScorer:
    """A :class:`~asrkit.search.interfaces.BatchScorer` biasing toward the phrases of ``graph`` (see the module
    docstring). Weighted by the global hotword weight in the search's weights dict. The state is (N,) int64
    automaton states. ``words``: the words of its phrases (a word-LM search adds those outside its lexicon)."""

    def __init__(self, graph: HotwordGraph, words: Sequence[str] = (), rows: Optional[Sequence[int]] = None) -> None:
        self.graph = graph
        self.vocab = int(graph.root_next.shape[0]) // graph.lists
        self.words = tuple(words)
        self.rows: Optional[Tuple[int, ...]] = None
        if rows is not None:
            self.rows = tuple(int(r) for r in rows)
            bad = [r for r in self.rows if not 0 <= r < graph.lists]
            if bad:
                raise ValueError(f"hotwords: row list index {bad[0]} outside the {graph.lists} lists of the automaton")

    def for_rows(self, rows: Sequence[int]) -> "HotwordScorer":
        """The same automaton (tables shared) with search row b starting in list ``rows[b]``: a search of
        len(rows) utterances (or one stream: ``[l]``) over a union of lists (:func:`union_graph`)."""
        return HotwordScorer(self.graph, self.words, rows)

    def _next(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Next state ids of state ids ``state`` (broadcast to tokens' shape) by ``tokens`` (>= 0), from the arcs."""
        g = self.graph
        key = state * self.vocab + tokens
        pos = torch.searchsorted(g.arc_keys, key.reshape(-1)).view(key.shape)
        root = tokens if g.block is None else g.block[state] * self.vocab + tokens  # the state's own list's root
        return torch.where(g.arc_keys[pos] == key, g.arc_dst[pos], g.root_next[root])

    def _ids(self, state: torch.Tensor) -> torch.Tensor:
        """The state ids of states (table rows ``id * (V + 1) + 1``)."""
        return torch.div(state, self.vocab + 1, rounding_mode="floor")

    def _start_rows(self, batch: int) -> torch.Tensor:
        """(batch,) the start row of each utterance: its list's start state (list 0's without ``rows``)."""
        starts = self.graph.list_starts
        if self.rows is None:
            return torch.full((batch,), starts[0] * (self.vocab + 1) + 1, dtype=torch.long)
        if len(self.rows) != batch:
            raise ValueError(f"hotwords: lists are given for {len(self.rows)} utterances, the search has {batch}")
        return torch.tensor([starts[r] * (self.vocab + 1) + 1 for r in self.rows], dtype=torch.long)

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        """(batch * beam,) each utterance's hypotheses at its list's start."""
        self.graph = self.graph.to(device)
        return self._start_rows(batch).to(device).repeat_interleave(beam)

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
        if g.block is not None:
            tables.update(block=g.block)
        if self.rows is not None:  # utterance b (a stream: 0) starts at row_start[b]
            tables.update(row_start=self._start_rows(len(self.rows)))
        return "hotwords", tables


class HotwordUnion:
    """The hotword lists of streams searched as one batch (:class:`asrkit.search.streaming.StreamingCtcSearch`):
    one scorer, :attr:`scorer` (the search's), whose automaton is the union of the lists added (list 0: no
    phrases, the streams without a list), and per stream :meth:`view` (``new_state``'s view). :meth:`add`
    appends a list (cached by content: the same list again is the same index), growing the scorer's tables in
    place; the lists already there keep their states, so live streams go on. A union never shrinks: a caller
    whose lists come and go starts a new union (and search) when :attr:`states` passes its limit and no stream
    of the old one is left."""

    def __init__(self, vocab: int) -> None:
        self.scorer = HotwordScorer(union_graph([empty_graph(vocab)]))  # scores every stream; views start them
        self._graphs: List[HotwordGraph] = [empty_graph(vocab)]

    @property
    def states(self) -> int:
        """The automaton states of the union (its tables' rows)."""
        return int(self.scorer.graph.reach.numel())

    def index(self, graph: HotwordGraph) -> Optional[int]:
        """The list index of ``graph`` in the union (None: not added)."""
        return next((i for i, g in enumerate(self._graphs) if g is graph or _same_graph(g, graph)), None)

    def add(self, scorer: HotwordScorer) -> int:
        """The list index of ``scorer``'s list (a one-list scorer, :func:`hotword_scorer`), appended if new."""
        if scorer.graph.lists != 1:
            raise ValueError("HotwordUnion.add: give the scorer of one list")
        found = self.index(scorer.graph)
        if found is not None:
            return found
        device = self.scorer.graph.reach.device
        self.scorer.graph = union_graph([self.scorer.graph, scorer.graph]).to(device)
        self.scorer.words = tuple(dict.fromkeys(self.scorer.words + scorer.words))
        self._graphs.append(scorer.graph)
        return len(self._graphs) - 1

    def view(self, index: int) -> HotwordScorer:
        """The scorer a stream of list ``index`` starts with (the union's tables, its list's start)."""
        return self.scorer.for_rows([index])

    def states_outside(self, keep: Collection[int]) -> int:
        """The states of the lists not in ``keep``."""
        block = self.scorer.graph.block
        assert block is not None  # a union's graph always has its blocks
        return int((~torch.isin(block, torch.tensor(sorted(keep), device=block.device))).sum())

    def compact(self, keep: Collection[int]) -> Tuple[Dict[int, int], torch.Tensor]:
        """Rebuild the union from list 0 and the lists ``keep`` (in their order), in place. Returns old -> new
        list index of those kept, and (S_old,) the new id of each old state (-1: a dropped list's), for
        :meth:`move_rows`."""
        kept = sorted(set(keep) | {0})
        old = self.scorer.graph
        assert old.block is not None
        block = old.block.cpu()
        state_map = torch.full_like(block, -1)
        base = 0
        for i in kept:
            ids = (block == i).nonzero().flatten()  # a block is contiguous: its order is kept
            state_map[ids] = torch.arange(base, base + ids.numel())
            base += ids.numel()
        self._graphs = [self._graphs[i] for i in kept]
        self.scorer.graph = union_graph(self._graphs).to(old.reach.device)
        return {i: n for n, i in enumerate(kept)}, state_map

    def move_rows(self, state: torch.Tensor, state_map: torch.Tensor) -> torch.Tensor:
        """Hypothesis states (rows ``id * (V + 1) + 1``) of the union before :meth:`compact` -> after it."""
        width = self.scorer.vocab + 1
        return state_map.to(state.device)[torch.div(state, width, rounding_mode="floor")] * width + 1


def _same_graph(a: HotwordGraph, b: HotwordGraph) -> bool:
    """Whether two compiled lists are the same automaton (equal tables)."""
    names = ("root_next", "arc_keys", "arc_dst", "reach", "pend")
    return a.start == b.start and all(getattr(a, k).shape == getattr(b, k).shape and
                                      torch.equal(getattr(a, k).cpu(), getattr(b, k).cpu()) for k in names)


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


RowHotwords = Optional[Sequence[Union[PhraseSpec, Phrase]]]  # one utterance's list; None: no hotwords


def is_per_row(hotwords: object) -> bool:
    """Whether ``hotwords`` gives a list per utterance (a list whose items are lists or None) rather than one list
    of phrases (strings, (phrase, weight) pairs or :class:`Phrase`)."""
    return (isinstance(hotwords, (list, tuple)) and not isinstance(hotwords, Phrase) and len(hotwords) > 0
            and all(item is None or isinstance(item, list) for item in hotwords))


def per_row_scorer(lists: Sequence[RowHotwords], encode: Callable[[str], Sequence[int]], token_list: Sequence[str],
                   unk_id: Optional[int] = None, warn: Callable[[str], None] = lambda message: None
                   ) -> Optional[HotwordScorer]:
    """A :class:`HotwordScorer` for a batch whose utterance b is biased toward ``lists[b]`` (None or []: nothing):
    each distinct list compiled once (:func:`hotword_scorer`, cached by content), the lists in use joined by
    :func:`union_graph` (a list of no phrases for the rows without), each row starting in its own list. None
    when no row has a list. Errors name the utterance."""
    index: Dict[Tuple[Phrase, ...], int] = {}
    graphs: List[HotwordGraph] = []
    words: Dict[str, None] = {}
    rows = []
    for b, item in enumerate(lists):
        if not item:
            key: Tuple[Phrase, ...] = ()
        else:
            key = tuple(as_phrases(item, f"hotwords of utterance {b}"))
        if key not in index:
            if key:
                try:
                    scorer = hotword_scorer(key, encode, token_list, unk_id, warn)
                except ValueError as exc:
                    raise ValueError(f"utterance {b}: {exc}") from None
                graphs.append(scorer.graph)
                words.update(dict.fromkeys(scorer.words))
            else:
                graphs.append(empty_graph(len(token_list)))
            index[key] = len(graphs) - 1
        rows.append(index[key])
    if () in index and len(index) == 1:
        return None
    return HotwordScorer(union_graph(graphs), list(words), rows)


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
