"""Connects a trained model (and an optional LM) to a search, as a :class:`~asrkit.config.DecodeConfig` says.

Modes (``decode.mode``):

* ``greedy``: best CTC path.
* ``ctc_prefix``: frame-synchronous CTC prefix beam search; an LM is fused as
  ``log P_ctc + lm_weight * log P_lm + length_bonus * #tokens``; with a word-unit n-gram the bonus is
  ``length_bonus * |W|``, one per word as the LM closes it (:class:`asrkit.search.WordCount`; Deep Speech's
  and ESPnet's ``beta * |W|``, not a power of the word count).
* ``attention``: label-synchronous beam search on the attention decoder (+ LM).
* ``joint``: the same with the CTC prefix score, ``(1 - ctc_weight) * att + ctc_weight * ctc`` (+ LM).
* ``rescore``: ``ctc_prefix`` N-best (beam ``beam``, LM included) rescored by the attention decoder,
  ``ctc_weight * ctc + (1 - ctc_weight) * att`` plus the N-best's LM and bonus part.

Everything a mode needs is checked when the :class:`Searcher` is built, so a bad combination
(``joint`` on a CTC-only model, a neural LM trained with another tokenizer, ...) fails before any
audio is read, with a message that names the setting.
"""
from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import asdict, replace
from typing import Any, Dict, Optional, Sequence

import torch
from torchaudio.functional import forced_align, merge_tokens

from asrkit.config import ConfigError, DecodeConfig
from asrkit.lm import UnitsError, ngram_scorer
from asrkit.lm.word_ngram import WordNgramScorer
from asrkit.lm.neural import NeuralLMScorer, load_neural_lm
from asrkit.models.asr import AsrModel
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder
from asrkit.search import (HotwordScorer, LexiconScorer, NBest, WordCount, attention_rescore, ctc_prefix_beam_search,
                           greedy_search, hotword_scorer, joint_beam_search, read_hotwords, read_word_list)
from asrkit.search.hotwords import HOTWORDS, PhraseSpec, as_phrases
from asrkit.text.tokenizer import Tokenizer

MODES = ("greedy", "ctc_prefix", "attention", "joint", "rescore")
_NEEDS_CTC = ("greedy", "ctc_prefix", "joint", "rescore")
_NEEDS_DECODER = ("attention", "joint", "rescore")
log = logging.getLogger("asrkit.pipeline")


def check_decode_config(cfg: DecodeConfig, model: Optional[AsrModel]) -> None:
    """Raise ConfigError naming the ``decode.*`` key that cannot work with this model (None: an exported
    model, CTC log-probs only)."""
    if cfg.mode not in MODES:
        raise ConfigError(f"decode.mode '{cfg.mode}' is unknown (choose from: {', '.join(MODES)})")
    for key, value in asdict(cfg).items():  # a NaN or infinite weight, bonus or offset empties every hypothesis
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"decode.{key} must be a finite number, got {value}")
    if model is None and cfg.mode not in ("greedy", "ctc_prefix"):
        raise ConfigError(f"decode.mode '{cfg.mode}' needs the attention decoder, which an exported model does not "
                          f"have (it ends at the CTC head): use greedy or ctc_prefix")
    if model is not None and cfg.mode in _NEEDS_CTC and model.ctc is None:
        raise ConfigError(f"decode.mode '{cfg.mode}' needs a CTC head; this model has none (it was trained with "
                          f"model.ctc_weight 0: use decode.mode: attention)")
    if model is not None and cfg.mode in _NEEDS_DECODER and model.decoder is None:
        raise ConfigError(f"decode.mode '{cfg.mode}' needs an attention decoder; this model has none "
                          f"(use greedy or ctc_prefix)")
    if cfg.beam < 1:
        raise ConfigError(f"decode.beam must be >= 1, got {cfg.beam}")
    if not 1 <= cfg.nbest <= cfg.beam:
        raise ConfigError(f"decode.nbest must be in [1, decode.beam={cfg.beam}], got {cfg.nbest}")
    if cfg.mode == "greedy" and cfg.nbest != 1:
        raise ConfigError("decode.nbest > 1 needs a beam search (decode.mode is greedy)")
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise ConfigError(f"decode.batch_size must be >= 1 or null (sized by the device), got {cfg.batch_size}")
    if not 0.0 < cfg.gpu_memory_fraction <= 1.0:
        raise ConfigError(f"decode.gpu_memory_fraction must be in (0, 1], got {cfg.gpu_memory_fraction}")
    if cfg.token_topk is not None and cfg.token_topk < 1:
        raise ConfigError(f"decode.token_topk must be >= 1 or null (no pruning), got {cfg.token_topk}")
    if cfg.blank_skip_threshold is not None and not 0.0 < cfg.blank_skip_threshold < 1.0:
        raise ConfigError(f"decode.blank_skip_threshold must be in (0, 1) or null, got {cfg.blank_skip_threshold}")
    if not 0.0 <= cfg.ctc_weight <= 1.0:
        raise ConfigError(f"decode.ctc_weight must be in [0, 1], got {cfg.ctc_weight}")
    if cfg.lm_units not in ("token", "word"):
        raise ConfigError(f"decode.lm_units must be 'token' or 'word', got '{cfg.lm_units}'")
    if cfg.lm is not None and cfg.mode == "greedy":
        raise ConfigError("decode.lm is set but decode.mode is greedy (LM fusion needs a beam search)")
    if cfg.pre_beam < 0 or cfg.max_len_ratio <= 0:
        raise ConfigError("decode.pre_beam must be >= 0 and decode.max_len_ratio > 0")
    if (cfg.length_penalty or cfg.lm_full) and cfg.mode not in ("attention", "joint"):
        raise ConfigError(f"decode.length_penalty and decode.lm_full apply to the label-synchronous search "
                          f"(mode attention or joint), not to mode {cfg.mode}")
    if cfg.lm_full and cfg.lm is None:
        raise ConfigError("decode.lm_full is set but decode.lm is not")
    if cfg.lexicon is not None and cfg.mode == "greedy":
        raise ConfigError("decode.lexicon is set but decode.mode is greedy (the lexicon constrains a beam search)")
    if cfg.lexicon is not None and not os.path.isfile(cfg.lexicon):
        raise ConfigError(f"decode.lexicon {cfg.lexicon}: no such file")
    if cfg.hotwords is not None and cfg.mode == "greedy":
        raise ConfigError("decode.hotwords is set but decode.mode is greedy (hotwords bias a beam search)")
    if cfg.hotwords is not None and not os.path.isfile(cfg.hotwords):
        raise ConfigError(f"decode.hotwords {cfg.hotwords}: no such file")
    if cfg.hotword_weight < 0:
        raise ConfigError(f"decode.hotword_weight must be >= 0 (0: off), got {cfg.hotword_weight}")
    if cfg.lm_word_boundary is not None and cfg.lm_units != "word":
        raise ConfigError("decode.lm_word_boundary applies to a word LM (decode.lm_units: word)")
    if cfg.attention_window < 0:
        raise ConfigError(f"decode.attention_window must be >= 0, got {cfg.attention_window}")
    if cfg.attention_window and (model is None or not isinstance(model.decoder, LSTMAttentionDecoder)):
        raise ConfigError("decode.attention_window needs a location-aware attention decoder "
                          "(model.decoder.kind lstm_location)")


def _word_list(cfg: DecodeConfig) -> Optional[list]:
    return read_word_list(cfg.lexicon) if cfg.lexicon is not None else None


def load_lm_scorer(cfg: DecodeConfig, tokenizer: Tokenizer, device: torch.device) -> Any:
    """The LM named by ``decode.lm``: a neural LM dir (``asrkit train-lm``) or an ARPA file (a word ARPA
    carries ``decode.lexicon``'s constraint in its own letter trie)."""
    path = cfg.lm
    if path is None:
        return None
    if os.path.isdir(path):
        lm, lm_tokenizer = load_neural_lm(path, device=device)
        if list(lm_tokenizer.token_list) != list(tokenizer.token_list):
            raise ConfigError(f"decode.lm {path}: the LM was trained with another tokenizer than the ASR model "
                              f"({lm_tokenizer.vocab_size} vs {tokenizer.vocab_size} tokens, or a different order)")
        return NeuralLMScorer(lm)
    if not os.path.isfile(path):
        raise ConfigError(f"decode.lm {path}: no such file or directory")
    word = cfg.lm_units == "word"
    try:
        return ngram_scorer(path, tokenizer.token_list, units=cfg.lm_units, device=device, lookahead=cfg.lm_lookahead,
                            unk_offset=cfg.lm_unk_offset, blank_id=tokenizer.blank_id, unk_id=tokenizer.unk_id,
                            sos_eos_id=tokenizer.sos_eos_id, word_boundary=cfg.lm_word_boundary if word else None,
                            lexicon=_word_list(cfg) if word else None)
    except UnitsError as exc:
        raise ConfigError(f"decode.lm {path}: {exc.what}, but decode.lm_units is '{cfg.lm_units}': set "
                          f"decode.lm_units: {exc.units}") from None
    except ValueError as exc:
        raise ConfigError(f"decode.lm {path}: {exc}") from None


def load_hotwords(cfg: DecodeConfig, tokenizer: Tokenizer, extra: Optional[Sequence[PhraseSpec]] = None
                  ) -> Optional[HotwordScorer]:
    """The hotword scorer of ``decode.hotwords`` (a file) and ``extra`` phrases (the Python API's list), spelled
    with the model's tokenizer; phrases it cannot spell are logged with their line and skipped."""
    if cfg.hotwords is None and extra is None:
        return None
    if cfg.mode == "greedy":
        raise ConfigError("hotwords bias a beam search, but decode.mode is greedy (use ctc_prefix, joint, ...)")
    try:
        phrases = read_hotwords(cfg.hotwords) if cfg.hotwords is not None else []
        if extra is not None:
            phrases += as_phrases(extra)
        return hotword_scorer(phrases, tokenizer.encode, tokenizer.token_list, unk_id=tokenizer.unk_id,
                              warn=log.warning)
    except ValueError as exc:
        where = f"decode.hotwords {cfg.hotwords}" if cfg.hotwords is not None else "hotwords"
        raise ConfigError(f"{where}: {exc}") from None


class Searcher:
    """``search(model, enc, enc_lens) -> NBest`` for one DecodeConfig; scorers that do not depend on the
    audio (the LM, the length bonus, the hotwords) are built once. ``hotwords``: phrases (or (phrase, weight
    factor) pairs) beside ``decode.hotwords``'s file."""

    def __init__(self, cfg: DecodeConfig, model: Optional[AsrModel], tokenizer: Tokenizer, device: torch.device,
                 hotwords: Optional[Sequence[PhraseSpec]] = None):
        check_decode_config(cfg, model)
        self.cfg, self.tokenizer = cfg, tokenizer
        self.hotwords = load_hotwords(cfg, tokenizer, hotwords)
        if cfg.attention_window:
            model.decoder.set_decoding_window(cfg.attention_window)
        self.lm = self._loaded_lm = load_lm_scorer(cfg, tokenizer, device)
        self.bonus: Optional[WordCount] = None
        self.lexicon: Optional[LexiconScorer] = None
        self._word_list: Optional[list] = None
        if isinstance(self.lm, WordNgramScorer):
            # With a word LM the bonus counts words, beta * |W|, each as the LM closes it.
            self.bonus = WordCount(*self.lm.word_marks())
        elif cfg.lexicon is not None:  # no word LM to carry the constraint: a scorer of its own
            self._word_list = _word_list(cfg)
        self._add_hotword_words()

    @property
    def bounds_words(self) -> bool:
        """Whether a word LM or ``decode.lexicon`` bounds the words this search can output (a hotword's words
        outside them join its lexicon, :meth:`with_hotwords`)."""
        return isinstance(self._loaded_lm, WordNgramScorer) or self._word_list is not None

    def with_hotwords(self, hotwords: Optional[Sequence[PhraseSpec]]) -> "Searcher":
        """The same search (sharing the loaded LM) with the phrases ``hotwords`` beside ``decode.hotwords``'s."""
        other = copy.copy(self)
        other.hotwords = load_hotwords(self.cfg, self.tokenizer, hotwords)
        other._add_hotword_words()
        return other

    def _add_hotword_words(self) -> None:
        """The hotwords' words outside ``decode.lexicon`` join it for this search: in a copy of the word LM's trie
        (cached by content; outside the LM they score as <unk> + ``lm_unk_offset`` or ``hotword_class_score``) or
        in this search's lexicon scorer. The loaded LM is left as it is."""
        extra = list(self.hotwords.words) if self.hotwords is not None else []
        if isinstance(self._loaded_lm, WordNgramScorer):
            self.lm = self._loaded_lm.with_words(extra, self.cfg.hotword_class_score)
        elif self._word_list is not None:
            try:
                self.lexicon = LexiconScorer(self._word_list + extra, self.tokenizer.token_list,
                                             blank_id=self.tokenizer.blank_id, sos_eos_id=self.tokenizer.sos_eos_id,
                                             unk_id=self.tokenizer.unk_id)
            except ValueError as exc:
                raise ConfigError(f"decode.lexicon {self.cfg.lexicon}: {exc}") from None

    def reweighted(self, lm_weight: float, length_bonus: float) -> "Searcher":
        """The same search (sharing the loaded LM) with other fusion weights."""
        other = copy.copy(self)
        other.cfg = replace(self.cfg, lm_weight=lm_weight, length_bonus=length_bonus)
        return other

    def fusion(self) -> tuple[Dict[str, Any], Dict[str, float]]:
        """LM and length-bonus scorers and weights shared by every beam search mode."""
        scorers: Dict[str, Any] = {}
        weights: Dict[str, float] = {}
        if self.lm is not None:
            scorers["lm"], weights["lm"] = self.lm, self.cfg.lm_weight
        if self.lexicon is not None:
            scorers["lexicon"], weights["lexicon"] = self.lexicon, 1.0
        if self.hotwords is not None:
            scorers[HOTWORDS], weights[HOTWORDS] = self.hotwords, self.cfg.hotword_weight
        if self.cfg.length_bonus:
            if self.bonus is not None:
                scorers["length_bonus"] = self.bonus
            weights["length_bonus"] = self.cfg.length_bonus
        return scorers, weights

    def _ctc_prefix(self, log_probs: torch.Tensor, lens: torch.Tensor, beam: int, nbest: int) -> NBest:
        c = self.cfg
        scorers, weights = self.fusion()
        return ctc_prefix_beam_search(log_probs, lens, beam=beam, nbest=nbest, scorers=scorers, weights=weights,
                                      token_topk=c.token_topk, token_min_logp=c.token_min_logp,
                                      blank_skip_threshold=c.blank_skip_threshold)

    def search(self, model: Optional[AsrModel], enc: Optional[torch.Tensor], enc_lens: torch.Tensor,
               log_probs: Optional[torch.Tensor] = None) -> NBest:
        """enc (B, T, D), enc_lens (B,) -> NBest (B, decode.nbest), best first. ``log_probs`` (B, T, V): the
        CTC head's output where the caller has it already (an exported model has only that: model and enc
        None)."""
        c = self.cfg
        if log_probs is None and c.mode in _NEEDS_CTC:
            log_probs = model.ctc_log_probs(enc)
        if c.mode == "greedy":
            return greedy_search(log_probs, enc_lens)
        if c.mode == "ctc_prefix":
            return self._ctc_prefix(log_probs, enc_lens, c.beam, c.nbest)
        if c.mode == "rescore":
            nbest = self._ctc_prefix(log_probs, enc_lens, c.beam, c.beam)

            def score_fn(utts: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
                return model.score_tokens(enc[utts], enc_lens[utts], tokens, lengths)

            return attention_rescore(nbest, score_fn, c.ctc_weight).top(c.nbest)
        scorers, weights = self.fusion()
        if log_probs is None and model.ctc is not None:
            log_probs = model.ctc_log_probs(enc)
        joint = c.mode == "joint"
        nbest = joint_beam_search(model, enc, enc_lens, log_probs if joint else None,
                                  ctc_weight=c.ctc_weight if joint else 0.0, beam=c.beam, nbest=c.nbest,
                                  max_len_ratio=c.max_len_ratio, pre_beam=c.pre_beam or None, scorers=scorers,
                                  weights=weights, length_penalty=c.length_penalty,
                                  full_scorers=("lm",) if c.lm_full and "lm" in scorers else ())
        return nbest if log_probs is None else ctc_token_frames(nbest, log_probs, enc_lens)


def ctc_token_frames(nbest: NBest, log_probs: torch.Tensor, lengths: torch.Tensor) -> NBest:
    """Emission frames for hypotheses of a label-synchronous search, by CTC forced alignment.

    The attention decoder has no notion of time; where the model has a CTC head, each hypothesis is
    aligned to the CTC posteriors (torchaudio's forced_align, one hypothesis at a time: this runs once
    per utterance after the search) and a token's frame is the first frame of its span. Hypotheses
    that cannot be aligned (more tokens than frames allow) keep -1.
    """
    frames = nbest.token_frames.clone()
    tokens, counts = nbest.tokens.cpu(), nbest.lengths.cpu().tolist()
    alive = (nbest.scores > float("-inf")).cpu().tolist()
    lp, lengths = log_probs.float().cpu(), lengths.cpu().tolist()
    for b in range(nbest.batch_size):
        for n in range(nbest.nbest):
            count = counts[b][n]
            if not alive[b][n] or count == 0:
                continue
            target = tokens[b, n, :count][None]
            try:
                path, scores = forced_align(lp[b:b + 1, : lengths[b]], target, blank=0)
            except RuntimeError:  # too few frames for these tokens
                continue
            spans = merge_tokens(path[0], scores[0], blank=0)
            frames[b, n, :count] = torch.tensor([span.start for span in spans], device=frames.device)
    return replace(nbest, token_frames=frames)
