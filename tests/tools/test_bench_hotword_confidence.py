"""tools/bench/bench_hotword_confidence.py: its confidences against direct references (the benchmark itself
needs the demo model and a names set: not a test)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from asrkit.search.hotwords import hotword_scorer
from tests.tool_loader import load_tool

bench = load_tool("bench/bench_hotword_confidence")
TOKENS = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "N"]


def _brute_logp(log_probs: torch.Tensor, tokens) -> float:
    """log of the summed probability of every frame path that collapses (repeats merged, blanks 0 dropped) to
    ``tokens``."""
    total = 0.0
    for path in itertools.product(range(log_probs.shape[1]), repeat=log_probs.shape[0]):
        collapsed = [t for k, t in enumerate(path) if t != 0 and (k == 0 or t != path[k - 1])]
        if collapsed == list(tokens):
            total += math.exp(sum(float(log_probs[k, t]) for k, t in enumerate(path)))
    return math.log(total) if total else float("-inf")


@pytest.mark.parametrize("tokens", [[1], [1, 2], [2, 2], [1, 2, 1], []])
def test_frame_confidence_is_the_alignments_against_the_best_path(tokens) -> None:
    log_probs = torch.randn(5, 3, generator=torch.Generator().manual_seed(len(tokens))).log_softmax(-1)
    best = float(log_probs.max(-1).values.sum())
    assert bench.path_logp(log_probs, tokens) == pytest.approx(_brute_logp(log_probs, tokens), abs=1e-4)
    assert bench.frame_confidence(log_probs, tokens) == pytest.approx((_brute_logp(log_probs, tokens) - best) / 5,
                                                                       abs=1e-4)


def test_the_best_path_itself_is_fully_confident_only_when_it_is_the_only_path() -> None:
    log_probs = torch.full((3, 3), -30.0)
    log_probs[:, 1] = 0.0  # every frame says token 1: one path, "1"
    assert bench.frame_confidence(log_probs.log_softmax(-1), [1]) == pytest.approx(0.0, abs=1e-6)
    assert bench.frame_confidence(log_probs.log_softmax(-1), [2]) < -5


def test_words_of_splits_at_word_marks() -> None:
    ids = [3, 4, 5, 3, 6, 4]  # ▁AB▁NA
    assert bench.words_of(ids, TOKENS) == [("AB", 0, 3), ("NA", 3, 6)]
    pieces = ["<blank>", "\u2581AB", "C", "\u2581D"]
    assert bench.words_of([1, 2, 3], pieces) == [("ABC", 0, 2), ("D", 2, 3)]
    assert bench.words_of([2, 3], pieces) == [("C", 0, 1), ("D", 1, 2)]


def test_hotword_bonus_is_what_a_finished_hypothesis_earns() -> None:
    index = {t: i for i, t in enumerate(TOKENS)}
    scorer = hotword_scorer(["NAB"], lambda text: [index[c] for c in text], TOKENS)
    spell = [3, 6, 4, 5]  # ▁NAB: three bonus-carrying tokens, weight 1
    assert bench.hotword_bonus(scorer, [3, 4] + spell) == pytest.approx(3.0)
    assert bench.hotword_bonus(scorer, [3, 6, 4]) == pytest.approx(0.0)  # a partial match is taken back
    assert bench.hotword_bonus(scorer, spell + spell) == pytest.approx(6.0)


def test_sweep_rows_start_without_rejection_then_the_deciles() -> None:
    refs = {"a": "I SAW ZED", "b": "I SAW KAY"}
    seen = []

    def output(cut):
        seen.append(cut)
        return {"a": "I SAW ZED", "b": "I SAW KAY" if cut is None else "I SAW"}

    rows = bench.sweep(refs, {"ZED", "KAY"}, [0.5, -1.0], output)
    assert seen == [None, -1.0, 0.5]
    assert rows[0] == "| none | 100.0 | 0.0 | 0.00 |" and rows[1] == "| -1 | 50.0 | 0.0 | 0.00 |"
