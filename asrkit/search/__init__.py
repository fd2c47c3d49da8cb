"""Batch-first decoding: greedy and prefix beam search over CTC outputs, label-synchronous
(joint CTC/attention) beam search, attention rescoring, fused scorers.

Imports torch only; models and LMs meet :class:`BatchScorer` structurally. :func:`decode_ctc` is the
checked entry point for library users (token list, special ids, numpy input).
"""
from asrkit.search.api import Decoded, decode_ctc
from asrkit.search.beam_search import beam_search, joint_beam_search
from asrkit.search.ctc_prefix import ctc_prefix_beam_search
from asrkit.search.ctc_prefix_score import CTCPrefixScorer, CTCPrefixState
from asrkit.search.greedy import ctc_greedy_search, greedy_search
from asrkit.search.hotwords import HotwordScorer, HotwordUnion, hotword_scorer, read_hotwords
from asrkit.search.hypotheses import Hypothesis, NBest
from asrkit.search.interfaces import BatchScorer, NativeScorer
from asrkit.search.lexicon import LexiconScorer, read_word_list
from asrkit.search.rescore import attention_rescore
from asrkit.search.scorers import DecoderScorer, DecoderScorerState, LengthBonus, StepDecoder, WordCount

__all__ = [
    "BatchScorer",
    "CTCPrefixScorer",
    "CTCPrefixState",
    "DecoderScorer",
    "DecoderScorerState",
    "Decoded",
    "HotwordScorer",
    "HotwordUnion",
    "Hypothesis",
    "LengthBonus",
    "LexiconScorer",
    "NBest",
    "NativeScorer",
    "StepDecoder",
    "WordCount",
    "attention_rescore",
    "beam_search",
    "ctc_greedy_search",
    "ctc_prefix_beam_search",
    "decode_ctc",
    "greedy_search",
    "hotword_scorer",
    "joint_beam_search",
    "read_hotwords",
    "read_word_list",
]
