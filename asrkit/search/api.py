"""``decode_ctc``: CTC prefix beam search behind checked inputs, for library users.

A pyctcdecode user switches in three lines::

    from asrkit.search import decode_ctc
    hyps = decode_ctc(log_probs, lengths, tokens, beam=10)   # log_probs: (B, T, V) torch / numpy / lists
    texts = [h[0].text for h in hyps]

``lm`` takes a scorer object (:class:`asrkit.search.BatchScorer`); an ARPA file becomes one with
``asrkit.lm.ngram_scorer(path, tokens, units="word" | "token")`` (search/ imports torch only, so the
loading lives in asrkit.lm). Everything the low-level :func:`ctc_prefix_beam_search` takes on trust is
checked here: the token list's length against V, the special ids against the token list (and
against the ids an LM scorer was built with), integer lengths, and that the input really holds
log-probabilities (not probabilities, not logits).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from asrkit.search.ctc_prefix import _checked_search
from asrkit.search.hotwords import (HOTWORDS, PhraseSpec, RowHotwords, hotword_scorer, is_per_row, per_row_scorer,
                                    spell_with_tokens)
from asrkit.search.interfaces import BatchScorer

BLANK_NAMES = ("<blank>", "<pad>", "<b>", "<eps>", "")
UNK_NAMES = ("<unk>", "<UNK>", "[UNK]")
EOS_NAMES = ("<sos/eos>", "</s>", "<eos>")
WORD_MARKS = ("\u2581", "|")  # sentencepiece's "▁" and wav2vec2's "|" print as spaces
_LOGSUMEXP_TOL = 1e-2  # |log sum exp(row)| above this: not normalised (fp16 inputs are off by ~1e-3)


@dataclass
class Decoded:
    """One hypothesis: its text, token ids (of the caller's token list), scores and emission frames."""

    text: str
    tokens: List[int]
    score: float  # CTC + weighted LM score (incl. end of sentence) + length bonus
    ctc_score: float  # log P_ctc(tokens | x), summed over alignments
    token_frames: List[int]


def _find(tokens: Sequence[str], given: Optional[int], names: Tuple[str, ...], what: str,
          required: bool) -> Optional[int]:
    """A special id: the given one, checked against the token list, or the token named like one."""
    vocab = len(tokens)
    named = [i for i, t in enumerate(tokens) if t in names]
    if given is None:
        if len(named) > 1:
            raise ValueError(f"{what}: the token list has several candidates {[(i, tokens[i]) for i in named]}; "
                             f"pass {what}= explicitly")
        if named:
            return named[0]
        if required:
            raise ValueError(f"{what}: no token named {list(names)} in the token list; pass {what}= explicitly")
        return None
    if isinstance(given, bool) or not isinstance(given, int):
        raise TypeError(f"{what} must be an int or None, got {type(given).__name__} {given!r}")
    if not 0 <= given < vocab:
        raise ValueError(f"{what}={given} is outside the token list (ids 0..{vocab - 1})")
    if named and given not in named:
        raise ValueError(f"{what}={given} is the token {tokens[given]!r}, but the token list has "
                         f"{tokens[named[0]]!r} at id {named[0]}")
    if not named and what != "blank_id" and len(tokens[given]) == 1:
        raise ValueError(f"{what}={given} is the token {tokens[given]!r}, an ordinary symbol; pass the id "
                         f"of the {what[:-3]} token, or None if there is none")
    return given


def special_ids(tokens: Sequence[str], blank_id: Optional[int] = None, unk_id: Optional[int] = None,
                eos_id: Optional[int] = None) -> Tuple[int, Optional[int], Optional[int]]:
    """(blank, unk, eos) ids checked against the token list; None finds them by name
    (blank: ``<blank>``, ``<pad>``, ``<b>``, ``<eps>`` or ``""``; unk: ``<unk>``; eos: ``<sos/eos>``, ``</s>``)."""
    blank = _find(tokens, blank_id, BLANK_NAMES, "blank_id", required=True)
    unk = _find(tokens, unk_id, UNK_NAMES, "unk_id", required=False)
    eos = _find(tokens, eos_id, EOS_NAMES, "eos_id", required=False)
    ids = [("blank_id", blank), ("unk_id", unk), ("eos_id", eos)]
    for a, (name_a, id_a) in enumerate(ids):
        for name_b, id_b in ids[a + 1:]:
            if id_a is not None and id_a == id_b:
                raise ValueError(f"{name_a} and {name_b} are both {id_a} ({tokens[id_a]!r})")
    assert blank is not None
    return blank, unk, eos


def _as_tensor(x: Any, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    try:
        return torch.as_tensor(x)  # numpy arrays (shared memory), nested lists
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{what} must be a torch tensor, a numpy array or a nested list of numbers "
                        f"({type(x).__name__}: {exc})") from exc


def check_log_probs(lp: torch.Tensor, lengths: torch.Tensor) -> None:
    """Raise ValueError unless lp (B, T, V) holds log-probabilities on every valid frame.

    One pass over the input (a per-frame max) finds NaN, +inf and positive values; the frames that
    show them tell probabilities (rows >= 0 summing to 1) from logits. Normalisation (log sum exp = 0) is
    checked on the first, middle and last valid frame of each utterance.
    """
    batch, frames, _ = lp.shape
    valid = torch.arange(frames, device=lp.device) < lengths[:, None]  # (B, T)
    top = lp.amax(-1).masked_fill(~valid, -math.inf)  # (B, T); NaN propagates into the max
    nan = torch.isnan(top).nonzero()
    if nan.shape[0]:
        b, t = (int(v) for v in nan[0])
        raise ValueError(f"utterance {b} (batch row {b}): log_probs contain NaN at frame {t}")
    bad = (top > 1e-6).nonzero()
    if bad.shape[0]:
        b, t = (int(v) for v in bad[0])
        row = lp[b, t].double()
        total = float(row.sum())
        if bool((row >= 0).all()) and abs(total - 1.0) < 1e-3:
            raise ValueError(f"utterance {b} (batch row {b}), frame {t}: log_probs look like probabilities "
                             f"(no negative value, the row sums to {total:.4f}); pass their log "
                             f"(or log_softmax of the logits)")
        raise ValueError(f"utterance {b} (batch row {b}), frame {t}: log_probs has a positive value "
                         f"({float(row.max()):.4g}); these look like logits: pass log_softmax(logits, -1)")
    n = lengths.clamp(min=1)
    picks = torch.stack([torch.zeros_like(n), (n - 1) // 2, n - 1], 1)  # (B, 3) frames checked
    has = lengths > 0
    rows = lp.gather(1, picks[..., None].expand(batch, 3, lp.shape[2])).double().logsumexp(-1)  # (B, 3)
    off = (rows.abs() > _LOGSUMEXP_TOL) & has[:, None]
    if bool(off.any()):
        b, j = (int(v) for v in off.nonzero()[0])
        raise ValueError(f"utterance {b} (batch row {b}), frame {int(picks[b, j])}: log_probs are not "
                         f"normalised (log sum exp = {float(rows[b, j]):.4g}, want 0); pass log_softmax(logits, -1)")


def _check_lm_ids(lm: Any, blank: int, unk: Optional[int], eos: Optional[int]) -> None:
    """An LM scorer that records its special ids must agree with the token list's."""
    for attr, mine, name in (("blank_id", blank, "blank_id"), ("unk_id", unk, "unk_id"), ("sos_eos_id", eos, "eos_id")):
        theirs = getattr(lm, attr, None)
        if theirs is not None and mine is not None and int(theirs) != mine:
            raise ValueError(f"the LM scorer was built with {attr}={theirs}, but {name} is {mine} here; "
                             f"build it with the same token list and ids")


def text_of(tokens: Sequence[str], ids: Sequence[int], skip: Sequence[int] = ()) -> str:
    """Token ids -> text: symbols joined, ``▁`` and ``|`` as spaces, whitespace collapsed."""
    out = "".join(tokens[i] for i in ids if i not in skip)
    for mark in WORD_MARKS:
        out = out.replace(mark, " ")
    return " ".join(out.split())


def decode_ctc(log_probs: Any, lengths: Any = None, tokens: Optional[Sequence[str]] = None, *,
               beam: int = 10, nbest: int = 1, lm: Optional[BatchScorer] = None, lm_weight: float = 0.5,
               length_bonus: float = 0.0, blank_id: Optional[int] = None, unk_id: Optional[int] = None,
               eos_id: Optional[int] = None, token_topk: Optional[int] = 8,
               token_min_logp: Optional[float] = -12.0, blank_skip_threshold: Optional[float] = 0.999,
               cuda_graph: Optional[bool] = None, native: Optional[bool] = None,
               hotwords: Union[None, Sequence[PhraseSpec], Sequence[RowHotwords]] = None,
               hotword_weight: float = 1.5) -> List[List[Decoded]]:
    """CTC prefix beam search with checked inputs; per utterance, up to `nbest` :class:`Decoded`, best first.

    log_probs: (B, T, V) or (T, V) log-probabilities (torch, numpy or nested lists; a (T, V) input is
    one utterance); lengths: (B,) valid frames (None: all T); tokens: the V symbols (required, its
    length must be V). ``blank_id``/``unk_id``/``eos_id``: None finds them by name (see
    :func:`special_ids`); given ids are checked against the token list, and against the ids of an
    ``lm`` scorer that records them. A hypothesis scores ``log P_ctc + lm_weight * log P_lm + length_bonus * n``
    for its n tokens. Pruning options and ``cuda_graph``: as :func:`ctc_prefix_beam_search`.
    ``native``: which frame loop runs, as :func:`ctc_prefix_beam_search`'s: None (default) the C++ loop
    where it can run (CPU inputs, every scorer with a native form, the library built), else the torch
    loop; True: the C++ loop or a ValueError saying why it cannot run; False: the torch loop.
    ``hotwords``: phrases (or (phrase, weight factor) pairs) the search is biased toward
    (:mod:`asrkit.search.hotwords`), spelled with the token list (longest tokens first, word-initial tokens
    after ``▁`` or ``|``); a hypothesis gains ``hotword_weight`` (x the factor) per token of a phrase it holds.
    A phrase the tokens cannot spell is skipped with a warning; none left is a ValueError. A list per
    utterance: ``hotwords=[[...], None, [...]]`` (one item per utterance, each a list of phrases or None for none):
    each utterance is searched with its own list, in the same batch (the lists joined into one automaton, each
    row kept in its own list's states), exactly as if it were decoded alone with it.
    """
    lp = _as_tensor(log_probs, "log_probs")
    if lp.dim() == 2:
        lp = lp[None]
    if lp.dim() != 3:
        raise ValueError(f"log_probs must be (batch, frames, vocab) or (frames, vocab), got shape {tuple(lp.shape)}")
    if not lp.is_floating_point():
        raise ValueError(f"log_probs must be floating point, got {lp.dtype}")
    batch, frames, vocab = lp.shape
    if lengths is None:
        lens = torch.full((batch,), frames, dtype=torch.long, device=lp.device)
    else:
        lens = _as_tensor(lengths, "lengths").to(lp.device)
        if lens.dim() == 0:
            lens = lens[None]
        if lens.is_floating_point():
            if not bool((lens == lens.round()).all()):
                raise ValueError(f"lengths must be whole numbers of frames, got {lens.tolist()}")
            lens = lens.long()
    if tokens is None:
        raise ValueError("tokens (the list of the V output symbols) is required")
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be a sequence of strings (one per output class)")
    if len(tokens) != vocab:
        raise ValueError(f"the token list has {len(tokens)} entries but log_probs has {vocab} classes (V); "
                         f"they must be equal")
    blank, unk, eos = special_ids(tokens, blank_id, unk_id, eos_id)
    if lens.dim() != 1 or lens.shape[0] != batch:
        raise ValueError(f"lengths must be ({batch},) for {batch} utterances, got shape {tuple(lens.shape)}")
    if lens.is_complex() or lens.dtype == torch.bool:
        raise ValueError(f"lengths must be integers, got {lens.dtype}")
    out_of_range = ((lens < 0) | (lens > frames)).nonzero().flatten().tolist()
    if out_of_range:
        b = out_of_range[0]
        raise ValueError(f"utterance {b} (batch row {b}): length {int(lens[b])} outside [0, {frames}] frames")
    check_log_probs(lp, lens)
    scorers, weights = {}, {}
    if lm is not None:
        if isinstance(lm, (str, bytes)) or hasattr(lm, "__fspath__"):
            raise TypeError(f"lm must be a scorer object; for an ARPA file use "
                            f"asrkit.lm.ngram_scorer({str(lm)!r}, tokens, units='word' or 'token')")
        if not isinstance(lm, BatchScorer):
            raise TypeError(f"lm must implement the BatchScorer protocol (init_state, score, select_state, "
                            f"final_score), got {type(lm).__name__}")
        _check_lm_ids(lm, blank, unk, eos)
        scorers, weights = {"lm": lm}, {"lm": float(lm_weight)}
    if length_bonus:
        weights["length_bonus"] = float(length_bonus)
    perm = None
    if blank != 0:  # the search takes the blank at id 0: move its column there (one copy)
        if lm is not None:
            raise ValueError(f"blank_id={blank}: an LM scorer needs the blank at id 0 (the search's ids); "
                             f"reorder the model's outputs or decode without lm")
        perm = torch.tensor([blank] + [i for i in range(vocab) if i != blank], device=lp.device)
        lp = lp.index_select(2, perm)
    if hotwords is not None:
        order = list(range(vocab)) if perm is None else perm.tolist()  # the search's ids
        search_tokens = [tokens[i] for i in order]
        spell, unk_at = spell_with_tokens(search_tokens), None if unk is None else order.index(unk)
        warn = lambda message: warnings.warn(message, stacklevel=3)  # noqa: E731
        if is_per_row(hotwords):
            if len(hotwords) != batch:
                raise ValueError(f"hotwords gives {len(hotwords)} lists for {batch} utterances: give one list "
                                 f"(or None) per utterance, or one list of phrases for all")
            scorer = per_row_scorer(hotwords, spell, search_tokens, unk_at, warn)  # type: ignore[arg-type]
        else:
            scorer = hotword_scorer(hotwords, spell, search_tokens, unk_id=unk_at, warn=warn)  # type: ignore[arg-type]
        if scorer is not None:
            scorers[HOTWORDS], weights[HOTWORDS] = scorer, float(hotword_weight)
    # The checks above cover ctc_prefix_beam_search's (NaN, +inf, lengths): no second pass over the input.
    found = _checked_search(lp, lens, beam, nbest, scorers, weights, token_topk, token_min_logp,
                            blank_skip_threshold, cuda_graph, native)
    back = perm.tolist() if perm is not None else None
    skip = [i for i in (eos,) if i is not None]
    results = []
    for hyps in found.to_lists():
        row = []
        for h in hyps:
            ids = [back[i] for i in h.tokens] if back is not None else list(h.tokens)
            row.append(Decoded(text_of(tokens, ids, skip), ids, h.score, h.ctc_score, list(h.token_frames)))
        results.append(row)
    return results
