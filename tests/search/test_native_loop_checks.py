"""asrkit.search.native_loop's own decisions, against references written here: why it refuses a search,
the per-batch setup it hands the C++ loop (compacted frames, skipped-blank sums, candidate tables), which
vocabularies pick their candidates in C++, the checks on scorer tables, and the thread setting it restores.

The search results themselves are compared with the torch loop in test_native_prefix.py.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import pytest
import torch

from asrkit.search import ctc_prefix_beam_search, native_build, native_loop
from test_native_prefix import PlainScorer, peaky_log_probs

needs_library = pytest.mark.skipif(native_build.load() is None, reason="no C++ compiler: the native loop cannot build")


class FormScorer(PlainScorer):
    """A scorer whose native form is whatever the test gives (tables of a 1-token dense token n-gram by default)."""

    def __init__(self, form) -> None:
        self.form = form

    def native_form(self):
        return self.form


def token_ngram_form(vocab: int, logp_dtype: torch.dtype = torch.float32) -> Tuple[str, Dict[str, torch.Tensor]]:
    """A one-state dense token 'n-gram' that gives every token -0.5 and end of sentence -1."""
    return "token_ngram", {"logp": torch.full((1, vocab), -0.5, dtype=logp_dtype),
                           "next_state": torch.zeros((1, vocab), dtype=torch.int32),
                           "eos": torch.full((1,), -1.0), "vocab": torch.tensor(vocab), "start_state": torch.tensor(0)}


def ref_frames(lp: torch.Tensor, lengths: torch.Tensor, skip: Optional[float]):
    """Per utterance: the kept frames and the sum of the skipped frames' log P(blank), by a plain loop."""
    kept, offsets = [], []
    for b in range(lp.shape[0]):
        keep, off = [], 0.0
        for t in range(int(lengths[b])):
            if skip is not None and float(lp[b, t, 0]) > math.log(skip):
                off += float(lp[b, t, 0])
            else:
                keep.append(t)
        kept.append(keep)
        offsets.append(off)
    return kept, offsets


@pytest.mark.parametrize("vocab,topk,skip,lens", [
    (7, 3, 0.9, (30, 17, 0)), (7, 3, None, (30, 17, 0)), (400, 8, 0.9, (30, 17, 0)), (400, 8, None, (30, 17, 0)),
    (400, 8, None, (20, 17, 0)), (400, 8, None, (1, 0, 0)), (400, None, 0.9, (30, 17, 0)), (40, 8, 0.5, (30, 17, 0))])
def test_frames_are_compacted_with_skipped_blanks_summed_and_candidates_the_best_tokens(
        vocab: int, topk: Optional[int], skip: Optional[float], lens: Tuple[int, int, int]) -> None:
    # Catches: a wrong compaction (frame order, the -1 padding, the width), a skipped frame counted twice or
    # lost from the offset, the length mask, and candidate tables that are not each kept frame's best tokens
    # (also where the table cannot be read in input order: utterances shorter than T, a single frame).
    lp = peaky_log_probs(3, 30, vocab, seed=vocab, dtype=torch.float32)
    lengths = torch.tensor(lens)
    frame, cval, ctok, offset, n_cand = native_loop._frames(lp, lengths, topk, skip)
    kept, offsets = ref_frames(lp, lengths, skip)
    width = max(len(k) for k in kept)
    assert frame.shape == (3, width) and frame.dtype == torch.long
    for b in range(3):
        assert frame[b].tolist() == kept[b] + [-1] * (width - len(kept[b]))
    torch.testing.assert_close(offset, torch.tensor(offsets, dtype=torch.float32), rtol=1e-6, atol=1e-4)
    assert n_cand == (vocab - 1 if topk is None else topk)
    if topk is None or native_loop._selects_natively(vocab, n_cand):
        assert cval is None and ctok is None  # the C++ loop reads the rows itself
        return
    cval, ctok = cval.view(3, width, n_cand), ctok.view(3, width, n_cand)
    for b in range(3):
        for j, t in enumerate(kept[b]):
            want = lp[b, t, 1:].topk(n_cand)
            assert sorted(ctok[b, j].tolist()) == sorted((want.indices + 1).tolist())
            torch.testing.assert_close(cval[b, j].sort(descending=True).values, want.values)


def test_no_skippable_frame_keeps_every_frame_and_a_zero_offset() -> None:
    # Catches: the skip switched on when no frame qualifies (it must then cost nothing and change nothing).
    lp = torch.full((2, 5, 4), math.log(0.25))
    frame, _, _, offset, n_cand = native_loop._frames(lp, torch.tensor([5, 3]), 2, 0.999)
    assert frame.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, -1, -1]]
    assert offset.tolist() == [0.0, 0.0] and n_cand == 2


def test_topk_is_clamped_to_the_non_blank_tokens() -> None:
    lp = peaky_log_probs(1, 6, 5, seed=2, dtype=torch.float32)
    assert native_loop._frames(lp, torch.tensor([6]), 0, None)[4] == 1
    assert native_loop._frames(lp, torch.tensor([6]), 99, None)[4] == 4


@pytest.mark.parametrize("vocab,n_cand,native", [
    (31, 8, True), (319, 8, True), (320, 8, True), (324, 8, False), (323, 8, True), (500, 8, False),
    (5000, 8, False), (500, 20, True), (441, 20, True), (30, 29, False), (31, 29, True), (2, 1, False),
    (319, 1, True), (320, 1, False)])
def test_which_vocabularies_pick_their_candidates_in_cpp(vocab: int, n_cand: int, native: bool) -> None:
    # The documented policy: C++ picks the candidates below 320 tokens, or where (C + 1)^2 * 4 > V (the
    # crossing search of top_tokens would not save anything); never when every token is a candidate.
    assert native_loop._selects_natively(vocab, n_cand) is native


def test_reasons_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    lp = peaky_log_probs(2, 8, 6, seed=4, dtype=torch.float32)
    lengths = torch.tensor([8, 5])
    assert native_loop.unavailable(lp.to("meta"), lengths, {}) == \
        "log_probs is on meta, the native search runs on the CPU only"
    assert native_loop.unavailable(lp, lengths.to("meta"), {}) == "lengths is on meta, the native search runs on the CPU only"
    assert native_loop.unavailable(lp.requires_grad_(), lengths, {}) == \
        "log_probs requires grad (the native search records no autograd graph)"
    with torch.no_grad():  # no graph is recorded: the native loop may run
        assert native_loop.unavailable(lp, lengths, {}) in (None, f"the native library is unavailable: "
                                                                 f"{native_build.build_error()}")
    lp = lp.detach()
    why = native_loop.unavailable(lp, lengths, {"x": FormScorer(("fst", {}))})
    assert why == "scorer 'x': unknown native kind 'fst'"
    why = native_loop.unavailable(lp, lengths, {"x": FormScorer(None)})
    assert why == "scorer 'x' (FormScorer) has no native form in this configuration"
    for value in ("0", " 0 "):
        monkeypatch.setenv("ASRKIT_NATIVE", value)
        assert native_loop.unavailable(lp, lengths, {}) == "turned off by ASRKIT_NATIVE=0"
    monkeypatch.setenv("ASRKIT_NATIVE", "1")
    if native_build.load() is not None:
        assert native_loop.unavailable(lp, lengths, {}) is None


@needs_library
def test_a_table_of_the_wrong_dtype_is_named_and_the_thread_count_restored() -> None:
    # Catches: tables converted silently (the C++ loop reads raw memory: a float64 table read as float32 is
    # garbage), and a failure that leaves torch on one thread.
    lp = peaky_log_probs(2, 12, 6, seed=6, dtype=torch.float32)
    bad = FormScorer(token_ngram_form(6, torch.float64))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(TypeError, match=r"scorer 'lm' \(token_ngram\): table 'logp' is torch.float64 on cpu, "
                                            r"the native search needs torch.float32 on the CPU"):
            ctc_prefix_beam_search(lp, torch.tensor([12, 9]), beam=3, scorers={"lm": bad}, weights={"lm": 1.0},
                                   native=True)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


@needs_library
def test_a_constant_token_lm_adds_its_score_per_token_and_at_the_end() -> None:
    # An independent check of the scorer description (weight, tables, integer parameters): a one-state LM
    # giving -0.5 a token and -1 at the end adds weight * (-0.5 * #tokens - 1) to the CTC score.
    lp = peaky_log_probs(3, 20, 6, seed=8, dtype=torch.float64)
    lengths = torch.tensor([20, 11, 0])
    got = ctc_prefix_beam_search(lp, lengths, beam=4, nbest=4, scorers={"lm": FormScorer(token_ngram_form(6))},
                                 weights={"lm": 0.7}, token_min_logp=None, native=True)
    for b, hyps in enumerate(got.to_lists()):
        for h in hyps:
            assert h.score == pytest.approx(h.ctc_score + 0.7 * (-0.5 * len(h.tokens) - 1.0), abs=1e-5)
    assert got.to_lists()[2][0].tokens == [] and got.to_lists()[2][0].ctc_score == pytest.approx(0.0)


@needs_library
def test_min_logp_none_is_no_floor_and_a_floor_drops_tokens() -> None:
    # token_min_logp=None must reach the C++ loop as no floor (-inf), not as 0 or a default.
    lp = torch.full((1, 6, 5), math.log(0.2), dtype=torch.float64)
    free = ctc_prefix_beam_search(lp, torch.tensor([6]), beam=4, nbest=4, token_min_logp=None, native=True)
    floor = ctc_prefix_beam_search(lp, torch.tensor([6]), beam=4, nbest=4, token_min_logp=-1.0, native=True)
    torch_free = ctc_prefix_beam_search(lp, torch.tensor([6]), beam=4, nbest=4, token_min_logp=None, native=False)
    assert any(h.tokens for h in free.to_lists()[0])
    assert floor.to_lists()[0] and all(not h.tokens for h in floor.to_lists()[0])
    torch.testing.assert_close(free.scores, torch_free.scores, rtol=0, atol=1e-9)


def test_frames_with_skips_in_one_utterance_only_read_the_compacted_rows() -> None:
    # Utterance 0 has no skippable frame and is as long as the batch, utterance 1 has skipped frames: the
    # width equals T although the rows are not the input's rows in order.
    gen = torch.Generator().manual_seed(3)
    lp = torch.randn(2, 10, 400, generator=gen).log_softmax(-1)  # flat rows: no blank above 0.9
    lp[1, 2:5] = torch.tensor([0.95] + [0.05 / 399] * 399).log()
    lengths = torch.tensor([10, 10])
    frame, cval, ctok, offset, n_cand = native_loop._frames(lp, lengths, 8, 0.9)
    assert frame.tolist() == [list(range(10)), [0, 1, 5, 6, 7, 8, 9, -1, -1, -1]]
    assert offset[1].item() == pytest.approx(3 * math.log(0.95), abs=1e-5) and offset[0].item() == 0.0
    ctok = ctok.view(2, 10, 8)
    for j, t in enumerate([0, 1, 5, 6, 7, 8, 9]):
        assert sorted(ctok[1, j].tolist()) == sorted((lp[1, t, 1:].topk(8).indices + 1).tolist())


def test_an_empty_batch_has_no_frames() -> None:
    frame, cval, ctok, offset, n_cand = native_loop._frames(torch.zeros(0, 5, 400), torch.zeros(0, dtype=torch.long),
                                                            8, 0.9)
    assert frame.shape == (0, 0) and offset.shape == (0,) and cval is None and ctok is None


def test_a_scorer_without_a_form_is_refused_when_described() -> None:
    with pytest.raises(ValueError, match="scorer 'x' has no native form"):
        native_loop._scorer_desc("x", FormScorer(None), 1.0, [])


def test_search_without_the_library_or_with_a_rejection_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    lp = peaky_log_probs(1, 6, 5, seed=1, dtype=torch.float32)
    args = (lp, torch.tensor([6]), 3, 1, {}, {}, 0.0, 8, None, None)
    monkeypatch.setattr(native_build, "load", lambda: None)
    monkeypatch.setattr(native_build, "build_error", lambda: "no compiler here")
    with pytest.raises(RuntimeError, match="^the native library is unavailable: no compiler here$"):
        native_loop.search(*args)

    class Rejecting:
        @staticmethod
        def asrkit_prefix_search(desc) -> int:
            return 2

    monkeypatch.setattr(native_build, "load", lambda: Rejecting())
    with pytest.raises(RuntimeError, match=r"^the native prefix search rejected its arguments \(code 2\)$"):
        native_loop.search(*args)


@needs_library
def test_the_setup_runs_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # The documented behaviour: the per-batch setup's small ops run on one intra-op thread (threads are for
    # the C++ loop's utterances), and the caller's setting comes back.
    seen = []
    real = native_loop._frames
    monkeypatch.setattr(native_loop, "_frames", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ctc_prefix_beam_search(peaky_log_probs(2, 10, 6, seed=2), torch.tensor([10, 7]), beam=3, native=True)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


@needs_library
def test_one_kept_frame_still_picks_the_best_tokens_in_cpp() -> None:
    # One frame: the C++ selection must still run (not the first C token ids).
    lp = torch.full((1, 1, 12), math.log(0.01), dtype=torch.float64)
    lp[0, 0, 9], lp[0, 0, 11], lp[0, 0, 0] = math.log(0.5), math.log(0.3), math.log(0.1)
    lp = lp.log_softmax(-1)
    got = ctc_prefix_beam_search(lp, torch.tensor([1]), beam=3, nbest=3, token_topk=2, native=True)
    want = ctc_prefix_beam_search(lp, torch.tensor([1]), beam=3, nbest=3, token_topk=2, native=False)
    assert [h.tokens for h in got.to_lists()[0]] == [[9], [11], []] == [h.tokens for h in want.to_lists()[0]]
