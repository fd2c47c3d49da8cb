"""The search of live streams, as a :class:`~asrkit.config.DecodeConfig` says: the first pass that runs on every
chunk and the second pass that runs at each endpoint.

* ``greedy``: the best CTC path, carried across chunks (:class:`GreedyStreamSearch`); its final result is what
  :func:`asrkit.search.greedy_search` gives on the utterance's frames at once.
* ``ctc_prefix``: the resumable CTC prefix beam search (:class:`asrkit.search.streaming.StreamingCtcSearch`)
  with the same scorers the offline search fuses (LM, lexicon, hotwords, length bonus: ``Searcher.fusion``).
* ``rescore``: U2's two-pass decoding: the prefix search runs live with ``decode.beam`` hypotheses kept; at
  each endpoint its N-best (``decode.beam`` long) is rescored by the attention decoder over the utterance's
  encoder frames (:func:`asrkit.search.attention_rescore`, ``decode.ctc_weight``), as offline ``rescore`` does.

``attention`` and ``joint`` are label-synchronous: they need the whole utterance before their first token, so
they cannot stream (a ConfigError says so). Every search here has the same face: ``new_state()``,
``advance(states, log_probs, lengths)``, ``partial(states)``, ``blank_run(states)``, ``finish(states)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

import torch

from asrkit.config import ConfigError, DecodeConfig
from asrkit.search import Hypothesis, NBest, attention_rescore
from asrkit.search.greedy import collapse, trailing_blanks

STREAMING_MODES = ("greedy", "ctc_prefix", "rescore")


def check_streaming_mode(cfg: DecodeConfig) -> None:
    """Raise ConfigError for a decode mode that cannot stream."""
    if cfg.mode not in STREAMING_MODES:
        raise ConfigError(f"decode.mode '{cfg.mode}' cannot stream: a label-synchronous search needs the whole "
                          f"utterance before its first token (streaming takes {', '.join(STREAMING_MODES)}; "
                          f"rescore is the two-pass CTC prefix search + attention rescoring at each endpoint)")


@dataclass
class GreedyState:
    """One stream's best CTC path so far (tokens and the frames that emitted them, counted from the state's
    creation), its log-probability, the last frame's id and the trailing blank frames."""

    tokens: List[int] = field(default_factory=list)
    frames: List[int] = field(default_factory=list)
    score: float = 0.0
    last: int = -1
    seen: int = 0
    blank_run: int = 0


class GreedyStreamSearch:
    """Best-path CTC decoding carried across chunks: a token is emitted where the frame's best id is not blank
    and differs from the previous frame's, the previous frame of a chunk's first being the last of the chunk
    before (so chunks give what the whole utterance gives)."""

    def new_state(self) -> GreedyState:
        return GreedyState()

    def advance(self, states: Sequence[GreedyState], log_probs: torch.Tensor, lengths: torch.Tensor) -> None:
        """log_probs (B, T, V) the next frames of B streams, lengths (B,) valid frames of each row."""
        best, ids = log_probs.max(-1)  # (B, T) each
        best, ids, lengths = best.float().cpu(), ids.cpu(), lengths.cpu()
        tokens, counts, frames, valid = collapse(ids, lengths, previous=torch.tensor([st.last for st in states]))
        runs = trailing_blanks(ids, lengths, torch.tensor([st.blank_run for st in states])).tolist()
        scores = torch.where(valid, best, 0.0).sum(1).tolist()  # (B,) the path's log-probability in the chunk
        for b, (st, n, k) in enumerate(zip(states, lengths.tolist(), counts.tolist())):
            if n == 0:
                continue
            st.tokens += tokens[b, :k].tolist()
            st.frames += (frames[b, :k] + st.seen).tolist()
            st.score += scores[b]
            st.blank_run = runs[b]
            st.last, st.seen = int(ids[b, n - 1]), st.seen + n

    def partial(self, states: Sequence[GreedyState]) -> List[Hypothesis]:
        return [Hypothesis(list(st.tokens), st.score, st.score, list(st.frames)) for st in states]

    def blank_run(self, states: Sequence[GreedyState]) -> List[int]:
        return [st.blank_run for st in states]

    def finish(self, states: Sequence[GreedyState]) -> NBest:
        """(B, 1): the best path of each stream's utterance (ids, frames and lengths int64, scores float32:
        torch's defaults for Python ints and floats)."""
        width = max([len(st.tokens) for st in states] + [0])
        tokens = torch.full((len(states), 1, width), -1)  # (B, 1, L)
        frames = torch.full_like(tokens, -1)
        for b, st in enumerate(states):
            tokens[b, 0, : len(st.tokens)] = torch.tensor(st.tokens)
            frames[b, 0, : len(st.frames)] = torch.tensor(st.frames)
        lengths = torch.tensor([[len(st.tokens)] for st in states])  # (B, 1)
        scores = torch.tensor([[st.score] for st in states])  # (B, 1)
        return NBest(tokens=tokens, lengths=lengths, scores=scores, ctc_scores=scores.clone(), token_frames=frames)


def build_stream_search(cfg: DecodeConfig, fusion: Callable[[], tuple], device: torch.device | str = "cpu") -> Any:
    """The first-pass search of ``cfg.mode`` (see the module docstring); ``fusion()`` -> (scorers, weights),
    the Searcher's LM, lexicon, hotwords and bonus; ``device``: the model's, where the search states live (the
    C++ loop on the CPU, the torch loop elsewhere). ``rescore`` keeps ``cfg.beam`` hypotheses at each endpoint
    for the decoder, as offline."""
    check_streaming_mode(cfg)
    if cfg.mode == "greedy":
        return GreedyStreamSearch()
    from asrkit.search.streaming import StreamingCtcSearch

    scorers, weights = fusion()
    return StreamingCtcSearch(beam=cfg.beam, nbest=cfg.beam if cfg.mode == "rescore" else cfg.nbest, scorers=scorers,
                              weights=weights, token_topk=cfg.token_topk, token_min_logp=cfg.token_min_logp,
                              blank_skip_threshold=cfg.blank_skip_threshold, device=device)


ScoreTokens = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def second_pass(cfg: DecodeConfig, nbest: NBest, encodings: Sequence[torch.Tensor],
                score_tokens: Optional[ScoreTokens]) -> NBest:
    """The endpoint's final N-best (B, decode.nbest): ``rescore`` rescores the first pass's N-best with
    ``score_tokens(enc, enc_lens, tokens, token_lens)`` (the model's teacher-forced decoder score) over each
    utterance's encoder frames ``encodings[b]`` (T_b, D); the other modes keep it."""
    if cfg.mode != "rescore":
        return nbest
    if score_tokens is None:
        raise ConfigError("decode.mode 'rescore' needs an attention decoder; this model has none")
    lens = torch.tensor([e.shape[0] for e in encodings], device=encodings[0].device)  # (B,) int64
    enc = torch.nn.utils.rnn.pad_sequence(list(encodings), batch_first=True)  # (B, T_max, D)

    def score_fn(utts: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        utts = utts.to(enc.device)
        return score_tokens(enc[utts], lens[utts], tokens.to(enc.device), lengths.to(enc.device))

    return attention_rescore(nbest, score_fn, cfg.ctc_weight).top(cfg.nbest)
