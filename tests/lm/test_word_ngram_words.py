"""WordNgramScorer.with_words: words added to the trie for one search (hotwords outside the lexicon and the LM),
scored as <unk> plus the unk offset or as a stated class score, against the dictionary reference LM."""
import random
import warnings

import pytest
import torch

from asrkit.lm import WordNgramScorer, load_ngram
from gain_bound import worst_gain
from test_ngram import CHAR_TOKENS, FIXTURES, OOV_WORDS, SP_TOKENS, WORDS, RefLM, RefWordSearch, spell
from test_word_ngram import walk

LEXICON = ["THE", "CAT", "SAT", "ON", "A"]
PATH = FIXTURES / "words_3gram.arpa"


def scorer_of(tokens, lexicon=LEXICON, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture has no Z: a token no LM word holds
        return WordNgramScorer(load_ngram(PATH), tokens, lexicon=lexicon, **kw)


def totals(scorer, tokens, sentences, seed=0):
    rng = random.Random(seed)
    # spell inserts the tokenizer's <unk> (id 1) now and then: a word no list has; leave it out
    got = walk(scorer, [[t for t in spell(s, tokens, random.Random(rng.random())) if t != 1] for s in sentences])
    return [float(x) for x in got]


SENTENCES = [["THE", "ZOO", "SAT"], ["ZOO"], ["A", "DOG", "SAT", "ON", "THE", "ZOO", "ZOO"], ["THE", "CAT"]]


@pytest.mark.parametrize("tokens", [CHAR_TOKENS, SP_TOKENS], ids=["chars", "pieces"])
@pytest.mark.parametrize("lookahead,unk_offset", [(True, -10.0), (False, -3.0), (True, 2.5)])
def test_added_words_score_as_unk_plus_offset_or_as_lm_words(tokens, lookahead, unk_offset):
    # ZOO is in neither the lexicon nor the LM: <unk> + offset; DOG is in the LM only: its LM score. The token
    # scores telescope to the reference's sentence score (look-ahead included), and the lexicon scorer without
    # the additions cannot spell either.
    base = scorer_of(tokens, lookahead=lookahead, unk_offset=unk_offset)
    ref = RefWordSearch(RefLM(PATH), tokens, lookahead, unk_offset)
    added = base.with_words(["ZOO", "DOG"])
    for sent, got, before in zip(SENTENCES, totals(added, tokens, SENTENCES), totals(base, tokens, SENTENCES)):
        assert got == pytest.approx(ref.sentence(sent), abs=1e-4), sent
        assert before == (-float("inf") if {"ZOO", "DOG"} & set(sent) else pytest.approx(got, abs=1e-5))


@pytest.mark.parametrize("tokens", [CHAR_TOKENS, SP_TOKENS], ids=["chars", "pieces"])
@pytest.mark.parametrize("lexicon", [LEXICON, None], ids=["lexicon", "open"])
def test_a_class_score_is_the_word_score_and_the_history_skips_the_word(tokens, lexicon):
    ref = RefLM(PATH)
    base = scorer_of(tokens, lexicon=lexicon, unk_offset=-10.0)
    added = base.with_words(["ZOO"], class_score=-4.25)
    sentences = SENTENCES[:2] + [["THE", "ZOO", "CAT"]]
    for sent, got in zip(sentences, totals(added, tokens, sentences)):
        rest = [w for w in sent if w != "ZOO"]
        assert got == pytest.approx(ref.sentence(rest) - 4.25 * sent.count("ZOO"), abs=1e-4), sent


def test_the_scorer_itself_is_unchanged_and_copies_are_cached_by_content():
    base = scorer_of(CHAR_TOKENS)
    tables = {k: v.clone() for k, v in base.native_form()[1].items()}
    lexicon, gain = list(base.lexicon), base.max_gain()
    one = base.with_words(["ZOO", "DOGS", "ZOO"])
    assert one is not base and base.with_words(["DOGS", "ZOO"]) is one  # the same content: the same copy
    assert base.with_words(["ZOO", "DOGS"], class_score=-3.0) is not one
    assert base.with_words(["THE", "CAT", "<unk>", "</s>", ""]) is base  # nothing to add
    assert scorer_of(CHAR_TOKENS, lexicon=None).with_words(["ZOO"]) is not None
    open_vocab = scorer_of(CHAR_TOKENS, lexicon=None)
    assert open_vocab.with_words(["ZOO", "DOG"]) is open_vocab  # <unk> + offset is what it scores already
    assert base.lexicon == lexicon and base.max_gain() == gain
    for name, value in base.native_form()[1].items():
        assert torch.equal(value, tables[name]), name
    assert one.lexicon == lexicon and one.lm is base.lm
    assert one.native_form()[1]["node_word"].shape[0] > tables["node_word"].shape[0]


@pytest.mark.parametrize("class_score", [None, 3.0, -6.0])
@pytest.mark.parametrize("lexicon", [LEXICON, None], ids=["lexicon", "open"])
def test_the_gain_bound_holds_with_added_words(class_score, lexicon):
    # A class score above every LM word's lifts the bound: the joint search's early stop relies on it.
    base = scorer_of(CHAR_TOKENS, lexicon=lexicon, unk_offset=-2.0)
    added = base.with_words(["ZOO", "DOG", "CA"], class_score=class_score)
    rng = random.Random(3)
    walks = [(spell(rng.choices(LEXICON + OOV_WORDS + ["DOG"], k=5), CHAR_TOKENS, rng) + [3] * 30)[:20]
             for _ in range(80)]
    worst_gain(added, walks, eos=2)  # asserts the bound along every walk
    once, per = added.max_gain()[:2]
    assert per == (pytest.approx(class_score) if class_score == 3.0 else pytest.approx(base.max_gain()[1]))
    assert once < 30


def test_a_class_word_is_looked_ahead_at_its_class_score():
    # Letter by letter: Z starts only ZOO, so its look-ahead is the class score (the sentence total alone would
    # not show it: look-ahead telescopes away).
    added = scorer_of(CHAR_TOKENS).with_words(["ZOO"], class_score=-4.25)
    ids = {t: i for i, t in enumerate(CHAR_TOKENS)}
    state = added.init_state(1, 1, torch.device("cpu"))
    state = added.select_state(state, torch.tensor([0]), torch.tensor([ids["\u2581"]]))
    assert float(added.score(state, torch.tensor([[ids["Z"]]]))) == pytest.approx(-4.25)


def test_the_copies_kept_are_the_latest_and_a_copy_takes_more_words():
    from asrkit.lm.word_ngram import COPIES_KEPT

    base = scorer_of(CHAR_TOKENS)
    first = base.with_words(["ZO"])
    later = [base.with_words(["Z" + "O" * k]) for k in range(2, COPIES_KEPT + 1)]
    assert base.with_words(["ZO"]) is first and len(later) == COPIES_KEPT - 1  # 8 kept: all still there
    base.with_words(["ZZ"])  # the ninth: the oldest (ZO) goes
    assert base.with_words(["ZO"]) is not first and base.with_words(["Z" + "O" * COPIES_KEPT]) is later[-1]
    more = first.with_words(["DOG"])
    assert totals(more, CHAR_TOKENS, [["ZO", "DOG"]])[0] > -float("inf") == totals(first, CHAR_TOKENS, [["DOG"]])[0]
