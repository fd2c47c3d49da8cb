"""The native (C++) CTC prefix search loop against the torch loop on the CPU, its dispatch and its build.

The reference is the torch loop (asrkit.search.ctc_prefix, itself tested against a dict-based reference
search): the same inputs through ``native=False`` and ``native=True`` must give the same n-best token
sequences, token frames and scores. The native loop reproduces torch.topk's tie order, so sequences are
expected equal; a difference is tolerated only where two hypotheses' scores are within 1e-5 of each other
(a tie that float rounding may break either way), and scores must agree within 1e-4.
"""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

from asrkit.lm import ngram_scorer
from asrkit.lm.ngram import NgramScorer, load_ngram
import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import WordCount, ctc_prefix_beam_search, hotword_scorer, native_build
from asrkit.search.hotwords import spell_with_tokens
from asrkit.search.interfaces import NativeScorer
from asrkit.search.lexicon import LexiconScorer

FIXTURES = Path(__file__).resolve().parents[1] / "lm" / "fixtures"
MARK = "\u2581"
LETTERS = list("ACDEGHMNOSTXZ")  # the fixture LM's letters and two it never uses
CHARS = ["<blank>", "<unk>", "<sos/eos>", MARK] + LETTERS
PIECES = ["<blank>", "<unk>", "<sos/eos>", MARK, MARK + "THE", MARK + "CAT", MARK + "A", MARK + "D", "OG", "AT"] + LETTERS
WORDS = ["THE", "CAT", "SAT", "ON", "MAT", "A", "DOG"]  # the words of words_3gram.arpa
LEXICON = WORDS + ["CA", "TO", "AT"]
TIE, TOL = 1e-5, 1e-4

needs_library = pytest.mark.skipif(native_build.load() is None, reason="no C++ compiler: the native loop cannot build")


def spelled_log_probs(tokens: List[str], batch: int, frames: int, seed: int,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, T, V) log-probs that spell random sentences of fixture words (and OOV words) with noise."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    ids = {t: i for i, t in enumerate(tokens)}
    lp = torch.randn(batch, frames, len(tokens), generator=gen, dtype=torch.float64)
    for b in range(batch):
        words = rng.choices(WORDS + ["ZOO", "CAS", "DOGE"], k=6)
        seq = [ids[c] for c in MARK + MARK.join(words)]  # letter by letter (pieces lists have the letters too)
        for i, t in enumerate(seq[:frames // 2]):
            lp[b, 2 * i, t] += rng.uniform(3.0, 7.0)
            lp[b, 2 * i + 1, 0] += rng.uniform(3.0, 7.0)
    return lp.log_softmax(-1).to(dtype)


def peaky_log_probs(batch: int, frames: int, vocab: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """CTC-like frames: one dominant class (blank 60% of the time), eps log-uniform in [1e-4, 0.5]."""
    gen = torch.Generator().manual_seed(seed)
    dominant = torch.where(torch.rand(batch, frames, generator=gen) < 0.6, 0,
                           torch.randint(1, vocab, (batch, frames), generator=gen))
    eps = 10 ** (torch.rand(batch, frames, generator=gen, dtype=torch.float64) * (math.log10(0.5) + 4) - 4)
    rest = torch.randn(batch, frames, vocab, generator=gen, dtype=torch.float64).mul(2)
    rest.scatter_(2, dominant[..., None], float("-inf"))
    lp = rest.log_softmax(-1) + eps.log()[..., None]
    lp.scatter_(2, dominant[..., None], torch.log1p(-eps)[..., None])
    return lp.to(dtype)


def assert_paths_agree(lp: torch.Tensor, lengths: torch.Tensor, **kw) -> List[list]:
    """Torch loop vs native loop on the same search; returns the native n-best lists."""
    torch_out = ctc_prefix_beam_search(lp, lengths, native=False, **kw)
    native_out = ctc_prefix_beam_search(lp, lengths, native=True, **kw)
    assert native_out.scores.dtype == torch_out.scores.dtype
    want, got = torch_out.to_lists(), native_out.to_lists()
    for b, (w, g) in enumerate(zip(want, got)):
        assert len(w) == len(g), f"utterance {b}: {len(g)} hypotheses, torch {len(w)}"
        for j, (hw, hg) in enumerate(zip(w, g)):
            assert hg.score == pytest.approx(hw.score, abs=TOL), f"utterance {b} rank {j}"
            if hw.tokens != hg.tokens:  # only a tie may order two hypotheses either way
                partners = [h.score for i, h in enumerate(w) if i != j] + [h.score for i, h in enumerate(g) if i != j]
                assert any(abs(s - hw.score) <= TIE for s in partners), f"utterance {b} rank {j}: {hg} vs {hw}"
                continue
            assert hg.ctc_score == pytest.approx(hw.ctc_score, abs=TOL), f"utterance {b} rank {j}"
            assert hg.token_frames == hw.token_frames, f"utterance {b} rank {j}"
    return got


PRUNING = {
    "default": {},
    "exact": dict(token_topk=None, token_min_logp=None, blank_skip_threshold=None),
    "tight": dict(token_topk=3, token_min_logp=-6.0, blank_skip_threshold=0.9),
}


@needs_library
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pruning", sorted(PRUNING))
@pytest.mark.parametrize("beam", [1, 6, 24])
def test_no_lm_equals_torch_loop(dtype: torch.dtype, pruning: str, beam: int) -> None:
    lp = peaky_log_probs(5, 50, 12, seed=beam, dtype=dtype)
    lengths = torch.tensor([50, 31, 0, 44, 7])  # variable lengths and an empty utterance
    got = assert_paths_agree(lp, lengths, beam=beam, **PRUNING[pruning])
    assert any(len(h[0].tokens) > 3 for h in got if h)


@needs_library
@pytest.mark.parametrize("bonus", [-0.7, 2.5])
def test_length_bonus_equals_torch_loop(bonus: float) -> None:
    lp = peaky_log_probs(4, 40, 9, seed=3, dtype=torch.float32)
    assert_paths_agree(lp, torch.tensor([40, 40, 22, 35]), beam=8, nbest=4, weights={"length_bonus": bonus})


@needs_library
@pytest.mark.parametrize("vocab,topk", [(400, 8), (1200, 8), (400, 12)])
@pytest.mark.parametrize("skip", [None, 0.999])
def test_large_vocab_candidate_tables_equal_torch_loop(vocab: int, topk: int, skip: Optional[float]) -> None:
    # V >= 320: the candidates come from candidates.top_tokens (rows of the compacted frames, or every frame
    # when nothing is skipped); (C+1)^2 * 4 > V: the C++ loop picks them itself
    lp = peaky_log_probs(3, 40, vocab, seed=vocab + topk, dtype=torch.float32)
    lengths = torch.tensor([40, 23, 31])
    if skip is None:
        lengths = torch.tensor([40, 40, 40])  # the identity rows of the input
    got = assert_paths_agree(lp, lengths, beam=6, nbest=3, token_topk=topk, blank_skip_threshold=skip)
    assert all(h and h[0].tokens for h in got)


@needs_library
def test_exact_search_over_many_tokens_equals_torch_loop() -> None:
    # every token a candidate, more than 63 per hypothesis: torch.topk's partial-sort branch
    lp = peaky_log_probs(2, 25, 70, seed=4)
    assert_paths_agree(lp, torch.tensor([25, 18]), beam=3, **PRUNING["exact"])


@pytest.fixture(scope="module")
def word_lm():
    return load_ngram(FIXTURES / "words_3gram.arpa")


WORD_CASES: Dict[str, dict] = {
    "chars": dict(tokens=CHARS),
    "chars-no-lookahead": dict(tokens=CHARS, lookahead=False, unk_offset=0.0),
    "chars-unk-offset": dict(tokens=CHARS, unk_offset=-23.0),
    "pieces": dict(tokens=PIECES, unk_offset=-5.0),
    "sparse-trie": dict(tokens=CHARS, dense_max_entries=1),
    "lexicon": dict(tokens=CHARS, lexicon=LEXICON),
    "lexicon-sparse": dict(tokens=PIECES, lexicon=LEXICON, dense_max_entries=1),
}


@needs_library
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("case", sorted(WORD_CASES))
@pytest.mark.parametrize("beam,pruning", [(10, "default"), (1, "default"), (25, "exact"), (5, "tight")])
def test_word_lm_equals_torch_loop(word_lm, case: str, beam: int, pruning: str) -> None:
    kw = dict(WORD_CASES[case])
    tokens = kw.pop("tokens")
    scorer = ngram_scorer(word_lm, tokens, units="word", **kw)
    assert isinstance(scorer, NativeScorer) and scorer.native_form() is not None
    lp = spelled_log_probs(tokens, 4, 60, seed=beam + len(case))
    got = assert_paths_agree(lp, torch.tensor([60, 47, 60, 33]), beam=beam, nbest=min(beam, 3),
                             scorers={"lm": scorer}, weights={"lm": 0.8, "length_bonus": 0.5}, **PRUNING[pruning])
    if "lexicon" in case:  # only listed words come out
        for hyps in got:
            for h in hyps:
                # <sos/eos> (id 2) may be spelled at a word end: it separates words too
                text = "".join(tokens[t] if t > 2 else MARK for t in h.tokens).replace(MARK, " ").split()
                assert set(text) <= set(LEXICON), text
    assert sum(len(h[0].tokens) for h in got if h) > 10


@needs_library
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("tokens", [CHARS, PIECES], ids=["chars", "pieces"])
def test_word_bonus_beside_the_word_lm_equals_torch_loop(word_lm, tokens: List[str]) -> None:
    # The bonus per word (WordCount, as the pipeline fuses it beside a word LM) runs natively, equal to torch.
    lm = ngram_scorer(word_lm, tokens, units="word", unk_offset=-5.0)
    scorers = {"lm": lm, "length_bonus": WordCount(*lm.word_marks())}
    lp = spelled_log_probs(tokens, 3, 50, seed=3 + len(tokens))
    lengths = torch.tensor([50, 41, 50])
    assert ctc_prefix.native_loop.unavailable(lp, lengths, scorers) is None
    for bonus in (0.7, -1.5):
        got = assert_paths_agree(lp, lengths, beam=8, nbest=3, scorers=scorers,
                                 weights={"lm": 0.6, "length_bonus": bonus})
        assert sum(len(h[0].tokens) for h in got if h) > 10


@needs_library
@pytest.mark.parametrize("with_lm", [False, True])
@pytest.mark.parametrize("tokens", [CHARS, PIECES], ids=["chars", "pieces"])
@pytest.mark.parametrize("dense_max", [None, 1])
def test_lexicon_scorer_equals_torch_loop(word_lm, with_lm: bool, tokens: List[str], dense_max: Optional[int]) -> None:
    lex = LexiconScorer(LEXICON, tokens, **({} if dense_max is None else dict(dense_max_entries=dense_max)))
    assert lex.dense == (dense_max is None)
    scorers, weights = {"lexicon": lex}, {"lexicon": 1.0}
    if with_lm:
        with pytest.warns(UserWarning, match="no word of the LM contains"):
            scorers["lm"] = ngram_scorer(word_lm, tokens, units="word", unk_offset=-5.0)
        weights["lm"] = 0.5
    lp = spelled_log_probs(tokens, 3, 50, seed=7 + len(tokens))
    got = assert_paths_agree(lp, torch.tensor([50, 50, 38]), beam=8, nbest=3, scorers=scorers, weights=weights,
                             token_min_logp=None)
    assert any(h and h[0].tokens for h in got)


@needs_library
@pytest.mark.filterwarnings("ignore:.*no word of the LM contains")
@pytest.mark.parametrize("with_lm", [False, True])
@pytest.mark.parametrize("tokens", [CHARS, PIECES], ids=["chars", "pieces"])
@pytest.mark.parametrize("pruning", ["default", "exact"])
@pytest.mark.parametrize("layout", ["dense", "arcs"])
def test_hotwords_equal_torch_loop(word_lm, with_lm: bool, tokens: List[str], pruning: str, layout: str) -> None:
    # overlapping phrases, a prefix of another, per-phrase weights; an OOV word (ZOO) among them; the automaton's
    # steps read from its whole tables (dense) or searched among its arcs (an automaton too large for the tables)
    hot = hotword_scorer(["CAT", ("CAT SAT", 2.0), "AT", ("ZOO", 3.0), "DOG ON"], spell_with_tokens(tokens), tokens,
                         unk_id=1)
    assert hot.graph.step_next is not None
    if layout == "arcs":
        hot.graph = hot.graph._replace(step_next=None, step_gain=None)
    scorers, weights = {"hotwords": hot}, {"hotwords": 1.5}
    if with_lm:
        scorers["lm"] = ngram_scorer(word_lm, tokens, units="word", unk_offset=-5.0)
        weights.update(lm=0.5, length_bonus=0.3)
    lp = spelled_log_probs(tokens, 3, 50, seed=11 + len(tokens))
    lengths = torch.tensor([50, 50, 38])
    assert ctc_prefix.native_loop.unavailable(lp, lengths, scorers) is None
    got = assert_paths_agree(lp, lengths, beam=8, nbest=3, scorers=scorers, weights=weights, **PRUNING[pruning])
    assert sum(len(h[0].tokens) for h in got if h) > 10


@needs_library
def test_token_ngram_dense_equals_torch_loop_and_lookup_is_not_native() -> None:
    lm = load_ngram(FIXTURES / "chars_2gram.arpa")
    tokens = ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"]
    dense, lookup = NgramScorer(lm, tokens, dense=True), NgramScorer(lm, tokens, dense=False)
    lp = peaky_log_probs(3, 40, len(tokens), seed=9, dtype=torch.float32)
    lengths = torch.tensor([40, 25, 31])
    assert_paths_agree(lp, lengths, beam=6, nbest=3, scorers={"lm": dense}, weights={"lm": 0.9})
    assert lookup.native_form()[0] == "token_ngram_lookup"  # a form the GPU's fused search runs, the C++ loop not
    with pytest.raises(ValueError, match="native=True.*'lm'.*unknown native kind 'token_ngram_lookup'"):
        ctc_prefix_beam_search(lp, lengths, beam=6, scorers={"lm": lookup}, weights={"lm": 0.9}, native=True)


class PlainScorer:
    """A BatchScorer with no native form: a constant per token."""

    def init_state(self, batch: int, beam: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch * beam, device=device)

    def score(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.full(tokens.shape, -0.5)

    def select_state(self, state: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return state[index]

    def final_score(self, state: torch.Tensor) -> torch.Tensor:
        return state


def test_native_true_without_a_native_form_is_an_error_and_auto_uses_torch() -> None:
    lp = peaky_log_probs(2, 20, 6, seed=1)
    lengths = torch.tensor([20, 15])
    kw = dict(beam=4, scorers={"plain": PlainScorer()}, weights={"plain": 1.0})
    with pytest.raises(ValueError, match="native=True.*scorer 'plain' \\(PlainScorer\\) has no native form"):
        ctc_prefix_beam_search(lp, lengths, native=True, **kw)
    auto = ctc_prefix_beam_search(lp, lengths, **kw)
    torch_loop = ctc_prefix_beam_search(lp, lengths, native=False, **kw)
    assert torch.equal(auto.tokens, torch_loop.tokens) and torch.equal(auto.scores, torch_loop.scores)


def test_environment_turns_the_automatic_choice_off(monkeypatch: pytest.MonkeyPatch) -> None:
    lp = peaky_log_probs(2, 20, 6, seed=3)
    monkeypatch.setenv("ASRKIT_NATIVE", "0")
    with pytest.raises(ValueError, match="native=True.*ASRKIT_NATIVE=0"):
        ctc_prefix_beam_search(lp, torch.tensor([20, 9]), beam=3, native=True)
    ran = []
    real = prefix_loop.frame_loop
    monkeypatch.setattr(prefix_loop, "frame_loop", lambda *a, **k: ran.append(1) or real(*a, **k))
    ctc_prefix_beam_search(lp, torch.tensor([20, 9]), beam=3)
    assert ran == [1]  # the torch loop ran


def test_native_true_with_gradients_is_an_error() -> None:
    lp = peaky_log_probs(1, 10, 5, seed=2).requires_grad_()
    with pytest.raises(ValueError, match="native=True.*requires grad"):
        ctc_prefix_beam_search(lp, torch.tensor([10]), beam=2, native=True)


@needs_library
def test_threads_split_utterances_with_the_same_results() -> None:
    lp = spelled_log_probs(CHARS, 5, 40, seed=11)
    lengths = torch.tensor([40, 12, 33, 40, 28])
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ctc_prefix_beam_search(lp, lengths, beam=5, native=True)
        torch.set_num_threads(2)
        two = ctc_prefix_beam_search(lp, lengths, beam=5, native=True)
        assert torch.get_num_threads() == 2  # restored after the setup ran on one thread
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one.tokens, two.tokens) and torch.equal(one.scores, two.scores)



def test_missing_compiler_warns_once_and_falls_back_to_the_torch_loop(fresh_native_cache, monkeypatch) -> None:
    monkeypatch.setattr(native_build, "COMPILER", str(fresh_native_cache / "no-such-g++"))
    lp = peaky_log_probs(2, 30, 7, seed=5)
    lengths = torch.tensor([30, 21])
    with pytest.warns(RuntimeWarning, match="native CTC prefix search is unavailable.*no C\\+\\+ compiler.*no-such-g"):
        auto = ctc_prefix_beam_search(lp, lengths, beam=4)
    expected = ctc_prefix_beam_search(lp, lengths, beam=4, native=False)
    assert torch.equal(auto.tokens, expected.tokens) and torch.equal(auto.scores, expected.scores)
    with pytest.raises(ValueError, match="native=True.*no C\\+\\+ compiler"):
        ctc_prefix_beam_search(lp, lengths, beam=4, native=True)
    assert not fresh_native_cache.exists() or not any(fresh_native_cache.iterdir())


def test_failing_compiler_names_its_message(fresh_native_cache, monkeypatch, tmp_path) -> None:
    fake = tmp_path / "bad-cxx"
    fake.write_text("#!/bin/sh\necho 'error: simulated failure' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(native_build, "COMPILER", str(fake))
    with pytest.raises(RuntimeError, match="exit 3.*simulated failure"):
        native_build.build()
    assert not any(fresh_native_cache.iterdir())  # no partial library left behind


@needs_library
def test_build_goes_to_the_cache_once_keyed_by_source_and_flags(fresh_native_cache, monkeypatch) -> None:
    path = native_build.build()
    assert path.parent == fresh_native_cache and path.exists()
    stamp = path.stat().st_mtime_ns
    assert native_build.build() == path and path.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in fresh_native_cache.iterdir()] == [path.name]  # no temporary file left
    monkeypatch.setattr(native_build, "FLAGS", native_build.FLAGS + ("-DASRKIT_TEST",))
    assert native_build.library_path() != path
    (fresh_native_cache / "copy.cpp").write_text(native_build.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(native_build, "SOURCE", fresh_native_cache / "copy.cpp")
    assert native_build.library_path().name != path.name


@needs_library
@pytest.mark.parametrize("beam,nbest", [(3, 3), (8, 5)])
def test_exact_ties_come_out_in_the_torch_loops_order(beam: int, nbest: int) -> None:
    # one-hot frames: every non-dominant token has the same log-prob, so candidates tie at the beam's cut
    # and in the final n-best; the native loop then re-runs the utterance replaying torch.topk's order
    gen = torch.Generator().manual_seed(8)
    ids = torch.where(torch.rand(3, 24, generator=gen) < 0.5, 0, torch.randint(1, 6, (3, 24), generator=gen))
    lp = torch.nn.functional.one_hot(ids, 6).double().mul(4).log_softmax(-1)
    lengths = torch.tensor([24, 17, 24])
    want = ctc_prefix_beam_search(lp, lengths, beam=beam, nbest=nbest, native=False)
    got = ctc_prefix_beam_search(lp, lengths, beam=beam, nbest=nbest, native=True)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.token_frames, want.token_frames)
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=1e-12)
