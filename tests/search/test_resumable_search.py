"""The resumable CTC prefix search (asrkit.search.streaming) against the offline search.

The reference is :func:`ctc_prefix_beam_search` (itself tested against a dict-based reference search): one
advance with every frame then finish must give its n-best (tokens, token frames, scores within 1e-4) with each
scorer kind; frames fed in irregular pieces, streams batched at different positions and partial results are
checked against it too.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.lm import ngram_scorer
from asrkit.lm.ngram import NgramScorer, load_ngram
from asrkit.lm.neural import LSTMLM, NeuralLMScorer, TransformerLM
from asrkit.search import LengthBonus, NBest, WordCount, ctc_prefix_beam_search, hotword_scorer, native_loop
from asrkit.search.hotwords import spell_with_tokens
from asrkit.search.hypotheses import Hypothesis
from asrkit.search.lexicon import LexiconScorer
from asrkit.search.scorers import index_rows
from asrkit.search.streaming import StreamingCtcSearch, StreamingCtcState, _cat_trees, _shapes
from host_sync import no_host_sync
from test_ctc_prefix import EXACT, BigramScorer, peaky_log_probs, random_log_probs
from test_native_prefix import CHARS, LEXICON, PIECES, needs_library, spelled_log_probs

FIXTURES = Path(__file__).resolve().parents[1] / "lm" / "fixtures"
TOL = 1e-4


def offline(lp: torch.Tensor, lengths: torch.Tensor, **kw) -> List[List[Hypothesis]]:
    return ctc_prefix_beam_search(lp, lengths, native=False, **kw).to_lists()


def streamed(lp: torch.Tensor, lengths: torch.Tensor, pieces: Sequence[int] = (), native: bool = False,
             **kw) -> List[List[Hypothesis]]:
    """Every row a stream, fed the frames in ``pieces`` (frame counts; the rest in one last piece)."""
    search = StreamingCtcSearch(native=native, dtype=lp.dtype, **kw)
    assert search.native == native
    states = [search.new_state() for _ in range(lp.shape[0])]
    start = 0
    for n in list(pieces) + [lp.shape[1]]:
        n = min(n, lp.shape[1] - start)
        search.advance(states, lp[:, start:start + n], (lengths - start).clamp(0, n))
        start += n
    assert [st.frames for st in states] == lengths.tolist()
    nbest = search.finish(states)
    assert nbest.scores.dtype == lp.dtype
    return nbest.to_lists()


def assert_same_lists(got: List[List[Hypothesis]], want: List[List[Hypothesis]], tol: float = TOL) -> None:
    for b, (g, w) in enumerate(zip(got, want)):
        assert [h.tokens for h in g] == [h.tokens for h in w], f"stream {b}"
        assert [h.token_frames for h in g] == [h.token_frames for h in w], f"stream {b}"
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=tol), f"stream {b}"
        assert [h.ctc_score for h in g] == pytest.approx([h.ctc_score for h in w], abs=tol), f"stream {b}"
    assert len(got) == len(want)


PRUNING = {"exact": EXACT, "default": {}, "tight": dict(token_topk=3, token_min_logp=-3.0, blank_skip_threshold=0.9)}


@pytest.mark.parametrize("pruning", sorted(PRUNING))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_advance_equals_the_offline_search_without_lm(pruning: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    for make in (peaky_log_probs, random_log_probs):
        lp = make(4, 40, 9, gen, dtype=dtype)
        lengths = torch.tensor([40, 0, 23, 39])
        kw = dict(beam=6, nbest=4, **PRUNING[pruning])
        assert_same_lists(streamed(lp, lengths, **kw), offline(lp, lengths, **kw))


@pytest.fixture(scope="module")
def word_lm():
    return load_ngram(FIXTURES / "words_3gram.arpa")


def tiny_lstm(vocab: int) -> NeuralLMScorer:
    torch.manual_seed(0)
    return NeuralLMScorer(LSTMLM(vocab, embed_dim=8, hidden_size=8, num_layers=1, dropout=0.0))


def tiny_transformer(vocab: int) -> NeuralLMScorer:
    torch.manual_seed(0)
    return NeuralLMScorer(TransformerLM(vocab, d_model=8, num_heads=2, ffn_dim=16, num_layers=1, dropout=0.0))


def fusion(kind: str, word_lm, tokens: List[str]) -> Dict[str, dict]:
    """scorers/weights of one fusion kind over ``tokens``."""
    vocab = len(tokens)
    if kind == "token_ngram":
        lm = NgramScorer(load_ngram(FIXTURES / "chars_2gram.arpa"), tokens)
        return dict(scorers={"lm": lm}, weights={"lm": 0.7, "length_bonus": 0.4})
    if kind == "word_ngram":
        lm = ngram_scorer(word_lm, tokens, units="word", unk_offset=-5.0)
        return dict(scorers={"lm": lm, "length_bonus": WordCount(*lm.word_marks())},
                    weights={"lm": 0.8, "length_bonus": 0.5})
    if kind == "word_ngram_lexicon":
        lm = ngram_scorer(word_lm, tokens, units="word", lexicon=LEXICON)
        return dict(scorers={"lm": lm, "lexicon": LexiconScorer(LEXICON, tokens)}, weights={"lm": 0.6, "lexicon": 1.0})
    if kind == "lstm":
        return dict(scorers={"lm": tiny_lstm(vocab)}, weights={"lm": 0.5, "length_bonus": 0.3})
    if kind == "transformer":
        return dict(scorers={"lm": tiny_transformer(vocab)}, weights={"lm": 0.5})
    if kind == "hotwords":
        hot = hotword_scorer(["CAT", ("CAT SAT", 2.0), "AT", "DOG ON"], spell_with_tokens(tokens), tokens, unk_id=1)
        return dict(scorers={"hot": hot, "lm": ngram_scorer(word_lm, tokens, units="word", unk_offset=-5.0)},
                    weights={"hot": 1.5, "lm": 0.5})
    if kind == "length_bonus":
        return dict(scorers={"length_bonus": LengthBonus()}, weights={"length_bonus": 0.9})
    assert kind == "bonus_only"
    return dict(weights={"length_bonus": -0.6})


TOKEN_CHARS = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "C"]  # the token n-gram's tokens


def inputs(kind: str, batch: int, frames: int, seed: int, dtype: torch.dtype = torch.float32):
    """(tokens, log-probs) for a fusion kind: frames that spell the LMs' words (token n-gram: random peaky)."""
    if kind == "token_ngram":
        return TOKEN_CHARS, peaky_log_probs(batch, frames, len(TOKEN_CHARS), torch.Generator().manual_seed(seed),
                                            dtype=dtype)
    tokens = PIECES if kind == "hotwords" else CHARS
    return tokens, spelled_log_probs(tokens, batch, frames, seed=seed, dtype=dtype)


KINDS = ["token_ngram", "word_ngram", "word_ngram_lexicon", "lstm", "transformer", "hotwords", "length_bonus",
         "bonus_only"]


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pruning", ["exact", "default"])
def test_one_advance_equals_the_offline_search_with_each_scorer_kind(word_lm, kind: str, pruning: str) -> None:
    tokens, lp = inputs(kind, 3, 40, seed=len(kind))
    lengths = torch.tensor([40, 31, 40])
    kw = dict(beam=6, nbest=3, **fusion(kind, word_lm, tokens), **PRUNING[pruning])
    want = offline(lp, lengths, **kw)
    assert sum(len(h[0].tokens) for h in want if h) > 10  # the search emits: a real comparison
    assert_same_lists(streamed(lp, lengths, **kw), want)


@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("kind", ["none", "token_ngram", "word_ngram", "word_ngram_lexicon", "lstm", "transformer",
                                  "hotwords", "bonus_only"])
def test_irregular_pieces_equal_one_advance_for_the_exact_search(word_lm, kind: str) -> None:
    tokens, lp = inputs(kind, 3, 45, seed=3 + len(kind), dtype=torch.float64)
    lengths = torch.tensor([45, 30, 44])
    kw = dict(beam=5, nbest=3, **({} if kind == "none" else fusion(kind, word_lm, tokens)), **EXACT)
    whole = streamed(lp, lengths, **kw)
    # float64 throughout but the neural LMs, whose float32 GEMMs may take other kernels for other batch shapes
    # (8e-7 apart with 16 threads on a GPU machine's CPU)
    tol = 1e-5 if kind in ("lstm", "transformer") else 1e-9
    assert_same_lists(whole, offline(lp, lengths, **kw), tol=tol)
    for pieces in ([1, 1, 7, 2, 13, 1], [16, 16], [3] * 14 + [1]):
        assert_same_lists(streamed(lp, lengths, pieces, **kw), whole, tol=tol)


def test_skipped_blank_frames_add_up_across_many_pieces() -> None:
    # Skipped blank frames' log P(blank), summed over 60 pieces, stays float64-exact.
    gen = torch.Generator().manual_seed(17)
    lp = peaky_log_probs(3, 120, 8, gen)
    lengths = torch.tensor([120, 97, 120])
    kw = dict(beam=4, weights={"length_bonus": 0.2}, blank_skip_threshold=0.6)  # skipped frames of log P ~ -0.5
    assert_same_lists(streamed(lp, lengths, [2] * 59, **kw), offline(lp, lengths, **kw), tol=1e-9)


def test_irregular_pieces_with_default_pruning_agree_on_nearly_every_stream() -> None:
    # Pruning acts per frame and blank runs carry across pieces: pieces change nothing but tie-breaking.
    gen = torch.Generator().manual_seed(5)
    agree = total = 0
    for trial in range(6):
        lp = peaky_log_probs(16, 50, 29, gen, dtype=torch.float32)
        lengths = torch.randint(20, 51, (16,), generator=gen)
        lm = BigramScorer(29, gen)
        kw = dict(beam=8, scorers={"lm": lm}, weights={"lm": 0.4, "length_bonus": 0.5})
        whole = streamed(lp, lengths, **kw)
        pieces = streamed(lp, lengths, [1, 4, 2, 9, 3, 8], **kw)
        for w, p in zip(whole, pieces):
            total += 1
            agree += w[0].tokens == p[0].tokens and abs(w[0].score - p[0].score) < TOL
    assert agree >= 0.99 * total, f"{agree}/{total}"


@pytest.mark.parametrize("kind", ["bigram", "lstm", "transformer"])
@pytest.mark.parametrize("pruning", ["exact", "default"])
def test_streams_at_different_positions_in_one_advance_equal_each_alone(kind: str, pruning: str) -> None:
    # Five streams of different lengths and start times, advanced together in ragged pieces (a row may get
    # 0 frames, or fewer than the others): each equals the same stream searched alone in one advance.
    gen = torch.Generator().manual_seed(6)
    vocab, n = 11, 5
    lp = peaky_log_probs(n, 60, vocab, gen)
    lengths = torch.tensor([60, 41, 55, 12, 60])
    start = [0, 3, 0, 20, 7]  # tick at which each stream joins
    scorer = {"bigram": lambda: BigramScorer(vocab, gen), "lstm": lambda: tiny_lstm(vocab),
              "transformer": lambda: tiny_transformer(vocab)}[kind]()
    kw = dict(beam=5, nbest=3, scorers={"lm": scorer}, weights={"lm": 0.6, "length_bonus": 0.2}, **PRUNING[pruning])
    search = StreamingCtcSearch(native=False, dtype=torch.float64, **kw)
    states = [search.new_state() for _ in range(n)]
    rng = torch.Generator().manual_seed(7)
    for tick in range(40):
        live = [b for b in range(n) if tick >= start[b] and states[b].frames < int(lengths[b])]
        if not live:
            break
        take = torch.randint(0, 6, (len(live),), generator=rng)
        width = int(take.max())
        piece = torch.zeros(len(live), width, vocab, dtype=lp.dtype)
        got = []
        for row, b in enumerate(live):
            at = states[b].frames
            count = min(int(take[row]), int(lengths[b]) - at)
            piece[row, :count] = lp[b, at:at + count]
            got.append(count)
        search.advance([states[b] for b in live], piece, torch.tensor(got))
    assert [st.frames for st in states] == lengths.tolist()
    together = search.finish(states).to_lists()
    for b in range(n):
        alone = offline(lp[b:b + 1], lengths[b:b + 1], **kw)
        assert_same_lists(together[b:b + 1], alone)


def test_partial_after_each_piece_is_the_best_of_the_offline_search_so_far() -> None:
    gen = torch.Generator().manual_seed(8)
    lp = peaky_log_probs(3, 30, 8, gen)
    kw = dict(beam=6, weights={"length_bonus": 0.4}, **EXACT)
    search = StreamingCtcSearch(native=False, dtype=torch.float64, **kw)
    states = [search.new_state() for _ in range(3)]
    assert search.partial(states) == [Hypothesis([], 0.0, 0.0, [])] * 3
    assert search.blank_run(states) == [0, 0, 0]
    done = 0
    for n in (1, 4, 1, 7, 2, 9, 6):
        search.advance(states, lp[:, done:done + n], torch.full((3,), n))
        done += n
        want = ctc_prefix_beam_search(lp[:, :done], torch.full((3,), done), native=False, **kw).best()
        got = search.partial(states)
        assert [h.tokens for h in got] == [h.tokens for h in want]
        assert [h.token_frames for h in got] == [h.token_frames for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-9)
        assert search.blank_run(states) == [reference_blank_run(lp[b, :done]) for b in range(3)]


def reference_blank_run(lp: torch.Tensor) -> int:
    """Trailing blank frames of the best path (T, V): frames whose most likely class is the blank."""
    run = 0
    for frame in lp.tolist():
        run = run + 1 if max(range(len(frame)), key=frame.__getitem__) == 0 else 0
    return run


class NoEnd:
    """A scorer without its end-of-sentence score: the offline search then ranks by the running score."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def init_state(self, batch, beam, device):
        return self.inner.init_state(batch, beam, device)

    def score(self, state, tokens):
        return self.inner.score(state, tokens)

    def select_state(self, state, index, tokens):
        return self.inner.select_state(state, index, tokens)

    def final_score(self, state):
        return torch.zeros_like(self.inner.final_score(state))


def test_partial_ranks_by_the_running_score_without_the_end_of_sentence() -> None:
    gen = torch.Generator().manual_seed(9)
    lp = peaky_log_probs(4, 24, 10, gen)
    lm = BigramScorer(10, gen)
    search = StreamingCtcSearch(beam=5, scorers={"lm": lm}, weights={"lm": 0.8}, native=False, dtype=torch.float64,
                                **EXACT)
    states = [search.new_state() for _ in range(4)]
    for done in range(3, 25, 3):
        search.advance(states, lp[:, done - 3:done], torch.full((4,), 3))
        want = ctc_prefix_beam_search(lp[:, :done], torch.full((4,), done), beam=5, scorers={"lm": NoEnd(lm)},
                                      weights={"lm": 0.8}, native=False, **EXACT).best()
        got = search.partial(states)
        assert [(h.tokens, h.token_frames) for h in got] == [(h.tokens, h.token_frames) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-9)


def test_blank_run_counts_the_trailing_blank_frames_across_pieces() -> None:
    # Hand-made frames: blank except token 1 at frame 2 and token 2 at frames 9-10 (held two frames).
    frames = 16
    lp = torch.full((1, frames, 3), -9.0)
    lp[0, :, 0] = -0.01
    for t, tok in ((2, 1), (9, 2), (10, 2)):
        lp[0, t] = torch.tensor([-9.0, -9.0, -9.0]).index_fill(0, torch.tensor(tok), -0.01)
    search = StreamingCtcSearch(beam=3, native=False)
    state = search.new_state()
    want = {1: 1, 2: 2, 3: 0, 5: 2, 9: 6, 10: 0, 11: 0, 16: 5}  # frames so far -> trailing blank frames
    done = 0
    for n in (1, 1, 1, 2, 4, 1, 1, 5):
        search.advance([state], lp[:, done:done + n], torch.tensor([n]))
        done += n
        assert search.blank_run([state]) == [want[done]], done
    assert search.partial([state])[0].tokens == [1, 2]


def test_memory_is_bounded_by_the_tokens_not_the_frames() -> None:
    # 300 pieces of blank frames (skipped): the state holds the same tensors, whatever the stream's length.
    vocab = 7
    search = StreamingCtcSearch(beam=4, scorers={"lm": tiny_lstm(vocab)}, weights={"lm": 0.5}, native=False)
    state = search.new_state()
    blank = torch.full((1, 8, vocab), -12.0).index_fill(2, torch.tensor([0]), -1e-4)

    def size() -> int:
        tensors = [state.tokens, state.token_frames, state.rows.st, state.rows.ints]
        tensors += list(state.rows.states["lm"].lm) + [state.rows.states["lm"].logp]
        return sum(t.numel() for t in tensors)

    search.advance([state], blank, torch.tensor([8]))
    first = size()
    for _ in range(300):
        search.advance([state], blank, torch.tensor([8]))
    assert size() == first and state.frames == 301 * 8
    at_start = float(search.finish([search.new_state()]).scores[0, 0])  # the LM's end of an empty sentence
    assert float(search.finish([state]).scores[0, 0]) == pytest.approx(at_start + 301 * 8 * -1e-4, abs=1e-3)


def test_the_frame_loop_never_syncs_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list = []
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    gen = torch.Generator().manual_seed(10)
    lp = peaky_log_probs(3, 20, 12, gen, dtype=torch.float32)
    for settings in ({}, EXACT):
        search = StreamingCtcSearch(beam=4, scorers={"lm": BigramScorer(12, gen), "length_bonus": LengthBonus()},
                                    weights={"lm": 0.5, "length_bonus": 0.2}, native=False, **settings)
        states = [search.new_state() for _ in range(3)]
        search.advance(states, lp[:, :9], torch.tensor([9, 4, 9]))
        search.advance(states, lp[:, 9:], torch.tensor([11, 11, 0]))
        search.finish(states)
    assert len(ran) == 4


def test_bad_input_gets_a_clear_error() -> None:
    search = StreamingCtcSearch(beam=3, native=False)
    a, b = search.new_state(), search.new_state()
    lp = torch.randn(2, 5, 6).log_softmax(-1)
    with pytest.raises(ValueError, match=r"^1 stream states for log_probs of 2 streams: give one state per row$"):
        search.advance([a], lp, torch.tensor([5, 5]))
    with pytest.raises(ValueError, match=r"^streams 0 and 1 are the same state: a stream advances once per call$"):
        search.advance([a, a], lp, torch.tensor([5, 5]))
    other = StreamingCtcSearch(beam=3, native=False).new_state()
    with pytest.raises(ValueError, match=r"^stream 1: not a state of this StreamingCtcSearch \(make it with new_state\(\)\)$"):
        search.advance([a, other], lp, torch.tensor([5, 5]))
    with pytest.raises(ValueError, match=r"^stream 0: not a state"):
        search.partial(["a state"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"^utterance 1 \(batch row 1\): length 6 outside \[0, 5\]"):
        search.advance([a, b], lp, torch.tensor([5, 6]))
    search.advance([a, b], lp, torch.tensor([5, 2]))
    with pytest.raises(ValueError, match=r"^stream 1: log_probs have 8 tokens, its earlier frames had 6$"):
        search.advance([search.new_state(), b], torch.randn(2, 3, 8).log_softmax(-1), torch.tensor([3, 3]))
    assert (a.frames, b.frames) == (5, 2)  # a refused call changes nothing
    with pytest.raises(ValueError, match=r"^log_probs are on meta, this search's states on cpu$"):
        search.advance([a], torch.zeros(1, 2, 6, device="meta"), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"^finish: no stream states given$"):
        search.finish([])
    assert search.partial([]) == [] and search.blank_run([]) == []
    with pytest.raises(ValueError, match=r"^nbest must be in \[1, beam=3\], got 4$"):
        StreamingCtcSearch(beam=3, nbest=4)
    with pytest.raises(ValueError, match=r"^token_topk must be >= 1 or None, got 0$"):
        StreamingCtcSearch(token_topk=0)
    with pytest.raises(ValueError, match=r"^blank_skip_threshold must be in \(0, 1\) or None, got 1.5$"):
        StreamingCtcSearch(blank_skip_threshold=1.5)
    with pytest.raises(ValueError, match=r"^dtype must be torch.float32 or torch.float64, got torch.float16$"):
        StreamingCtcSearch(dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^scorer 'lm' has no weight"):
        StreamingCtcSearch(scorers={"lm": LengthBonus()})
    assert isinstance(a, StreamingCtcState) and isinstance(search.finish([a, b]), NBest)


NATIVE_KINDS = ["none", "token_ngram", "word_ngram", "word_ngram_lexicon", "hotwords", "bonus_only"]


@needs_library
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains", "ignore:.*tokens are not in the LM")
@pytest.mark.parametrize("kind", NATIVE_KINDS)
@pytest.mark.parametrize("pruning", ["exact", "default", "tight"])
def test_native_loop_in_pieces_equals_the_offline_search_and_the_torch_loop(word_lm, kind: str, pruning: str) -> None:
    tokens, lp = inputs(kind, 3, 40, seed=20 + len(kind), dtype=torch.float64 if pruning == "exact" else torch.float32)
    lengths = torch.tensor([40, 26, 40])
    kw = dict(beam=6, nbest=3, **({} if kind == "none" else fusion(kind, word_lm, tokens)), **PRUNING[pruning])
    want = offline(lp, lengths, **kw)
    assert sum(len(h[0].tokens) for h in want if h) > 10
    assert_same_lists(streamed(lp, lengths, native=True, **kw), want)  # one advance
    assert_same_lists(streamed(lp, lengths, [1, 6, 2, 11], native=True, **kw), want)
    assert_same_lists(streamed(lp, lengths, [5, 5, 1], native=True, **kw),
                      streamed(lp, lengths, [5, 5, 1], native=False, **kw))


@needs_library
@pytest.mark.parametrize("beam", [1, 5])
def test_native_partial_and_blank_run_equal_the_torch_loops(beam: int) -> None:
    # A token LM with end-of-sentence scores, which the partial ranking leaves out on both loops.
    gen = torch.Generator().manual_seed(12)
    lp = peaky_log_probs(4, 30, len(TOKEN_CHARS), gen, dtype=torch.float32)
    lengths = torch.tensor([30, 30, 12, 25])
    lm = NgramScorer(load_ngram(FIXTURES / "chars_2gram.arpa"), TOKEN_CHARS)
    loops = [StreamingCtcSearch(beam=beam, scorers={"lm": lm}, weights={"lm": 0.8, "length_bonus": 0.3}, native=native)
             for native in (False, True)]
    states = [[search.new_state() for _ in range(4)] for search in loops]
    for start in range(0, 30, 4):
        got = []
        for search, sts in zip(loops, states):
            search.advance(sts, lp[:, start:start + 4], (lengths - start).clamp(0, 4))
            got.append((search.partial(sts), search.blank_run(sts)))
        (torch_partial, torch_runs), (native_partial, native_runs) = got
        assert [(h.tokens, h.token_frames) for h in native_partial] == [(h.tokens, h.token_frames) for h in torch_partial]
        assert [h.score for h in native_partial] == pytest.approx([h.score for h in torch_partial], abs=TOL)
        assert native_runs == torch_runs
    assert [st.frames for st in states[1]] == lengths.tolist()


@needs_library
def test_native_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # auto: the C++ loop on the CPU when every scorer has a native form; True where it cannot is an error
    assert StreamingCtcSearch(weights={"length_bonus": 1.0}).native
    lstm = tiny_lstm(7)
    assert not StreamingCtcSearch(scorers={"lm": lstm}, weights={"lm": 0.5}).native
    with pytest.raises(ValueError, match=r"^native=True, but the native search cannot run: scorer 'lm' \(NeuralLMScorer\) "
                                         r"has no native form \(NativeScorer protocol\)$"):
        StreamingCtcSearch(scorers={"lm": lstm}, weights={"lm": 0.5}, native=True)
    with pytest.raises(ValueError, match=r"^native=True, but the native search cannot run: the native search runs on "
                                         r"the CPU, not meta$"):
        StreamingCtcSearch(native=True, device="meta")
    assert not StreamingCtcSearch(device="meta").native
    monkeypatch.setenv("ASRKIT_NATIVE", "0")
    assert not StreamingCtcSearch().native


@needs_library
def test_native_states_are_freed_by_close() -> None:
    search = StreamingCtcSearch(beam=3, native=True)
    before = native_loop.live_streams()
    states = [search.new_state() for _ in range(3)]
    assert native_loop.live_streams() == before + 3
    search.advance(states, torch.randn(3, 4, 5).log_softmax(-1), torch.tensor([4, 0, 2]))
    for st in states:
        st.close()
        st.close()  # idempotent
    assert native_loop.live_streams() == before
    StreamingCtcSearch(beam=3, native=False).new_state().close()  # nothing to free on the torch loop


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("kind", ["word_ngram", "lstm", "transformer", "hotwords"])
def test_streams_on_cuda_equal_the_cpu(word_lm, kind: str) -> None:
    # The GPU path is the torch loop: streams fed in pieces on CUDA give what they give on the CPU.
    tokens, lp = inputs(kind, 4, 40, seed=11)
    lengths = torch.tensor([40, 33, 40, 9])
    results = []
    for device in ("cpu", "cuda"):
        kw = dict(beam=6, nbest=3, **fusion(kind, word_lm, tokens))
        search = StreamingCtcSearch(native=False, device=device, **kw)
        states = [search.new_state() for _ in range(4)]
        for start in range(0, 40, 7):
            search.advance(states, lp[:, start:start + 7].to(device), (lengths - start).clamp(0, 7))
        results.append((search.finish(states).to_lists(), search.partial(states), search.blank_run(states)))
    (cpu_lists, cpu_partial, cpu_runs), (gpu_lists, gpu_partial, gpu_runs) = results
    assert_same_lists(gpu_lists, cpu_lists)
    assert [h.tokens for h in gpu_partial] == [h.tokens for h in cpu_partial] and gpu_runs == cpu_runs


def test_the_options_default_as_the_offline_search() -> None:
    offline_defaults = {k: p.default for k, p in inspect.signature(ctc_prefix_beam_search).parameters.items()}
    search = StreamingCtcSearch()
    assert (search.beam, search.topk, search.min_logp, search.skip) == tuple(
        offline_defaults[k] for k in ("beam", "token_topk", "token_min_logp", "blank_skip_threshold"))
    assert search.nbest == search.beam and search.scorers == {} and search.bonus == 0.0
    assert (search.device, search.dtype) == (torch.device("cpu"), torch.float32)
    state = search.new_state()
    assert (state.frames, state.blank_frames, state.vocab) == (0, 0, None)


def test_finish_gives_the_offline_nbest_tensors_with_empty_slots() -> None:
    # Fewer live hypotheses than nbest (2 frames of 3 classes, beam 8): the empty slots are -inf with no
    # tokens, exactly as the offline search fills them.
    gen = torch.Generator().manual_seed(13)
    lp = random_log_probs(3, 2, 3, gen)
    lengths = torch.tensor([2, 1, 0])
    kw = dict(beam=8, nbest=8, weights={"length_bonus": 0.5}, **EXACT)
    want = ctc_prefix_beam_search(lp, lengths, native=False, **kw)
    search = StreamingCtcSearch(native=False, dtype=torch.float64, **kw)
    states = [search.new_state() for _ in range(3)]
    search.advance(states, lp[:, :1], lengths.clamp(max=1))
    search.advance(states, lp[:, 1:], (lengths - 1).clamp(min=0))
    got = search.finish(states)
    assert bool((want.scores == float("-inf")).any())
    for name in ("tokens", "lengths", "token_frames"):
        assert getattr(got, name).dtype == torch.long and torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("scores", "ctc_scores"):
        assert torch.allclose(getattr(got, name), getattr(want, name), atol=1e-9), name
    assert search.blank_run(states)[2] == 0 and states[2].frames == 0


class Pair(NamedTuple):
    a: torch.Tensor
    b: object


def test_scorer_states_of_every_container_stack_and_split_back() -> None:
    # Scorer states are pytrees with rows on dim 0: stacking streams and splitting them again is the identity.
    def state(n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        return {"x": Pair(torch.randn(n, 2, generator=g), [torch.randn(n, generator=g), None]),
                "y": (torch.arange(n), torch.zeros(n, 3, 0))}

    parts = [state(2, 0), state(3, 1)]
    whole = _cat_trees(parts)
    assert isinstance(whole["x"], Pair) and isinstance(whole["x"].b, list) and isinstance(whole["y"], tuple)
    for part, rows in zip(parts, (torch.arange(0, 2), torch.arange(2, 5))):
        back = index_rows(whole, rows)
        assert torch.equal(back["x"].a, part["x"].a) and torch.equal(back["x"].b[0], part["x"].b[0])
        assert back["x"].b[1] is None and torch.equal(back["y"][0], part["y"][0])
    assert _shapes(parts[0]) == _shapes(parts[1]) == ((2,), (), (), (3, 0))
    assert _shapes({"b": torch.zeros(1, 4), "a": torch.zeros(1, 5)}) == ((5,), (4,))
    assert _shapes(torch.zeros(2, 7, 1)) != _shapes(torch.zeros(2, 6, 1))
    with pytest.raises(TypeError, match="^scorer state: cannot stack a str$"):
        _cat_trees(["a", "b"])


def test_a_piece_without_frames_changes_nothing() -> None:
    gen = torch.Generator().manual_seed(14)
    lp = peaky_log_probs(2, 12, 6, gen)
    search = StreamingCtcSearch(beam=4, native=False, dtype=torch.float64)
    states = [search.new_state() for _ in range(2)]
    search.advance(states, lp[:, :6], torch.tensor([6, 6]))
    before = (search.finish(states).to_lists(), search.blank_run(states))
    search.advance(states, lp[:, :0], torch.tensor([0, 0]))  # (B, 0, V)
    search.advance(states, lp[:, 6:9], torch.tensor([0, 0]))  # frames given, none real
    assert (search.finish(states).to_lists(), search.blank_run(states)) == before
    assert [st.frames for st in states] == [6, 6]


def test_blank_run_of_ragged_rows_ignores_their_padding() -> None:
    # Rows shorter than the piece: their padding frames (here spoken ones) are not the stream's.
    gen = torch.Generator().manual_seed(15)
    lp = peaky_log_probs(6, 40, 5, gen)
    lp[:, :, 1] += 3.0 * torch.rand(6, 40, generator=gen)  # token 1 often the most likely
    lp = lp.log_softmax(-1)
    search = StreamingCtcSearch(beam=3)
    states = [search.new_state() for _ in range(6)]
    done = torch.zeros(6, dtype=torch.long)
    for piece in range(8):
        take = torch.randint(0, 6, (6,), generator=gen)
        rows = torch.stack([lp[b, done[b]:done[b] + 5] for b in range(6)])  # the next 5 frames of each row
        search.advance(states, rows, take)
        done += take
        assert search.blank_run(states) == [reference_blank_run(lp[b, :done[b]]) for b in range(6)], piece


def test_log_probs_are_searched_in_the_search_dtype() -> None:
    gen = torch.Generator().manual_seed(16)
    lp = peaky_log_probs(2, 20, 7, gen)  # float64
    lengths = torch.tensor([20, 13])
    search = StreamingCtcSearch(beam=4, native=False)  # float32
    states = [search.new_state() for _ in range(2)]
    search.advance(states, lp[:, :11], lengths.clamp(max=11).int())  # any integer lengths
    search.advance(states, lp[:, 11:], (lengths - 11).clamp(min=0))
    got = search.finish(states)
    assert got.scores.dtype == torch.float32
    assert_same_lists(got.to_lists(), offline(lp.float(), lengths, beam=4))
