"""NgramLM on a hand-written ARPA that lacks a suffix and a prefix of its n-grams (the loader inserts them),
every path (back-off lookup, context states, dense tables, both NgramScorer paths) against the dictionary
reference; NgramScorer's checks and messages; what the tables are (exact ln values, not saved)."""
import itertools
import math
import warnings

import pytest
import torch

import asrkit.lm.ngram as ngram_module
from asrkit.lm import NgramScorer, UnitsError, load_ngram
from test_ngram import FIXTURES, LN10, TOL, RefLM

# "<s> A C" lacks its suffix "A C" and "C A B" its prefix "C A": both are inserted with back-off values.
# "<s> </s>" makes the key 0 * M + 1 exist (a miss must never read as it).
ARPA3 = """\\data\\
ngram 1=6
ngram 2=4
ngram 3=3

\\1-grams:
-1.0\t<s>\t-0.5
-0.8\t</s>
-1.2\tA\t-0.3
-1.5\tB\t-0.2
-1.1\tC\t-0.4
-2.0\t<unk>

\\2-grams:
-0.4\t<s> A\t-0.1
-0.9\t<s> </s>
-0.6\tA B\t-0.25
-0.7\tB C

\\3-grams:
-0.2\tA B C
-0.3\t<s> A C
-0.25\tC A B

\\end\\
"""
# An order-4 model whose 4-gram lacks its prefix "B C A", itself filled from the inserted "C A".
ARPA4 = ARPA3.replace("ngram 3=3\n", "ngram 3=3\nngram 4=1\n").replace(
    "\\end\\", "\\4-grams:\n-0.15\tB C A B\n\n\\end\\")
ARPA1 = """\\data\\
ngram 1=5

\\1-grams:
-1.0\t<s>
-0.8\t</s>
-1.2\tA
-1.5\tB
-1.1\tC

\\end\\
"""
WORDS = ["A", "B", "C", "Z"]  # Z: not in the LM (<unk>)


@pytest.fixture(params=[ARPA3, ARPA4, ARPA1], ids=["trigram", "4-gram", "unigram"])
def arpa(request, tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(request.param, encoding="utf-8")
    return path


def sentences():
    return [list(s) for n in range(5) for s in itertools.product(WORDS, repeat=n)]


def test_every_path_equals_the_dictionary_reference(arpa):
    """Catches: an inserted n-gram's probability or back-off wrong (the closure), a sign or column error in
    the state lookup, the start state, the dense tables of an order-1 or order-3 model."""
    lm, ref = load_ngram(arpa), RefLM(arpa)
    for words in sentences():
        hist = ["<s>"]
        want = []
        for w in words + ["</s>"]:
            want.append(ref.logprob(hist, w))
            hist.append(w)
        assert lm.sentence_logprobs(words) == pytest.approx(want, abs=TOL), words
        state = torch.tensor([lm.start_state])
        for w, lp_want in zip(words + ["</s>"], want):
            wid = torch.tensor([[lm.index(w)]])
            lp, nxt = lm.state_logprob(state, wid)
            lp1, nxt1 = lm.word_logprob(state, wid)
            assert float(lp[0, 0]) == pytest.approx(lp_want, abs=TOL) and float(lp1[0, 0]) == float(lp[0, 0])
            assert int(nxt1[0, 0]) == int(nxt[0, 0])
            state = nxt[:, 0]
    tokens = ["<blank>", "<sos/eos>"] + WORDS
    for dense in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Z is not in the LM (tested below)
            scorer = NgramScorer(lm, tokens, dense=dense)
        seqs = sentences()
        n = len(seqs)
        state = scorer.init_state(n, 1, torch.device("cpu"))
        totals = torch.zeros(n, dtype=torch.float64)
        every = torch.arange(len(tokens)).expand(n, -1)
        for t in range(4):
            scores = scorer.score(state, every)
            toks = torch.tensor([tokens.index(s[t]) if t < len(s) else -1 for s in seqs])
            for r, s in enumerate(seqs):
                hist = ["<s>"] + s[:t]
                assert float(scores[r, 0]) == 0.0  # the blank
                for j, w in enumerate(WORDS):
                    assert float(scores[r, 2 + j]) == pytest.approx(ref.logprob(hist, w), abs=TOL)
            totals += torch.where(toks >= 0, scores.gather(1, toks.clamp(min=0)[:, None])[:, 0], 0.0).double()
            state = scorer.select_state(state, torch.arange(n), toks)
        totals += scorer.final_score(state).double()
        assert totals.tolist() == pytest.approx([ref.sentence(s) for s in seqs], abs=1e-3)


def test_tables_are_exact_ln_values_and_never_saved(arpa):
    """Catches: log10 -> ln in float32 (the conversion is exact in float64, then rounded once), tables
    registered as persistent (a module holding an LM would save them; they come from the ARPA)."""
    lm = load_ngram(arpa)
    lm.state_tables()
    unk = -2.0 if "<unk>" in arpa.read_text() else -100.0  # an ARPA without <unk> gets KenLM's -100
    unigrams = {"<s>": -1.0, "</s>": -0.8, "A": -1.2, "B": -1.5, "C": -1.1, "<unk>": unk}
    ids = [lm.word_to_id[w] for w in unigrams if w in lm.word_to_id]
    want = (torch.tensor([unigrams[lm.vocab[i]] for i in ids], dtype=torch.float64) * LN10).float()
    assert torch.equal(lm.prob_1[ids], want)
    if lm.order > 1:
        bo = {"<s>": -0.5, "A": -0.3, "B": -0.2, "C": -0.4}
        ids = [lm.word_to_id[w] for w in bo]
        assert torch.equal(lm.bo_1[ids], (torch.tensor(list(bo.values()), dtype=torch.float64) * LN10).float())
    assert lm.state_dict() == {}


def test_an_arpa_without_sentence_marks_or_with_unknown_words_is_refused(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA1.replace("-0.8\t</s>\n", "").replace("ngram 1=5", "ngram 1=4"), encoding="utf-8")
    with pytest.raises(ValueError, match="^ARPA model has no </s> in its 1-grams$"):
        load_ngram(path)
    path.write_text(ARPA3.replace("-0.7\tB C", "-0.7\tB X"), encoding="utf-8")
    with pytest.raises(ValueError, match="^word 'X' occurs in the 2-gram 'B X' but not in the 1-grams$"):
        load_ngram(path)


def test_token_scorer_checks_and_messages(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA3, encoding="utf-8")
    lm = load_ngram(path)
    tokens = ["<blank>", "A", "B", "C"]
    with pytest.raises(ValueError, match="^blank_id=4 is outside the token list \\(0 \\.\\. 3\\)$"):
        NgramScorer(lm, tokens, blank_id=4)
    for bad in (-2, 4, 0):
        with pytest.raises(ValueError, match=f"^sos_eos_id={bad} is outside the token list \\(0 \\.\\. 3, -1 for "
                                             "none\\) or is the blank$"):
            NgramScorer(lm, tokens, sos_eos_id=bad)
    assert NgramScorer(lm, tokens, sos_eos_id=-1).sos_eos_id == -1
    assert NgramScorer(lm, tokens, sos_eos_id=3).sos_eos_id == 3
    assert NgramScorer(lm, tokens).sos_eos_id == -1  # no token named like one: none (not id 1 or -2)
    for name in ("</s>", "<eos>", "<sos/eos>"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert NgramScorer(lm, tokens + [name]).sos_eos_id == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tokenizer's <unk> (any case, or [UNK]) and the specials: no warning
        NgramScorer(lm, ["<blank>", "<UNK>", "[unk]", "A", "B", "</s>"])
    missing = [f"x{i}" for i in range(9)]
    known = ["A", "B", "C"] * 2  # as many LM words as missing ones: still a token LM (more missing: a word LM)
    with pytest.warns(UserWarning) as rec:
        NgramScorer(lm, tokens + missing + known)
    shown = ", ".join(repr(t) for t in missing[:8])
    assert str(rec[0].message) == (f"9 of 19 tokens are not in the LM's vocabulary and score as <unk>: {shown}, ... "
                                   "(is the LM over these tokens? a word LM needs units='word')")
    assert rec[0].filename != ngram_module.__file__  # stacklevel: not the library's own line
    with pytest.warns(UserWarning, match="^8 of 18 tokens .*: 'x0', 'x1', 'x2', 'x3', 'x4', 'x5', 'x6', 'x7' \\(is"):
        NgramScorer(lm, tokens + missing[:8] + known)
    assert not math.isnan(float(NgramScorer(lm, tokens).final_score(torch.tensor([lm.start_state]))[0]))


def test_a_word_lm_as_tokens_is_refused_naming_its_words_and_the_units_it_needs():
    # Most tokens (here 5 of 7) are no words of the LM: it is a word LM, whose dense tables as a token LM
    # once took 22 GB. Half of them missing is still a token LM that lacks some (the warning above).
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    tokens = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "B", "C", "D", "E", "THE", "A"]
    with pytest.raises(UnitsError) as err:
        NgramScorer(lm, tokens)
    what = ("a word LM (asrkit train-ngram --units word): 5 of 7 tokens are not words of the LM (e.g. '\u2581', "
            "'B', 'C'; its words: 'THE', 'CAT', 'SAT', ...)")
    assert (str(err.value), err.value.what, err.value.units) == (f"{what}, but units='token': pass units='word'",
                                                               what, "word")
    other = UnitsError("a token LM", "token")
    assert (str(other), other.what, other.units) == ("a token LM, but units='word': pass units='token'",
                                                   "a token LM", "token")
    with pytest.warns(UserWarning, match="^2 of 5 tokens"):
        NgramScorer(lm, ["<blank>", "\u2581", "B", "THE", "A"])  # 2 of 4: a token LM missing two
