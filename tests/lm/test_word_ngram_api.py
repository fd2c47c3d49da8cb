"""What the n-gram scorers accept and refuse: word-boundary marks, special ids, vocabulary warnings,
the unk_offset default, and the word scorer's sparse trie path against its dense one."""
import random
import warnings

import pytest
import torch

from asrkit.lm import DEFAULT_UNK_OFFSET, NgramScorer, WordNgramScorer, load_ngram, ngram_scorer
from test_ngram import CHAR_TOKENS, FIXTURES, OOV_WORDS, SP_TOKENS, TOL, WORDS, RefLM, spell, write_random_arpa
from test_word_ngram import walk

MARK = "\u2581"


def quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


@pytest.fixture(scope="module")
def word_lm(tmp_path_factory):
    return load_ngram(write_random_arpa(tmp_path_factory.mktemp("lm") / "w.arpa", WORDS, 3, seed=5, closed=False))


def sentences(tokens, n=12, seed=0):
    rng = random.Random(seed)
    return [spell(rng.choices(WORDS + OOV_WORDS, k=rng.randint(1, 4)), tokens, rng) for _ in range(n)]


@pytest.mark.parametrize("mark", ["|", " "])
def test_other_boundary_marks_score_like_the_sentencepiece_mark(word_lm, mark):
    """'|' (wav2vec2) and ' ' token lists: the same sentences score exactly as with '▁'."""
    seqs = sentences(SP_TOKENS)
    other = [t.replace(MARK, mark) for t in SP_TOKENS]
    want = walk(quiet(WordNgramScorer, word_lm, SP_TOKENS, unk_offset=-4.0), seqs)
    scorer = quiet(WordNgramScorer, word_lm, other, unk_offset=-4.0)
    assert scorer.word_boundary == mark
    torch.testing.assert_close(walk(scorer, seqs), want, atol=1e-6, rtol=0)
    named = quiet(WordNgramScorer, word_lm, other, unk_offset=-4.0, word_boundary=mark)
    torch.testing.assert_close(walk(named, seqs), want, atol=1e-6, rtol=0)


def test_sparse_trie_equals_dense(word_lm):
    """Tries too large for dense tables keep sorted edge keys: every score equals the dense path's."""
    for tokens in (CHAR_TOKENS, SP_TOKENS):
        dense = quiet(WordNgramScorer, word_lm, tokens, unk_offset=-3.0)
        sparse = quiet(WordNgramScorer, word_lm, tokens, unk_offset=-3.0, dense_max_entries=0)
        assert dense.dense and not sparse.dense
        n, rng = 6, random.Random(1)
        every = torch.arange(len(tokens)).expand(n, -1)
        s1, s2 = dense.init_state(n, 1, torch.device("cpu")), sparse.init_state(n, 1, torch.device("cpu"))
        seqs = sentences(tokens, n, seed=3)
        for t in range(20):
            assert torch.equal(dense.score(s1, every), sparse.score(s2, every))
            index = torch.tensor([rng.randrange(n) for _ in range(n)])
            toks = torch.tensor([rng.choice([-1, 0, 2, seqs[i][t % len(seqs[i])]]) for i in index.tolist()])
            s1, s2 = dense.select_state(s1, index, toks), sparse.select_state(s2, index, toks)
            assert torch.equal(s1.ints, s2.ints)
        assert torch.equal(dense.final_score(s1), sparse.final_score(s2))


def test_no_boundary_token_is_an_error_naming_the_tokens(word_lm):
    tokens = ["<blank>", "<unk>", "<sos/eos>", "A", "B", "C"]
    with pytest.raises(ValueError, match=r"word-boundary token.*'A', 'B', 'C'"):
        WordNgramScorer(word_lm, tokens)
    with pytest.raises(ValueError, match="word_boundary '#': no token starts with it"):
        WordNgramScorer(word_lm, tokens, word_boundary="#")
    with pytest.raises(ValueError, match="several word-boundary marks"):
        WordNgramScorer(word_lm, tokens + [MARK, "|"])
    scorer = quiet(WordNgramScorer, word_lm, tokens + ["#"], word_boundary="#")
    assert scorer.word_boundary == "#"


def test_special_ids_found_by_name_and_checked(word_lm):
    """A token list whose id 1 is the space and id 2 an apostrophe: nothing is taken as <unk> or </s> by
    position (the old defaults made every word <unk>, or every apostrophe an end of sentence)."""
    tokens = ["<blank>", " ", "'"] + sorted(set("".join(WORDS)))
    scorer = quiet(WordNgramScorer, word_lm, tokens, unk_offset=0.0)
    assert (scorer.unk_id, scorer.sos_eos_id, scorer.word_boundary) == (None, None, " ")
    ids = {t: i for i, t in enumerate(tokens)}
    seq = [ids[c] for c in "THE CAT"]
    plain = quiet(WordNgramScorer, word_lm, [MARK if t == " " else t for t in tokens], unk_offset=0.0)
    torch.testing.assert_close(walk(scorer, [seq]), walk(plain, [seq]), atol=1e-6, rtol=0)
    full = CHAR_TOKENS  # <blank>, <unk>, <sos/eos>, ▁, letters
    auto = quiet(WordNgramScorer, word_lm, full)
    assert (auto.blank_id, auto.unk_id, auto.sos_eos_id) == (0, 1, 2)
    assert quiet(WordNgramScorer, word_lm, full, sos_eos_id=None).sos_eos_id == 2  # None was a TypeError
    with pytest.raises(ValueError, match="unk_id=3 is token '▁', a word boundary"):
        WordNgramScorer(word_lm, full, unk_id=3)
    with pytest.raises(ValueError, match=r"sos_eos_id=99 is outside the token list \(0 .. "):
        WordNgramScorer(word_lm, full, sos_eos_id=99)
    with pytest.raises(ValueError, match="two are the same token"):
        WordNgramScorer(word_lm, full, unk_id=0)


def test_letters_missing_from_the_lm_warn_with_count_and_examples(word_lm):
    lower = [t.lower() if len(t) == 1 else t for t in CHAR_TOKENS]  # an uppercase LM, lowercase tokens
    with pytest.warns(UserWarning, match=r"\d+ of \d+ tokens have letters that no word of the LM contains.*'a'"):
        WordNgramScorer(word_lm, lower)


def test_token_lm_warns_about_tokens_missing_from_the_arpa():
    """A space token against an ARPA that spells the boundary '|': a warning names it (it used to score as
    <unk> silently); the apostrophe at id 2 is not taken as </s> when no token is named <sos/eos>."""
    lm = load_ngram(FIXTURES / "chars_2gram.arpa")
    tokens = ["<blank>", "<unk>", "<sos/eos>", " ", "A", "B", "C"]
    with pytest.warns(UserWarning, match=r"1 of 7 tokens are not in the LM's vocabulary.*' '"):
        NgramScorer(lm, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NgramScorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"])  # all known: no warning
    apos = quiet(NgramScorer, lm, ["<blank>", "A", "'", "B"])
    assert apos.sos_eos_id == -1
    state = apos.init_state(1, 1, torch.device("cpu"))
    got = apos.score(state, torch.tensor([[2]]))[0, 0]
    want = lm.sentence_logprobs(["'"], eos=False)[0]  # not in the LM: <unk>, not </s>
    assert float(got) == pytest.approx(want, abs=TOL)
    with pytest.raises(ValueError, match="sos_eos_id=0 is outside the token list .* or is the blank"):
        NgramScorer(lm, tokens, sos_eos_id=0)


def test_unk_offset_default_is_the_measured_one(word_lm):
    assert DEFAULT_UNK_OFFSET == -10.0
    scorer = quiet(ngram_scorer, word_lm, CHAR_TOKENS, units="word")
    assert scorer.unk_offset == DEFAULT_UNK_OFFSET
    # an OOV word costs exactly the offset more than with offset 0
    ids = {t: i for i, t in enumerate(CHAR_TOKENS)}
    seq = [ids[c] for c in "ZOO"]
    zero = quiet(ngram_scorer, word_lm, CHAR_TOKENS, units="word", unk_offset=0.0)
    assert float(walk(scorer, [seq])[0] - walk(zero, [seq])[0]) == pytest.approx(DEFAULT_UNK_OFFSET, abs=1e-4)


def test_lexicon_needs_a_word_lm():
    with pytest.raises(ValueError, match="lexicon and word_boundary need a word LM"):
        ngram_scorer(FIXTURES / "chars_2gram.arpa", ["<blank>", "<unk>", "<sos/eos>", MARK, "A"], lexicon=["A"])
    with pytest.raises(ValueError, match="the lexicon is empty"):
        quiet(ngram_scorer, FIXTURES / "words_3gram.arpa", CHAR_TOKENS, units="word", lexicon=[" "])
