"""The native (C++) prefix search resumed across chunks: asrkit.search.native_loop's StreamState API.

References: the offline native search (ctc_prefix_beam_search(native=True), itself equal to the torch loop in
test_native_prefix.py) for one advance over all frames; the same stream advanced in one piece for chunked
advances; each stream alone for streams batched at different positions; the Python scorers themselves for the
end-of-sentence scores a partial result leaves out.
"""
from __future__ import annotations

import ctypes
import gc
from typing import Dict, List, Sequence, Tuple

import pytest
import torch

from asrkit.lm import ngram_scorer
from asrkit.lm.ngram import NgramScorer, load_ngram
from asrkit.search import WordCount, ctc_prefix_beam_search, hotword_scorer, native_build, native_loop
from asrkit.search.hotwords import spell_with_tokens
from asrkit.search.hypotheses import Hypothesis, NBest
from asrkit.search.interfaces import active_scorers
from asrkit.search.lexicon import LexiconScorer
from test_native_prefix import CHARS, FIXTURES, LEXICON, MARK, PlainScorer, peaky_log_probs, spelled_log_probs

pytestmark = pytest.mark.skipif(native_build.load() is None, reason="no C++ compiler: the native loop cannot build")
EXACT = dict(topk=None, min_logp=None, skip=None)
DEFAULT = dict(topk=8, min_logp=-12.0, skip=0.999)
TIGHT = dict(topk=3, min_logp=-4.0, skip=0.9)
PRUNING = {"exact": EXACT, "default": DEFAULT, "tight": TIGHT}
TOL = 1e-5
ABC = ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"]  # the tokens of chars_2gram.arpa


def abc_lm() -> NgramScorer:
    return NgramScorer(load_ngram(FIXTURES / "chars_2gram.arpa"), ABC, dense=True)


def case_log_probs(case: str, batch: int, frames: int, seed: int) -> torch.Tensor:
    """Log-probs over CHARS spelling fixture words, or peaky ones over ABC for the token n-gram."""
    if case == "token_ngram":
        return peaky_log_probs(batch, frames, len(ABC), seed=seed, dtype=torch.float32)
    return spelled_log_probs(CHARS, batch, frames, seed=seed)


@pytest.fixture(scope="module")
def word_lm():
    return load_ngram(FIXTURES / "words_3gram.arpa")


def fusion(case: str, word_lm) -> Tuple[Dict[str, object], Dict[str, float]]:
    """(scorers, weights) of each scorer kind the native loop evaluates, over CHARS."""
    if case == "none":
        return {}, {}
    if case == "bonus":
        return {}, {"length_bonus": 0.8}
    if case == "token_ngram":  # over ABC (case_log_probs)
        return {"lm": abc_lm()}, {"lm": 0.7}
    if case == "word_lexicon":  # word n-gram with look-ahead and a lexicon, the word bonus beside it
        lm = ngram_scorer(word_lm, CHARS, units="word", lexicon=LEXICON, unk_offset=-5.0)
        return {"lm": lm, "length_bonus": WordCount(*lm.word_marks())}, {"lm": 0.8, "length_bonus": 0.6}
    if case == "lexicon":
        return {"lexicon": LexiconScorer(LEXICON, CHARS)}, {"lexicon": 1.0}
    if case == "hotwords":
        hot = hotword_scorer(["CAT", ("CAT SAT", 2.0), "AT", "DOG ON"], spell_with_tokens(CHARS), CHARS, unk_id=1)
        return {"hotwords": hot}, {"hotwords": 1.5, "length_bonus": 0.3}
    raise KeyError(case)


CASES = ["none", "bonus", "token_ngram", "word_lexicon", "lexicon", "hotwords"]


def new_states(n: int, beam: int, scorers, weights, dtype=torch.float32) -> List[native_loop.StreamState]:
    active, active_weights, bonus = active_scorers(scorers, weights)
    return [native_loop.StreamState(beam, active, active_weights, bonus, dtype) for _ in range(n)]


def advance_in_pieces(states: Sequence[native_loop.StreamState], lp: torch.Tensor, lengths: torch.Tensor,
                      sizes: Sequence[int], **pruning) -> None:
    """Feed every stream its frames in pieces of the given sizes (a stream past its end gets 0 frames)."""
    at = 0
    for size in sizes:
        n = (lengths - at).clamp(0, size)
        native_loop.stream_advance(states, lp[:, at:at + size], n, **pruning)
        at += size
    assert at >= int(lengths.max())


def assert_nbest_equal(got: NBest, want: NBest, tol: float = TOL) -> None:
    g, w = got.to_lists(), want.to_lists()
    assert len(g) == len(w)
    for b, (hg, hw) in enumerate(zip(g, w)):
        assert [h.tokens for h in hg] == [h.tokens for h in hw], f"stream {b}"
        assert [h.token_frames for h in hg] == [h.token_frames for h in hw], f"stream {b}"
        for x, y in zip(hg, hw):
            assert x.score == pytest.approx(y.score, abs=tol) and x.ctc_score == pytest.approx(y.ctc_score, abs=tol)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pruning", sorted(PRUNING))
def test_one_advance_then_final_nbest_is_the_offline_search(word_lm, case: str, pruning: str) -> None:
    scorers, weights = fusion(case, word_lm)
    lp = case_log_probs(case, 3, 50, seed=len(case) + len(pruning))
    lengths = torch.tensor([50, 0, 37], dtype=torch.int32)  # an empty stream too; int32 lengths are read as int64
    prune = PRUNING[pruning]
    want = ctc_prefix_beam_search(lp, lengths, beam=6, nbest=4, scorers=scorers, weights=weights, native=True,
                                  token_topk=prune["topk"], token_min_logp=prune["min_logp"],
                                  blank_skip_threshold=prune["skip"])
    states = new_states(3, 6, scorers, weights)
    native_loop.stream_advance(states, lp, lengths, **prune)
    got = native_loop.stream_nbest(states, 4, final=True)
    assert_nbest_equal(got, want)
    assert sum(len(h[0].tokens) for h in got.to_lists() if h) > 10
    assert [st.frames for st in states] == [50, 0, 37]


def test_defaults_are_the_offline_defaults() -> None:
    # no bonus, token_topk 8, token_min_logp -12, blank_skip_threshold 0.999: frames where the next value of each
    # gives another n-best (a wide beam keeps every prefix)
    lp = torch.full((1, 4, 12), -20.0)
    lp[0, :, 0] = 0.0
    lp[0, 0, 1:8] = torch.linspace(-5, -6, 7)
    lp[0, 0, 8] = -11.5  # kept above -12 only
    lp[0, 1, 10] = -5.3  # P(blank) 0.995: skipped above 0.99 only
    lp[0, 2, 1:10] = torch.linspace(-4, -4.5, 9)  # nine close tokens: the 9th is a candidate at token_topk 9 only
    lp = lp.log_softmax(-1)
    lengths = torch.tensor([4])
    want = ctc_prefix_beam_search(lp, lengths, beam=24, native=True)
    for kw in (dict(token_topk=9), dict(token_min_logp=-11.0), dict(blank_skip_threshold=0.99),
               dict(weights={"length_bonus": 1.0})):
        other = ctc_prefix_beam_search(lp, lengths, beam=24, native=True, **kw)
        assert not torch.equal(other.scores, want.scores), kw
    states = [native_loop.StreamState(24)]
    native_loop.stream_advance(states, lp, lengths)
    assert_nbest_equal(native_loop.stream_nbest(states, 24, final=True), want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_float64_states_search_in_float64(dtype: torch.dtype) -> None:
    lp = peaky_log_probs(2, 30, 9, seed=4, dtype=torch.float64)
    lengths = torch.tensor([30, 21])
    states = new_states(2, 5, {}, {}, dtype=dtype)
    native_loop.stream_advance(states, lp, lengths)
    got = native_loop.stream_nbest(states, 5, final=True)
    want = ctc_prefix_beam_search(lp.to(dtype), lengths, beam=5, native=True)
    assert got.scores.dtype == dtype
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.scores, want.scores)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("case", ["none", "word_lexicon", "token_ngram", "hotwords"])
@pytest.mark.parametrize("pruning", sorted(PRUNING))
def test_chunked_advances_equal_one_advance(word_lm, case: str, pruning: str) -> None:
    # irregular pieces, single frames among them; pruning acts per frame, so it does not care about the split
    scorers, weights = fusion(case, word_lm)
    lp = case_log_probs(case, 3, 60, seed=7 + len(case))
    lengths = torch.tensor([60, 44, 51])
    prune = PRUNING[pruning]
    whole = new_states(3, 8, scorers, weights)
    native_loop.stream_advance(whole, lp, lengths, **prune)
    pieces = new_states(3, 8, scorers, weights)
    advance_in_pieces(pieces, lp, lengths, [1, 7, 1, 1, 13, 2, 20, 1, 14], **prune)
    for final in (False, True):
        assert_nbest_equal(native_loop.stream_nbest(pieces, 8, final), native_loop.stream_nbest(whole, 8, final))


@pytest.mark.parametrize("vocab,topk", [(400, 8), (1200, 8), (400, 30)])
def test_large_vocabularies_chunked_equal_the_offline_search(vocab: int, topk: int) -> None:
    # V >= 320: candidate tables from candidates.top_tokens, or picked in C++ where (C+1)^2 * 4 > V
    lp = peaky_log_probs(3, 40, vocab, seed=vocab + topk, dtype=torch.float32)
    lengths = torch.tensor([40, 23, 31])
    want = ctc_prefix_beam_search(lp, lengths, beam=6, nbest=3, token_topk=topk, native=True)
    states = new_states(3, 6, {}, {})
    advance_in_pieces(states, lp, lengths, [9, 1, 17, 13], topk=topk, min_logp=-12.0, skip=0.999)
    assert_nbest_equal(native_loop.stream_nbest(states, 3, final=True), want)
    assert all(h and h[0].tokens for h in want.to_lists())


def test_skipped_blank_runs_across_a_chunk_boundary_equal_one_advance() -> None:
    # a token, a run of near-certain blank frames (skipped) cut by the chunk boundary, then the same token:
    # the repeat is a new token only because the run moved the first one's mass into pb
    lp = torch.full((1, 12, 5), -9.0)
    lp[0, :, 0] = -1e-3
    lp[0, 0, 0], lp[0, 0, 3] = -6.0, -0.01
    lp[0, 9, 0], lp[0, 9, 3] = -6.0, -0.01
    lp = lp.log_softmax(-1)
    lengths = torch.tensor([12])
    offline = ctc_prefix_beam_search(lp, lengths, beam=4, native=True, blank_skip_threshold=0.99)
    assert offline.to_lists()[0][0].tokens == [3, 3]
    for sizes in ([12], [5, 7], [1] * 12, [9, 3], [10, 2]):
        states = new_states(1, 4, {}, {})
        advance_in_pieces(states, lp, lengths, sizes, topk=8, min_logp=-12.0, skip=0.99)
        assert_nbest_equal(native_loop.stream_nbest(states, 4, final=True), offline, tol=1e-6)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
def test_streams_at_different_positions_batched_equal_each_alone(word_lm) -> None:
    scorers, weights = fusion("word_lexicon", word_lm)
    lp = spelled_log_probs(CHARS, 4, 60, seed=21)
    starts = [0, 17, 5, 40]  # each stream had this many frames before the batched calls
    alone = new_states(4, 6, scorers, weights)
    batched = new_states(4, 6, scorers, weights)
    for b, start in enumerate(starts):
        if start:
            native_loop.stream_advance([alone[b]], lp[b:b + 1, :start], torch.tensor([start]))
            native_loop.stream_advance([batched[b]], lp[b:b + 1, :start], torch.tensor([start]))
    rest = [60 - s for s in starts]
    chunk = torch.stack([torch.nn.functional.pad(lp[b, s:], (0, 0, 0, s), value=-50.0) for b, s in enumerate(starts)])
    native_loop.stream_advance(batched, chunk, torch.tensor(rest))
    for b, start in enumerate(starts):
        native_loop.stream_advance([alone[b]], lp[b:b + 1, start:], torch.tensor([rest[b]]))
    for final in (False, True):
        assert_nbest_equal(native_loop.stream_nbest(batched, 6, final),
                           NBest.cat([native_loop.stream_nbest([st], 6, final) for st in alone]))
    assert [st.frames for st in batched] == [60] * 4


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
def test_threads_give_the_same_streams(word_lm) -> None:
    scorers, weights = fusion("word_lexicon", word_lm)
    lp = spelled_log_probs(CHARS, 5, 40, seed=13)
    lengths = torch.tensor([40, 12, 33, 40, 28])
    old = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            states = new_states(5, 5, scorers, weights)
            advance_in_pieces(states, lp, lengths, [15, 25])
            assert torch.get_num_threads() == threads  # restored after the setup ran on one thread
            results.append(native_loop.stream_nbest(states, 5, final=True))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(results[0].tokens, results[1].tokens) and torch.equal(results[0].scores, results[1].scores)


def ngram_final(scorer: NgramScorer, tokens: List[int]) -> float:
    """log P(</s> | tokens) by the Python scorer: init_state, select_state per token, final_score."""
    state = scorer.init_state(1, 1, torch.device("cpu"))
    for t in tokens:
        state = scorer.select_state(state, torch.tensor([0]), torch.tensor([t]))
    return float(scorer.final_score(state)[0])


def test_partial_ranking_leaves_out_the_end_of_sentence_scores() -> None:
    lm = abc_lm()
    lp = case_log_probs("token_ngram", 2, 40, seed=3)
    lengths = torch.tensor([40, 29])
    states = new_states(2, 6, {"lm": lm}, {"lm": 0.7})
    native_loop.stream_advance(states, lp, lengths)
    partial = native_loop.stream_nbest(states, 6, final=False).to_lists()
    final = native_loop.stream_nbest(states, 6, final=True).to_lists()
    for hp, hf in zip(partial, final):
        assert len(hp) == len(hf) == 6
        assert [h.score for h in hp] == sorted((h.score for h in hp), reverse=True)
        ends = {tuple(h.tokens): h for h in hf}
        for h in hp:
            end = ends[tuple(h.tokens)]
            assert end.score == pytest.approx(h.score + 0.7 * ngram_final(lm, h.tokens), abs=1e-4)
            assert end.ctc_score == h.ctc_score and end.token_frames == h.token_frames


def best_partial(states) -> List[Hypothesis]:
    return native_loop.stream_nbest(states, 1, final=False).best()


def test_best_partials_and_frames_after_pieces_of_unequal_lengths() -> None:
    lp = torch.full((3, 10, 5), -9.0)
    lp[..., 0] = -0.01
    lp[0, 3, 0], lp[0, 3, 2] = -9.0, -0.01  # token 2 at frame 3, then blanks
    lp[1, 9, 0], lp[1, 9, 4] = -9.0, -0.01  # a token on the last frame
    lp = lp.log_softmax(-1)  # stream 2: blanks only
    states = new_states(3, 1, {}, {})  # beam 1: no weaker prefix [2] from frame 0 kept to merge with frame 3's
    advance_in_pieces(states, lp, torch.tensor([10, 10, 10]), [4, 6], **EXACT)
    assert [h.tokens for h in best_partial(states)] == [[2], [4], []]
    assert [h.token_frames for h in best_partial(states)] == [[3], [9], []]
    native_loop.stream_advance(states, lp[:, :2, :].clone().fill_(-9.0).index_fill_(2, torch.tensor([0]), -1e-4),
                               torch.tensor([2, 0, 1]), **EXACT)
    assert [h.tokens for h in best_partial(states)] == [[2], [4], []]
    assert [st.frames for st in states] == [12, 10, 11]


def test_token_frames_count_from_the_state_creation() -> None:
    lp = peaky_log_probs(1, 30, 7, seed=2, dtype=torch.float32)
    states = new_states(1, 4, {}, {})
    advance_in_pieces(states, lp, torch.tensor([30]), [11, 19], **EXACT)
    offline = ctc_prefix_beam_search(lp, torch.tensor([30]), beam=4, native=True, token_topk=None,
                                     token_min_logp=None, blank_skip_threshold=None)
    best = best_partial(states)[0]
    assert best.token_frames and max(best.token_frames) >= 11  # tokens of the second piece at their own frames
    assert_nbest_equal(native_loop.stream_nbest(states, 4, final=True), offline)


def test_states_are_freed_on_close_and_collection() -> None:
    gc.collect()  # states of earlier tests
    before = native_loop.live_streams()
    states = [native_loop.StreamState(4, {"lm": abc_lm()}, {"lm": 0.5}) for _ in range(200)]
    assert native_loop.live_streams() == before + 200
    lp = case_log_probs("token_ngram", 200, 12, seed=1)
    native_loop.stream_advance(states, lp, torch.full((200,), 12))
    for st in states[:150]:
        st.close()
        st.close()  # twice: still one free
    assert native_loop.live_streams() == before + 50
    with native_loop.StreamState(3) as held:
        assert native_loop.live_streams() == before + 51
    assert held.closed and native_loop.live_streams() == before + 50
    del states, st
    gc.collect()
    assert native_loop.live_streams() == before


def test_a_closed_state_refuses_use() -> None:
    st = native_loop.StreamState(3)
    st.close()
    lp = peaky_log_probs(1, 5, 4, seed=1)
    for call in (lambda: native_loop.stream_advance([st], lp, torch.tensor([5])),
                 lambda: native_loop.stream_nbest([st], 1, final=True)):
        with pytest.raises(ValueError, match="state 0 is closed: its native state was freed"):
            call()
    with pytest.raises(ValueError, match="^this StreamState is closed: its native state was freed$"):
        st.frames


def test_bad_calls_are_errors_naming_the_state() -> None:
    a, b = native_loop.StreamState(3), native_loop.StreamState(3)
    lp = peaky_log_probs(2, 6, 5, seed=1, dtype=torch.float32)
    ok = torch.tensor([6, 6])
    with pytest.raises(ValueError, match="^stream_advance: no stream states given$"):
        native_loop.stream_advance([], lp[:0], ok[:0])
    with pytest.raises(ValueError, match=r"^stream_advance: state 1 is state 0 again \(each stream once per call\)$"):
        native_loop.stream_advance([a, a], lp, ok)
    with pytest.raises(ValueError, match="^stream_nbest: state 1 is a PlainScorer, not a native_loop.StreamState$"):
        native_loop.stream_nbest([a, PlainScorer()], 1, final=False)
    with pytest.raises(ValueError, match="^stream_advance: log_probs has 2 rows for 1 stream states$"):
        native_loop.stream_advance([a], lp, ok)
    with pytest.raises(ValueError, match=r"utterance 1 \(batch row 1\): length 7 outside \[0, 6\] frames"):
        native_loop.stream_advance([a, b], lp, torch.tensor([6, 7]))
    with pytest.raises(ValueError, match="^token_topk must be >= 1 or None, got 0$"):
        native_loop.stream_advance([a, b], lp, ok, topk=0)
    for meta in ((lp.to("meta"), ok), (lp, ok.to("meta"))):
        with pytest.raises(ValueError, match="^stream_advance: log_probs and lengths must be on the CPU, got "
                                             f"{meta[0].device} and {meta[1].device}$"):
            native_loop.stream_advance([a, b], *meta)
    for skip in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"^blank_skip_threshold must be in \(0, 1\) or None, got {skip}$"):
            native_loop.stream_advance([a, b], lp, ok, skip=skip)
    native_loop.stream_advance([a, b], lp, torch.tensor([6, 0]), topk=1)  # one candidate a frame is allowed
    with pytest.raises(ValueError, match="^stream_advance: state 0 was advanced over 5 tokens, log_probs row 0 has 6$"):
        native_loop.stream_advance([a, b], peaky_log_probs(2, 6, 6, seed=1), ok)
    with pytest.raises(ValueError, match="^stream_advance: state 1 was advanced over 5 tokens, log_probs row 1 has 6$"):
        native_loop.stream_advance([native_loop.StreamState(3), b], peaky_log_probs(2, 6, 6, seed=1), ok)  # 0 frames
    wide = native_loop.StreamState(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="^stream_nbest: state 1 searches in torch.float64, state 0 in "
                                         "torch.float32: one call takes one dtype$"):
        native_loop.stream_nbest([a, wide], 1, final=False)
    for n in (0, 4):
        with pytest.raises(ValueError, match=rf"^nbest must be in \[1, beam=3\], got {n}$"):
            native_loop.stream_nbest([a], n, final=True)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="must be on the CPU"):
            native_loop.stream_advance([a, b], lp.cuda(), ok)
    for st in (a, b, wide):
        st.close()


def test_bad_states_are_errors() -> None:
    with pytest.raises(ValueError, match="^beam must be >= 1, got 0$"):
        native_loop.StreamState(0)
    with pytest.raises(ValueError, match="^dtype must be torch.float32 or torch.float64, got torch.float16$"):
        native_loop.StreamState(2, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^the native stream search cannot run: scorer 'plain' \(PlainScorer\) has "
                                         "no native form"):
        native_loop.StreamState(2, {"plain": PlainScorer()}, {"plain": 1.0})
    with pytest.raises(ValueError, match="^scorer 'lm' has no weight$"):
        native_loop.StreamState(2, {"lm": abc_lm()}, {})


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRKIT_NATIVE", "0")
    assert native_loop.scorers_unavailable({}) == "turned off by ASRKIT_NATIVE=0"
    with pytest.raises(ValueError, match="cannot run: turned off by ASRKIT_NATIVE=0"):
        native_loop.StreamState(2)


def test_the_c_interface_refuses_what_python_would_not_pass() -> None:
    # the C++ guards behind the Python checks: a null or repeated handle, a changed vocabulary, a short width
    lib = native_build.load()
    st = native_loop.StreamState(3)
    assert not lib.asrkit_stream_create(ctypes.byref(native_loop._StreamDesc(beam=0)))
    assert lib.asrkit_stream_free(None) == 3 and lib.asrkit_stream_frames(None) == -1
    null = (ctypes.c_void_p * 1)(None)
    assert lib.asrkit_stream_width(null, 1) == -1
    lp = peaky_log_probs(2, 4, 5, seed=1, dtype=torch.float32)
    frame = torch.arange(4).repeat(2, 1)
    zero, four = torch.zeros(2), torch.full((2,), 4)

    def advance(handles, vocab=5, is_double=0) -> int:
        arr = (ctypes.c_void_p * len(handles))(*handles)
        desc = native_loop._AdvanceDesc(
            states=ctypes.cast(arr, ctypes.c_void_p), is_double=is_double, batch=len(handles), frames=4,
            vocab=vocab, steps=4, n_cand=4, threads=1, select=0, min_logp=-1e9, lp=lp.data_ptr(),
            frame=frame.data_ptr(), offset=zero.data_ptr(), lengths=four.data_ptr())
        return lib.asrkit_stream_advance(ctypes.byref(desc))

    assert advance([st.handle, st.handle]) == 5
    assert advance([st.handle], is_double=1) == 3  # a float32 state in a float64 call
    assert advance([st.handle]) == 0 and st.frames == 4
    assert advance([st.handle], vocab=6) == 4
    out = [torch.empty(3, dtype=torch.long) for _ in range(5)]
    arr = (ctypes.c_void_p * 1)(st.handle)
    width = lib.asrkit_stream_width(arr, 1)
    assert width >= 1
    desc = native_loop._NBestDesc(states=ctypes.cast(arr, ctypes.c_void_p), batch=1, nbest=1, final=1,
                                  width=width - 1, total=out[0].data_ptr(), ctc=out[1].data_ptr(),
                                  tokens=out[2].data_ptr(), token_frames=out[3].data_ptr(), lengths=out[4].data_ptr())
    assert lib.asrkit_stream_nbest(ctypes.byref(desc)) == 1
    desc.states, desc.width = ctypes.cast(null, ctypes.c_void_p), width
    assert lib.asrkit_stream_nbest(ctypes.byref(desc)) == 3
    st.close()


@pytest.mark.parametrize("call", ["stream_advance", "stream_nbest"])
def test_a_refusal_by_the_library_is_an_error_naming_the_call(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    st = native_loop.StreamState(2)
    monkeypatch.setattr(st._lib, f"asrkit_{call}", lambda *args: 5)
    run = {"stream_advance": lambda: native_loop.stream_advance([st], peaky_log_probs(1, 3, 4, seed=1), torch.tensor([3])),
           "stream_nbest": lambda: native_loop.stream_nbest([st], 1, final=False)}[call]
    with pytest.raises(RuntimeError, match=rf"^{call}: the native library rejected its arguments \(code 5\)$"):
        run()
    monkeypatch.setattr(st._lib, "asrkit_stream_create", lambda *args: None)
    with pytest.raises(RuntimeError, match="^the native library refused to create a stream state$"):
        native_loop.StreamState(2)
