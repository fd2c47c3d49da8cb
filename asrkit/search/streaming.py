"""Resumable CTC prefix beam search: live streams searched chunk by chunk, many streams as one batch.

:class:`StreamingCtcSearch` runs the search of :func:`asrkit.search.ctc_prefix_beam_search` (the same options,
scorers and fusion) on frames that arrive in pieces. Each stream's state is an object the caller holds
(:meth:`StreamingCtcSearch.new_state`); :meth:`~StreamingCtcSearch.advance` moves B streams by their next frames
in one batch, whatever frame each stream is at; :meth:`~StreamingCtcSearch.partial` gives each stream's best
prefix so far, :meth:`~StreamingCtcSearch.blank_run` its trailing blank frames (for endpointing) and
:meth:`~StreamingCtcSearch.finish` the N-best with the end-of-sentence scores added.

The state is the search's own (the beam's prefix probabilities and hashes, every scorer's state, the skipped
blank frames' log-probability) plus, per hypothesis, its tokens and their frames so far: after each piece the
piece's backpointers are traced once and appended to the rows the hypotheses descend from, so a state holds
(beam x tokens) numbers, never a history per frame. An utterance's state grows with its tokens only; an
endpoint starts a new state.

Feeding an utterance as one piece gives exactly the offline search's result (hypotheses, token frames and
scores); feeding it in pieces gives the same search (:func:`asrkit.search.ctc_prefix.resume_search`; the
pruning acts per frame), so the same result but where exact ties between hypotheses break another way (tested:
exact search, and >= 99% of streams with the default pruning). Scorer states are stacked along
their row dimension to batch streams; a scorer whose state has a per-stream size beyond the rows (the
Transformer LM's key/value cache grows with the steps) batches only the streams whose sizes agree, one group
after the other. Token frames count input frames since the state was created.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from asrkit.search import native_loop
from asrkit.search.ctc_prefix import BeamRows, check_options, fresh_rows, resume_search, search_threads
from asrkit.search.greedy import check_ctc_inputs, trailing_blanks
from asrkit.search.hypotheses import Hypothesis, NBest, pack_emissions, trace_rows
from asrkit.search.interfaces import BatchScorer, active_scorers
from asrkit.search.scorers import index_rows

NEG_INF = float("-inf")


class StreamingCtcState:
    """One stream's search state, which the caller holds between calls: on the torch loop tensors on the
    search's device (``rows``: the beam and the scorers' states; per hypothesis its tokens and their frames),
    on the native loop a C++ state (``native``; :meth:`close` frees it now rather than when collected).

    ``frames``: input frames the stream has been advanced by since the state was created.
    """

    def __init__(self, search: "StreamingCtcSearch", rows: Optional[BeamRows],
                 native: Optional[native_loop.StreamState] = None) -> None:
        beam, device = search.beam, search.device
        self.search = search
        self.native = native
        self.frames = 0
        self.blank_frames = 0  # trailing frames of the best path that are blank (see blank_run)
        self.vocab: Optional[int] = None  # fixed by the first advance
        self.rows = rows  # (1, ...) the beam; scorer states of beam rows (None on the native loop)
        self.tokens = torch.empty((1, beam, 0), dtype=torch.long, device=device)  # (1, K, L), -1 pads
        self.token_frames = torch.empty_like(self.tokens)  # (1, K, L)
        self.offset = torch.zeros(1, dtype=torch.float64, device=device)  # skipped blank frames' log P

    def close(self) -> None:
        """Free the native state now (idempotent; nothing to free on the torch loop)."""
        if self.native is not None:
            self.native.close()


def _cat_trees(trees: Sequence[Any]) -> Any:
    """Concatenate pytrees of tensors (tuples, NamedTuples, lists, dicts) along dim 0."""
    first = trees[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(trees))
    if first is None:
        return None
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a NamedTuple
        return type(first)(*(_cat_trees(parts) for parts in zip(*trees)))
    if isinstance(first, (tuple, list)):
        return type(first)(_cat_trees(parts) for parts in zip(*trees))
    if isinstance(first, dict):
        return {k: _cat_trees([t[k] for t in trees]) for k in first}
    raise TypeError(f"scorer state: cannot stack a {type(first).__name__}")


def _shapes(tree: Any) -> Tuple[Any, ...]:
    """The sizes beyond dim 0 of every tensor of a pytree: states that agree can be stacked."""
    if isinstance(tree, torch.Tensor):
        return (tuple(tree.shape[1:]),)
    if isinstance(tree, dict):
        tree = [tree[k] for k in sorted(tree)]
    if isinstance(tree, (tuple, list)):
        return tuple(s for x in tree for s in _shapes(x))
    return ()


def _pad_cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """(1, K, L_b) tensors -> (B, K, max L_b), padded with -1 (no token)."""
    width = max(p.shape[2] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[2]), value=-1) for p in parts])


class StreamingCtcSearch:
    """CTC prefix beam search over streams that arrive in pieces (see the module docstring).

    The options are :func:`asrkit.search.ctc_prefix_beam_search`'s: ``beam``, ``nbest`` (None: the beam),
    ``scorers``/``weights`` (shallow fusion; ``length_bonus`` without a scorer is a bonus per token),
    ``token_topk``, ``token_min_logp``, ``blank_skip_threshold`` (all three None: the exact search).
    ``device``/``dtype``: where states live and the precision searched in (log-probs are converted to it).
    ``native``: the C++ loop (:mod:`asrkit.search.native_loop`'s stream states; the same search to rounding)
    or the torch loop, as the offline search chooses: None (auto) the C++ loop when the device is the CPU, every
    active scorer has a native form and the library builds; True that loop or a ValueError saying why not;
    False the torch loop (the GPU path). ``self.native`` says which runs.
    """

    def __init__(self, beam: int = 10, nbest: Optional[int] = None, scorers: Optional[Mapping[str, BatchScorer]] = None,
                 weights: Optional[Mapping[str, float]] = None, token_topk: Optional[int] = 8,
                 token_min_logp: Optional[float] = -12.0, blank_skip_threshold: Optional[float] = 0.999,
                 native: Optional[bool] = None, device: Union[str, torch.device] = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.nbest = check_options(beam, nbest, token_topk, blank_skip_threshold)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.beam, self.topk, self.min_logp, self.skip = beam, token_topk, token_min_logp, blank_skip_threshold
        self.scorers, self.weights, self.bonus = active_scorers(scorers or {}, weights or {})
        # resolved ("cuda" -> "cuda:0"), so the check of the log-probs' device compares like with like
        self.device, self.dtype = torch.empty(0, device=device).device, dtype
        self.native = False
        if native is not False:
            why = (f"the native search runs on the CPU, not {self.device}" if self.device.type != "cpu"
                   else native_loop.scorers_unavailable(self.scorers))
            if native and why is not None:
                raise ValueError(f"native=True, but the native search cannot run: {why}")
            self.native = why is None

    def new_state(self, views: Optional[Mapping[str, BatchScorer]] = None) -> StreamingCtcState:
        """A stream before its first frame (scorers at sentence start). ``views``: this stream's own start for
        some scorers, by name: a view of the search's scorer of that name that shares its tables (a hotword
        list of a union, :meth:`asrkit.search.hotwords.HotwordScorer.for_rows` with one row), whose
        ``init_state`` puts the stream in its own part of them; the search's scorer still scores every stream."""
        views = dict(views or {})
        unknown = sorted(set(views) - set(self.scorers))
        if unknown:
            raise ValueError(f"new_state: view {unknown[0]!r} is not an active scorer of this search "
                             f"({sorted(self.scorers)})")
        scorers = {**self.scorers, **views}
        if self.native:  # the C++ state keeps the tables it was made with (a union grown later: the same ids)
            return StreamingCtcState(self, None, native_loop.StreamState(self.beam, scorers, self.weights,
                                                                         self.bonus, self.dtype))
        for name in views:  # the search's own scorer reads the tables on the search's device
            self.scorers[name].init_state(1, self.beam, self.device)
        return StreamingCtcState(self, fresh_rows(1, self.beam, self.dtype, self.device, scorers))

    def add_scorer(self, name: str, scorer: BatchScorer, weight: float, states: Sequence[StreamingCtcState],
                   start: Optional[BatchScorer] = None) -> None:
        """Fuse one more scorer from now on (a hotword union when the first stream's list joins, so that streams
        without lists pay nothing until then). ``states``: the live torch-loop streams, which get ``start``'s
        (default the scorer's) sentence-start state for it: a scorer that adds nothing to them (a union's empty
        list), so their search goes on as before; a native stream keeps the scorers it was made with."""
        if name in self.scorers:
            raise ValueError(f"add_scorer: the search already has a scorer {name!r}")
        scorers, weights, _ = active_scorers({**self.scorers, name: scorer}, {**self.weights, name: weight})
        if self.native:
            why = native_loop.scorers_unavailable(scorers)
            if why is not None:
                raise ValueError(f"add_scorer: the native search cannot take {name!r}: {why}")
        for st in states:
            if st.rows is not None and name in scorers:
                st.rows = st.rows._replace(states={**st.rows.states,
                                                   name: (start or scorer).init_state(1, self.beam, self.device)})
        self.scorers, self.weights = scorers, weights

    def map_scorer_state(self, states: Sequence[StreamingCtcState], name: str,
                         fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace scorer ``name``'s state of each torch-loop stream by ``fn(state)`` (its tables were rebuilt
        with other state ids: a compacted hotword union); a native stream keeps the tables it was made with."""
        for st in states:
            if st.rows is not None and name in st.rows.states:
                st.rows = st.rows._replace(states={**st.rows.states, name: fn(st.rows.states[name])})

    def _check_states(self, states: Sequence[StreamingCtcState], batch: Optional[int] = None) -> None:
        if batch is not None and len(states) != batch:
            raise ValueError(f"{len(states)} stream states for log_probs of {batch} streams: give one state per row")
        seen: Dict[int, int] = {}
        for b, st in enumerate(states):
            if not isinstance(st, StreamingCtcState) or st.search is not self:
                raise ValueError(f"stream {b}: not a state of this StreamingCtcSearch (make it with new_state())")
            if id(st) in seen:
                raise ValueError(f"streams {seen[id(st)]} and {b} are the same state: a stream advances once per call")
            seen[id(st)] = b

    def _groups(self, states: Sequence[StreamingCtcState]) -> List[List[int]]:
        """Indices of the streams whose scorer states stack (all of them, but for growing states)."""
        groups: Dict[Tuple[Any, ...], List[int]] = {}
        for b, st in enumerate(states):
            groups.setdefault(_shapes(st.rows.states), []).append(b)
        return list(groups.values())

    def _stack(self, states: Sequence[StreamingCtcState]) -> BeamRows:
        rows = [st.rows for st in states]
        return BeamRows(torch.cat([r.st for r in rows]), torch.cat([r.ints for r in rows]),
                        {name: _cat_trees([r.states[name] for r in rows]) for name in self.scorers})

    def advance(self, states: Sequence[StreamingCtcState], log_probs: torch.Tensor, lengths: torch.Tensor) -> None:
        """Move B streams by their next frames, in place: log_probs (B, T, V) (blank id 0), lengths (B,) the
        frames of each row that are real (a row may have none); ``states[b]`` is row b's stream."""
        if log_probs.device != self.device:
            raise ValueError(f"log_probs are on {log_probs.device}, this search's states on {self.device}")
        check_ctc_inputs(log_probs, lengths)
        batch, _, vocab = log_probs.shape
        self._check_states(states, batch)
        for b, st in enumerate(states):
            if st.vocab is not None and st.vocab != vocab:
                raise ValueError(f"stream {b}: log_probs have {vocab} tokens, its earlier frames had {st.vocab}")
        lp = log_probs.to(self.dtype)
        lengths = lengths.to(self.device, torch.long)
        with search_threads(self.device):
            before = torch.tensor([st.blank_frames for st in states], device=self.device)
            runs = trailing_blanks(lp.argmax(2), lengths, before).tolist()
            for group in [] if self.native else self._groups(states):
                index = torch.tensor(group, device=self.device)
                self._advance([states[b] for b in group], lp.index_select(0, index), lengths.index_select(0, index))
        if self.native:  # outside search_threads: the native loop spreads the streams over torch's threads
            native_loop.stream_advance([st.native for st in states], lp, lengths, topk=self.topk,
                                       min_logp=self.min_logp, skip=self.skip)
        for st, n, run in zip(states, lengths.tolist(), runs):
            st.blank_frames = run
            st.frames += n
            st.vocab = vocab

    def _advance(self, states: Sequence[StreamingCtcState], lp: torch.Tensor, lengths: torch.Tensor) -> None:
        beam = self.beam
        chunk = resume_search(lp, lengths, self._stack(states), self.scorers, self.weights, self.bonus,
                              self.topk, self.min_logp, self.skip)
        # Each hypothesis's tokens in this piece, appended to the row it descends from.
        finals = torch.arange(beam, device=self.device).expand(len(states), beam)
        steps, roots = trace_rows(chunk.parents, finals)  # (T', B, K), (B, K)
        paths = chunk.emitted.gather(2, steps).permute(1, 2, 0)  # (B, K, T')
        base = torch.tensor([st.frames for st in states], device=self.device)[:, None]
        frames = (chunk.frame + base)[:, None, :].expand_as(paths)  # padding steps (frame -1) emit nothing
        old = roots[:, :, None]
        tokens = _pad_cat([st.tokens for st in states])
        old_frames = _pad_cat([st.token_frames for st in states])
        tokens, token_frames, _ = pack_emissions(
            torch.cat([tokens.gather(1, old.expand_as(tokens)), paths], 2),
            torch.cat([old_frames.gather(1, old.expand_as(old_frames)), frames], 2))
        rows = chunk.rows
        for b, st in enumerate(states):
            own = torch.arange(b * beam, (b + 1) * beam, device=self.device)
            st.rows = BeamRows(rows.st[b:b + 1], rows.ints[b:b + 1],
                               {name: index_rows(tree, own) for name, tree in rows.states.items()})
            st.tokens, st.token_frames = tokens[b:b + 1], token_frames[b:b + 1]
            st.offset = st.offset + chunk.offset[b].double()

    def _totals(self, states: Sequence[StreamingCtcState]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, K) running total and CTC scores of every hypothesis (no end-of-sentence scores)."""
        st = torch.cat([s.rows.st for s in states])[:, :, :self.beam]  # (B, 4, K)
        ctc = st[:, 2] + torch.cat([s.offset for s in states]).to(self.dtype)[:, None]
        return ctc + st[:, 3], ctc

    def _ends(self, states: Sequence[StreamingCtcState]) -> torch.Tensor:
        """(B, K) the weighted end-of-sentence scores of every hypothesis."""
        ends = torch.zeros((len(states), self.beam), dtype=self.dtype, device=self.device)
        for group in self._groups(states):
            rows = self._stack([states[b] for b in group])
            for name, sc in self.scorers.items():
                end = sc.final_score(rows.states[name]).to(self.dtype).view(len(group), self.beam)
                ends[group] += self.weights[name] * end  # weighted in the search's dtype, as offline
        return ends

    def _select(self, states: Sequence[StreamingCtcState], order: torch.Tensor, total: torch.Tensor,
                ctc: torch.Tensor) -> NBest:
        """The hypotheses ``order`` (B, N) of each stream, best first, as an :class:`NBest`."""
        dead = total == NEG_INF
        at = order[:, :, None]
        tokens = _pad_cat([s.tokens for s in states])
        frames = _pad_cat([s.token_frames for s in states])
        tokens = tokens.gather(1, at.expand(-1, -1, tokens.shape[2])).masked_fill(dead[:, :, None], -1)
        frames = frames.gather(1, at.expand(-1, -1, frames.shape[2]))
        tokens, frames, lengths = pack_emissions(tokens, frames)
        return NBest(tokens, lengths, total, ctc.gather(1, order).masked_fill(dead, NEG_INF), frames)

    def partial(self, states: Sequence[StreamingCtcState]) -> List[Hypothesis]:
        """Each stream's best prefix so far, by its running score (no end-of-sentence score): tokens, their
        frames (since the state was created), score and CTC score."""
        self._check_states(states)
        if not states:
            return []
        if self.native:
            return native_loop.stream_nbest([st.native for st in states], 1, final=False).best()
        with search_threads(self.device):
            total, ctc = self._totals(states)
            best, order = total.max(1, keepdim=True)
            return self._select(states, order, best, ctc).best()

    def blank_run(self, states: Sequence[StreamingCtcState]) -> List[int]:
        """Per stream, the trailing blank frames of the best path (frames whose most likely class is the blank,
        since the last that was not): the trailing silence endpointing rules read (as WeNet's and sherpa's).
        Not the frames since the best prefix's last token: a prefix search dates a token by the frame its
        hypothesis entered the beam, which can be well before the token's peak."""
        self._check_states(states)
        return [st.blank_frames for st in states]

    def finish(self, states: Sequence[StreamingCtcState]) -> NBest:
        """The (B, nbest) N-best of the streams, end-of-sentence scores added (as the offline search ends an
        utterance). The states are left as they were; an endpoint starts the next utterance with new_state()."""
        self._check_states(states)
        if not states:
            raise ValueError("finish: no stream states given")
        if self.native:
            return native_loop.stream_nbest([st.native for st in states], self.nbest, final=True)
        with search_threads(self.device):
            total, ctc = self._totals(states)
            total, order = (total + self._ends(states)).topk(self.nbest)
            return self._select(states, order, total, ctc)
