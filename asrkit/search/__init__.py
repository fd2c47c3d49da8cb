"""Batch-first decoding: greedy and prefix beam search over CTC outputs, fused scorers.

Imports torch only; models and LMs meet :class:`BatchScorer` structurally.
"""
from asrkit.search.ctc_prefix import ctc_prefix_beam_search
from asrkit.search.greedy import ctc_greedy_search, greedy_search
from asrkit.search.hypotheses import Hypothesis, NBest
from asrkit.search.interfaces import BatchScorer
from asrkit.search.scorers import LengthBonus

__all__ = [
    "BatchScorer",
    "Hypothesis",
    "LengthBonus",
    "NBest",
    "ctc_greedy_search",
    "ctc_prefix_beam_search",
    "greedy_search",
]
