"""What the n-gram scorers accept and refuse: word-boundary marks, special ids, vocabulary warnings,
the unk_offset default, and the word scorer's sparse trie path against its dense one."""
import random
import warnings

import pytest
import torch

import asrkit.lm.word_ngram as word_ngram_module
from asrkit.lm import DEFAULT_UNK_OFFSET, NgramScorer, UnitsError, WordNgramScorer, load_ngram, ngram_scorer
from test_ngram import (CHAR_TOKENS, FIXTURES, OOV_WORDS, SP_TOKENS, TOL, WORDS, RefLM, RefWordSearch, spell,
                        write_random_arpa)
from test_word_ngram import walk
from gain_bound import worst_gain

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


PIECES_ONLY = ["<blank>", "<unk>", "<sos/eos>", MARK + "THE", MARK + "CAT", MARK + "A", MARK + "ZZZ", MARK]


@pytest.mark.parametrize("tokens,lookahead,unk_offset", [
    (CHAR_TOKENS + [""], True, -4.0), (CHAR_TOKENS, False, 0.0), (CHAR_TOKENS, False, -3.0),
    (PIECES_ONLY, True, -2.0), (SP_TOKENS, True, 0.0)])
@pytest.mark.parametrize("dense_max", [None, 1])
def test_every_token_scores_as_the_reference_step(tmp_path, tokens, lookahead, unk_offset, dense_max):
    """Each token's score after random prefixes, against RefWordSearch.step_score: the look-ahead of every
    prefix (the best unigram of the LM words it starts, or <unk> + offset), letters scoring 0 without
    look-ahead, the blank and an empty token scoring 0 and changing nothing, word-initial pieces with no
    letter token in the set (no trie edges) and one that starts no LM word, </s> at every point."""
    path = write_random_arpa(tmp_path / "w.arpa", WORDS, 3, seed=5, closed=False)
    kw = {} if dense_max is None else {"dense_max_entries": dense_max}
    scorer = quiet(WordNgramScorer, load_ngram(path), tokens, lookahead=lookahead, unk_offset=unk_offset, **kw)
    assert scorer.dense == (dense_max is None)
    ref = RefWordSearch(RefLM(path), tokens, lookahead, unk_offset)
    rng = random.Random(len(tokens) + int(lookahead))
    n, steps = 12, 9
    seqs = [[rng.randrange(-1, len(tokens)) for _ in range(steps)] for _ in range(n)]
    state = scorer.init_state(n, 1, torch.device("cpu"))
    refs = [(["<s>"], "")] * n
    every = torch.arange(len(tokens)).expand(n, -1)
    for t in range(steps):
        got = scorer.score(state, every)
        for r in range(n):
            want = [ref.step_score(refs[r], tok) for tok in range(len(tokens))]
            assert got[r].tolist() == pytest.approx(want, abs=1e-4), (seqs[r][:t], tokens)
        toks = torch.tensor([s[t] for s in seqs])
        state = scorer.select_state(state, torch.arange(n), toks)
        refs = [ref.advance(refs[r], seqs[r][t]) for r in range(n)]
    assert scorer.final_score(state).tolist() == pytest.approx([ref.step_score(s, 2) for s in refs], abs=1e-4)


def test_messages_name_ids_marks_and_tokens_exactly(word_lm):
    full = CHAR_TOKENS  # <blank>, <unk>, <sos/eos>, ▁, 15 letters
    last = len(full) - 1
    for what in ("blank_id", "unk_id", "sos_eos_id"):
        with pytest.raises(ValueError, match=f"^{what}={last + 1} is outside the token list \\(0 \\.\\. {last}\\)$"):
            WordNgramScorer(word_lm, full, **{what: last + 1})
    for what, name in (("unk_id", "<unk>"), ("sos_eos_id", "<sos/eos>")):
        with pytest.raises(ValueError, match=f"^{what}=3 is token '▁', a word boundary: pass the id of the "
                                             f"tokenizer's {name} token \\(or None\\)$"):
            WordNgramScorer(word_lm, full, **{what: 3})
    twelve = ["<blank>"] + [chr(0x61 + i) for i in range(12)]
    with pytest.raises(ValueError) as err:
        WordNgramScorer(word_lm, twelve)
    shown = ", ".join(repr(t) for t in twelve[1:])
    assert str(err.value) == ("the word LM needs a word-boundary token: no token starts with any of '▁', '|', ' '; "
                              f"tokens: [{shown}] (12 in all). Pass word_boundary=... naming the mark, or use a "
                              "token-unit LM (units='token')")
    with pytest.raises(ValueError, match=f"^word_boundary '#': no token starts with it; tokens: \\[{shown}, \\.\\.\\.\\]"
                                         " \\(13 in all\\)$"):
        WordNgramScorer(word_lm, twelve + ["m"], word_boundary="#")
    with pytest.raises(ValueError, match="^tokens start with several word-boundary marks \\('▁', '\\|'\\): pass "):
        WordNgramScorer(word_lm, full + ["|"])
    with pytest.raises(ValueError, match="^WordNgramScorer: the lexicon is empty$"):
        quiet(WordNgramScorer, word_lm, full, lexicon=["<s>", " "])
    # with word_boundary given, only that mark makes a special token a boundary: '|eos|' is a fine </s>
    odd = ["<blank>", "<unk>", "|eos|", "#"] + full[4:]
    assert quiet(WordNgramScorer, word_lm, odd, word_boundary="#", sos_eos_id=2).sos_eos_id == 2


def test_missing_letters_warning_lists_them_exactly(tmp_path):
    """The count, the first 8 tokens, the LM's letters (60 at most), and the caller's line; none when every
    token letter is in the LM (also a token spelling the LM's whole alphabet)."""
    letters = [chr(0x100 + i) for i in range(70)]
    lm = load_ngram(write_random_arpa(tmp_path / "w.arpa", letters + ["AB"], 2, seed=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WordNgramScorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", MARK + "AB", "".join(letters) + "AB"])
    extra = [f"X{i}" for i in range(10)]
    with pytest.warns(UserWarning) as rec:
        WordNgramScorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "A"] + extra)
    alphabet = "".join(sorted(set("".join(letters) + "AB")))
    shown = ", ".join(repr(t) for t in extra[:8])
    assert str(rec[0].message) == (f"10 of 15 tokens have letters that no word of the LM contains, so words spelled "
                                   f"with them score as <unk>: [{shown}, ...] (10 in all); LM letters: "
                                   f"{alphabet[:60]!r}")
    assert rec[0].filename != word_ngram_module.__file__  # stacklevel: not the library's own line


def test_lookahead_is_on_by_default(word_lm):
    # Catches: a changed default (the docstring's "default on"): the first letter of a word scores its look-ahead.
    tokens = CHAR_TOKENS
    on, off = (quiet(WordNgramScorer, word_lm, tokens, lookahead=la) for la in (True, False))
    default = quiet(WordNgramScorer, word_lm, tokens)
    every = torch.arange(len(tokens))[None]
    state = default.init_state(1, 1, torch.device("cpu"))
    assert torch.equal(default.score(state, every), on.score(on.init_state(1, 1, torch.device("cpu")), every))
    assert not torch.equal(default.score(state, every), off.score(off.init_state(1, 1, torch.device("cpu")), every))


def test_a_word_lm_scored_as_tokens_is_refused_naming_both_settings(word_lm):
    # A word 3-gram decoded with units='token' (a decode config's old default) warned, then built tables over
    # every (context, word) pair and grew to 22 GB: most tokens are no words of the LM, so it is refused.
    for tokens in (CHAR_TOKENS, SP_TOKENS):
        with pytest.raises(UnitsError, match=r"a word LM \(asrkit train-ngram --units word\): \d+ of \d+ tokens are "
                                             r"not words of the LM .*, but units='token': pass units='word'") as err:
            ngram_scorer(word_lm, tokens, units="token")
        assert err.value.units == "word"
    # A token LM missing a few tokens is still one (the warning names them).
    lm = load_ngram(FIXTURES / "chars_2gram.arpa")
    with pytest.warns(UserWarning, match="1 of 7 tokens are not in the LM's vocabulary"):
        NgramScorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "Q"])
    with pytest.raises(UnitsError, match=r"2 of 3 tokens"):
        NgramScorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "Q", "R"])


def test_a_token_lm_scored_as_words_is_refused_naming_both_settings(tmp_path):
    # A char LM's words are the tokens, the boundary "▁" among them: as a word LM it spells nothing.
    lm = load_ngram(FIXTURES / "chars_2gram.arpa")
    with pytest.raises(UnitsError, match=r"^a token LM \(asrkit train-ngram --units token\): its words start with the "
                                         r"word-boundary mark '▁' \(e.g. '▁'\), but units='word': pass "
                                         r"units='token'$") as err:
        ngram_scorer(lm, ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"], units="word")
    assert err.value.units == "token"
    quiet(ngram_scorer, lm, ["<blank>", "<unk>", "<sos/eos>", "|", "A", "B", "C"], units="word")  # another mark
    pieces = ["<s>", "</s>", MARK + "THE", "S", MARK + "CAT", MARK + "A", MARK + "DOG"]  # a sentencepiece LM: 3 shown
    arpa = tmp_path / "bpe.arpa"
    arpa.write_text("\\data\\\nngram 1=7\n\n\\1-grams:\n" + "".join(f"-1.0\t{w}\n" for w in pieces) + "\n\\end\\\n",
                    encoding="utf-8")
    with pytest.raises(UnitsError, match=rf"^a token LM .*mark '{MARK}' \(e.g. '{MARK}THE', '{MARK}CAT', '{MARK}A'\), but"):
        ngram_scorer(arpa, ["<blank>", "<unk>", "<sos/eos>", MARK + "THE", "S"], units="word")


@pytest.mark.parametrize("tokens", ["chars", "pieces"])
@pytest.mark.parametrize("lookahead,unk_offset,lexicon", [(True, -10.0, False), (True, 2.0, False), (False, 0.0, False),
                                                         (True, -3.0, True)])
def test_the_gain_bound_holds_along_spelled_sentences(tmp_path, tokens, lookahead, unk_offset, lexicon):
    # A label-synchronous search stops once no running hypothesis can overtake the finished ones: it needs the
    # most the LM can still add. Closing a word adds ln P(w | h) - LA(w) (positive whenever the context beats
    # the word's best unigram), positive back-offs and unk offsets add more: the stated bound must cover them all.
    tokens = CHAR_TOKENS if tokens == "chars" else SP_TOKENS
    rng = random.Random(len(tokens) + int(unk_offset))
    for seed in range(3):
        lm = load_ngram(write_random_arpa(tmp_path / f"w{seed}.arpa", WORDS, 3, seed=seed, closed=seed == 1))
        scorer = quiet(WordNgramScorer, lm, tokens, lookahead=lookahead, unk_offset=unk_offset,
                       lexicon=WORDS[:8] + ["ZOO"] if lexicon else None)
        once, per = scorer.max_gain()[:2]
        assert 0 < once < 30 and 0 <= per < 5, (once, per)
        walks = [(spell(rng.choices(WORDS + OOV_WORDS, k=6), tokens, rng) + [3] * 40)[:24] for _ in range(60)]
        worst = worst_gain(scorer, walks, eos=2)
        assert worst > once - 8.0  # walks of real words come near it: the bound is not a wild overestimate


def test_word_marks_say_where_words_close_and_open(word_lm):
    # The word bonus counts words where this LM scores them: a boundary or </s> closes, letters (and a
    # boundary with letters, "\u2581THE") open a word, a lone boundary clears it; the blank, </s> and empty
    # pieces leave it as it is.
    tokens = ["<blank>", "<unk>", "<sos/eos>", MARK, MARK + "THE", "CAT", ""]
    closes, opens = quiet(WordNgramScorer, word_lm, tokens).word_marks()
    assert closes.tolist() == [False, False, True, True, True, False, False]
    assert opens.tolist() == [-1, 1, -1, 0, 1, 1, -1] and opens.dtype == torch.int64
    scorer = quiet(WordNgramScorer, word_lm, tokens)
    closes[3] = False  # a copy: the scorer's own marks stay
    assert scorer.word_marks()[0][3]


def ref_gain(lm, tokens_scorer, lookahead, unk_offset, lexicon):
    """(once, per_token) of WordNgramScorer.max_gain from strings: LA of every prefix by brute force, the most
    each word's closing adds (NgramLM.max_logprobs, tested on its own), the most any prefix still gains."""
    best = lm.max_logprobs().tolist()
    uni = {w: float(lm.prob_1[i]) for i, w in enumerate(lm.vocab)}
    words = lexicon or [w for w in lm.vocab if w not in ("<s>", "</s>", "<unk>")]
    closing = {w: best[lm.index(w)] + (0.0 if w in lm.word_to_id else unk_offset) for w in words}
    unigram = {w: uni[w] if w in lm.word_to_id else uni["<unk>"] + unk_offset for w in words}
    unk = best[lm.unk_id] + unk_offset
    gains = []
    for prefix in {w[:j] for w in words for j in range(1, len(w) + 1)}:
        under = [w for w in words if w.startswith(prefix)]
        la = max(unigram[w] for w in under) if lookahead else 0.0
        gains.append(max([closing[w] for w in under] + ([] if lexicon else [unk])) - la)
    if not lexicon:  # a prefix of no word: it can only close as <unk>
        gains.append(unk - ((uni["<unk>"] + unk_offset) if lookahead else 0.0))
    end = float(lm.state_tables().eos.max())
    per = max([closing[w] for w in words] + ([] if lexicon else [unk]))
    return max(max(gains), 0.0) + max(end, 0.0), max(per, 0.0)


@pytest.mark.parametrize("lookahead,unk_offset,lexicon", [(True, -10.0, None), (True, 6.0, None), (False, -2.0, None),
                                                         (True, -3.0, ["THE", "CAT", "ZOO", "A"]),
                                                         (False, 0.0, ["THEY", "DOGS"]),
                                                         (True, 6.0, ["ZOO", "CAS"])])  # words outside the LM only
def test_the_gain_bound_equals_a_reference_from_strings(tmp_path, lookahead, unk_offset, lexicon):
    for seed in (7, 8):
        lm = load_ngram(write_random_arpa(tmp_path / f"g{seed}.arpa", WORDS, 3, seed=seed, closed=False))
        scorer = quiet(WordNgramScorer, lm, CHAR_TOKENS, lookahead=lookahead, unk_offset=unk_offset, lexicon=lexicon)
        once, per, nonnegative = scorer.max_gain()
        want = ref_gain(lm, CHAR_TOKENS, lookahead, unk_offset, lexicon)
        assert (once, per) == pytest.approx(want, abs=1e-5) and nonnegative is False


def test_native_form_names_the_tables_of_its_trie(word_lm):
    # The native loop reads the tables by name: the dense trie's or the sparse one's, and the LM's.
    common = {"la", "col_is_start", "token_slot", "node_word", "node_floats", "chain_keys", "keys", "next_state",
              "row_floats", "backoff", "dense", "width", "order", "start_state"}
    for dense_max, trie in ((None, {"trans", "la_next"}),
                            (1, {"edge_keys", "edge_dst", "col_stay", "col_start", "col_is_end"})):
        kw = {} if dense_max is None else dict(dense_max_entries=dense_max)
        scorer = quiet(WordNgramScorer, word_lm, CHAR_TOKENS, **kw)
        kind, tables = scorer.native_form()
        assert kind == "word_ngram" and set(tables) == common | trie
        assert tables["la"] is scorer.la and int(tables["dense"]) == (dense_max is None)
        assert all(isinstance(t, torch.Tensor) for t in tables.values())
