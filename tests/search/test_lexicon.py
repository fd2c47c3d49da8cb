"""Lexicon-constrained CTC prefix search (LexiconScorer) against a brute-force constrained search."""
import itertools
import math
from pathlib import Path

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.search import ctc_prefix_beam_search
import asrkit.search.lexicon as lexicon_module
from asrkit.search.lexicon import LexiconScorer
from host_sync import no_host_sync

MARK = "\u2581"
CHARS = ["<blank>", "<unk>", "<sos/eos>", MARK, "A", "B", "C"]
PIECES = ["<blank>", "<unk>", "<sos/eos>", MARK, MARK + "AB", MARK + "A", "B", "C", "A"]
WORDS = ["AB", "BA", "C", "ABC", "CAB"]
FIXTURES = Path(__file__).resolve().parents[1] / "lm" / "fixtures"


def allowed(tokens, ids, words):
    """The reference rule, token by token: letters stay on a prefix of a listed word; a word boundary and
    <sos/eos> (which does not change the word) only where the word so far is empty or listed; no <unk>."""
    part = ""
    for i in ids:
        tok = tokens[i]
        if i == 1:
            return False
        if i == 2 or tok.startswith(MARK):
            if part and part not in words:
                return False
            part = part if i == 2 else tok[1:]
        else:
            part += tok
        if part and not any(w.startswith(part) for w in words):
            return False
    return not part or part in words


def ctc_ll(lp, ids):
    """Exact log P_ctc(ids | lp) (float64, torch's ctc_loss)."""
    if not ids:
        return float(lp[:, 0].sum())
    loss = torch.nn.functional.ctc_loss(lp.double()[:, None], torch.tensor([ids]), torch.tensor([lp.shape[0]]),
                                        torch.tensor([len(ids)]), reduction="sum", zero_infinity=False)
    return -float(loss)


def brute_force(lp, tokens, words):
    """Best listed-words label sequence by exhaustive enumeration: (log-likelihood, ids)."""
    frames, vocab = lp.shape
    best = (-math.inf, None)
    for n in range(frames + 1):
        for ids in itertools.product(range(1, vocab), repeat=n):
            ids = list(ids)
            if allowed(tokens, ids, words):
                ll = ctc_ll(lp, ids)
                if ll > best[0]:
                    best = (ll, ids)
    return best


@pytest.mark.parametrize("tokens", [CHARS, PIECES], ids=["chars", "pieces"])
def test_lexicon_search_equals_brute_force(tokens):
    gen = torch.Generator().manual_seed(3 + len(tokens))
    lex = LexiconScorer(WORDS, tokens)
    batch, frames = 6, 5
    lp = (torch.randn(batch, frames, len(tokens), generator=gen) * 2).log_softmax(-1).double()
    lengths = torch.tensor([5, 5, 4, 5, 3, 5])
    out = ctc_prefix_beam_search(lp, lengths, beam=400, nbest=4, scorers={"lexicon": lex}, weights={"lexicon": 1.0},
                                 token_topk=None, token_min_logp=None, blank_skip_threshold=None)
    free = ctc_prefix_beam_search(lp, lengths, beam=64, nbest=1, token_topk=None, token_min_logp=None,
                                  blank_skip_threshold=None)
    differs = 0
    for b, hyps in enumerate(out.to_lists()):
        want_ll, want_ids = brute_force(lp[b, :lengths[b]], tokens, WORDS)
        assert hyps[0].score == pytest.approx(want_ll, abs=1e-6)
        assert "".join(tokens[i] for i in hyps[0].tokens) == "".join(tokens[i] for i in want_ids)
        for h in hyps:  # every hypothesis is listed words, scored by CTC alone (the constraint adds 0)
            assert allowed(tokens, h.tokens, WORDS)
            assert h.score == pytest.approx(h.ctc_score, abs=1e-9)
            assert h.ctc_score == pytest.approx(ctc_ll(lp[b, :lengths[b]], h.tokens), abs=1e-6)
        differs += free.to_lists()[b][0].tokens != hyps[0].tokens
    assert differs >= 2  # the constraint changed the answer on random inputs (else the test proves little)


def test_scores_by_hand():
    lex = LexiconScorer(WORDS, CHARS)
    ids = {t: i for i, t in enumerate(CHARS)}
    state = lex.init_state(1, 1, torch.device("cpu"))
    every = torch.arange(len(CHARS))[None]
    inf = -math.inf
    # empty word: blank, boundary, </s> and the first letters of listed words; <unk> never
    assert lex.score(state, every)[0].tolist() == [0.0, inf, 0.0, 0.0, 0.0, 0.0, 0.0]
    state = lex.select_state(state, torch.tensor([0]), torch.tensor([ids["A"]]))
    # "A": only "B" continues (AB, ABC); "A" is no word, so no boundary or </s>; -1 keeps the node
    assert lex.score(state, every)[0].tolist() == [0.0, inf, inf, inf, inf, 0.0, inf]
    assert lex.final_score(state).tolist() == [inf]
    assert lex.select_state(state, torch.tensor([0]), torch.tensor([-1])).tolist() == state.tolist()
    state = lex.select_state(state, torch.tensor([0]), torch.tensor([ids["B"]]))
    assert lex.score(state, every)[0].tolist() == [0.0, inf, 0.0, 0.0, inf, inf, 0.0]  # AB ends, or ABC
    assert lex.final_score(state).tolist() == [0.0]
    state = lex.select_state(state, torch.tensor([0]), torch.tensor([ids[MARK]]))
    assert state.tolist() == [0]  # a new, empty word
    assert lex.max_gain() == (0.0, 0.0, False)  # 0 or -inf: a search may take it to add nothing


@pytest.mark.parametrize("dense_max", [None, 0])
def test_sparse_tables_equal_dense(dense_max):
    kw = {} if dense_max is None else {"dense_max_entries": dense_max}
    lex, ref = LexiconScorer(WORDS, PIECES, **kw), LexiconScorer(WORDS, PIECES)
    assert lex.dense == (dense_max is None)
    gen = torch.Generator().manual_seed(0)
    s1 = lex.init_state(4, 1, torch.device("cpu"))
    s2 = ref.init_state(4, 1, torch.device("cpu"))
    every = torch.arange(len(PIECES)).expand(4, -1)
    for _ in range(8):
        assert torch.equal(lex.score(s1, every), ref.score(s2, every))
        index = torch.randint(0, 4, (4,), generator=gen)
        toks = torch.randint(-1, len(PIECES), (4,), generator=gen)
        s1, s2 = lex.select_state(s1, index, toks), ref.select_state(s2, index, toks)
        assert torch.equal(s1, s2)
        assert torch.equal(lex.final_score(s1), ref.final_score(s2))


def test_with_word_lm_no_host_sync_and_lm_scores_unchanged(monkeypatch):
    """Lexicon + word LM in one search: no host sync; hypotheses are listed words and their fused score is
    the CTC score plus the word LM's own score of the same tokens."""
    from asrkit.lm import ngram_scorer

    tokens = CHARS[:3] + [MARK] + list("ACDEGHMNOST")
    words = ["THE", "CAT", "SAT", "ON", "MAT", "A", "DOG"]
    lm = ngram_scorer(FIXTURES / "words_3gram.arpa", tokens, units="word", unk_offset=-5.0)
    lex = LexiconScorer(words, tokens)
    ran = []
    monkeypatch.setattr(prefix_loop, "frame_loop", no_host_sync(prefix_loop.frame_loop, ran))
    gen = torch.Generator().manual_seed(2)
    ids = {t: i for i, t in enumerate(tokens)}
    lp = torch.randn(2, 30, len(tokens), generator=gen)
    for b, text in enumerate(["THE CAT SAT", "A DOG ON MAT"]):
        for i, ch in enumerate(text.replace(" ", MARK)):
            lp[b, 2 * i, ids[ch]] += 5.0
    lp = lp.log_softmax(-1)
    out = ctc_prefix_beam_search(lp, torch.tensor([30, 30]), beam=8, nbest=3, scorers={"lm": lm, "lexicon": lex},
                                 weights={"lm": 0.5, "lexicon": 1.0}, native=False)  # the torch loop's guard
    assert ran == ["frame_loop"]
    for hyps in out.to_lists():
        for h in hyps:
            assert allowed(tokens, h.tokens, words)
            state, total = lm.init_state(1, 1, torch.device("cpu")), 0.0
            for t in h.tokens:
                total += float(lm.score(state, torch.tensor([[t]]))[0, 0])
                state = lm.select_state(state, torch.tensor([0]), torch.tensor([t]))
            total += float(lm.final_score(state)[0])
            assert h.score - h.ctc_score == pytest.approx(0.5 * total, abs=1e-3)


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="no token starts with"):
        LexiconScorer(WORDS, ["<blank>", "A", "B"])
    with pytest.raises(ValueError, match="several marks"):
        LexiconScorer(WORDS, ["<blank>", MARK, "|", "A"])
    with pytest.raises(ValueError, match="empty"):
        LexiconScorer([" ", ""], CHARS)
    with pytest.raises(ValueError, match="none of the 1 words of the list can be spelled"):
        LexiconScorer(["xyz"], CHARS)
    with pytest.warns(UserWarning, match="1 of 2 words"):
        LexiconScorer(["AB", "ZZ"], CHARS)
    lex = LexiconScorer(["AB"], ["<blank>", "|", "A", "B"])  # '|' found as the boundary
    assert lex.word_boundary == "|"


def test_read_word_list(tmp_path):
    from asrkit.search.lexicon import read_word_list

    plain, lex = tmp_path / "words.txt", tmp_path / "lexicon.txt"
    plain.write_text("AB\n\nBA\n  C  \n", encoding="utf-8")
    lex.write_text("AB A B |\nABC A B C |\n", encoding="utf-8")
    assert read_word_list(plain) == ["AB", "BA", "C"]
    assert read_word_list(lex) == ["AB", "ABC"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt: the word list is empty"):
        read_word_list(empty)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"AB\n\xff\xfe\n")
    with pytest.raises(ValueError, match="bad.txt:2: not UTF-8"):
        read_word_list(bad)


@pytest.mark.parametrize("tokens", ["chars", "pieces"])
def test_word_lm_with_lexicon_equals_word_lm_plus_lexicon_scorer(tokens):
    """WordNgramScorer(lexicon=...) is the same search as the word LM fused with LexiconScorer: the same
    N-best, the same scores (listed words outside the LM included: they score as <unk>)."""
    from asrkit.lm import ngram_scorer

    letters = list("ACDEGHMNOST")
    toks = CHARS[:4] + letters if tokens == "chars" else \
        CHARS[:4] + [MARK + w for w in ("THE", "CAT", "A", "ON")] + ["AT", "HE", "OG"] + letters
    words = ["THE", "CAT", "SAT", "ON", "MAT", "A", "DOG", "DOGS", "TOAST"]  # DOGS, TOAST: not in the LM
    path = FIXTURES / "words_3gram.arpa"
    fused = ngram_scorer(path, toks, units="word", unk_offset=-3.0, lexicon=words)
    plain = ngram_scorer(path, toks, units="word", unk_offset=-3.0)
    lex = LexiconScorer(words, toks)
    gen = torch.Generator().manual_seed(7)
    ids = {t: i for i, t in enumerate(toks)}
    lp = torch.randn(3, 48, len(toks), generator=gen)
    for b, text in enumerate(["THE CAT SAT ON THE MAT", "A DOGS TOAST", "THE COAT ON A DOG"]):
        for i, ch in enumerate(text.replace(" ", MARK)):
            lp[b, 2 * i, ids[ch]] += 4.0
    lp = lp.log_softmax(-1)
    kw = dict(beam=6, nbest=6, token_topk=None, token_min_logp=None, blank_skip_threshold=None)
    one = ctc_prefix_beam_search(lp, torch.tensor([48, 40, 45]), scorers={"lm": fused}, weights={"lm": 0.6}, **kw)
    two = ctc_prefix_beam_search(lp, torch.tensor([48, 40, 45]), scorers={"lm": plain, "lexicon": lex},
                                 weights={"lm": 0.6, "lexicon": 1.0}, **kw)
    assert torch.equal(one.tokens, two.tokens) and torch.equal(one.lengths, two.lengths)
    torch.testing.assert_close(one.scores, two.scores, atol=1e-4, rtol=0)
    texts = ["".join(toks[t] for t in h.tokens) for h in one.best()]
    assert any("DOGS" in t or "TOAST" in t for t in texts), texts  # a listed word outside the LM is reachable
    for hyps in one.to_lists():
        assert all(allowed(toks, h.tokens, words) for h in hyps)


def prefix_state(tokens, ids, words, blank, unk, eos, mark):
    """Reference, token by token: the partial word after `ids`, or None once a token left the listed words."""
    part = ""
    for i in ids:
        tok = tokens[i]
        if i == blank or (not tok and i not in (unk, eos)):
            continue  # the blank and empty tokens change nothing
        if i == unk:
            return None
        if i == eos or tok.startswith(mark):
            if part and part not in words:
                return None
            part = part if i == eos else tok[len(mark):]
        else:
            part += tok
        if part and not any(w.startswith(part) for w in words):
            return None
    return part


# (tokens, words, keyword arguments): special ids by other names or given, an empty token, a lexicon that
# lists the <unk> token's name, pieces only (no letter token: no trie edges), a piece that starts no word
CASES = [  # ..., and a 7-token sequence that stays on listed words
    (CHARS, WORDS + ["<unk>"], {}, [4, 5, 3, 6, 3, 4, 5]),
    (["<b>", "[UNK]", "</s>", MARK, "A", "B", "C", ""], WORDS + ["[UNK]"], dict(blank_id=0, unk_id=1),
     [4, 7, 5, 3, 6, 2, 3]),
    (["<blank>", "<unk>", "<eos>", "|", "A", "B", "C", MARK + "A"], WORDS, dict(word_boundary="|"),
     [4, 5, 3, 6, 2, 4, 5]),
    (["<blank>", "<end>", MARK + "AB", MARK + "C", MARK + "BA", MARK + "Z"], WORDS, dict(sos_eos_id=1),
     [2, 3, 0, 4, 1, 2, 0]),
]


@pytest.mark.filterwarnings("ignore:LexiconScorer")  # the listed <unk> names cannot be spelled: intended
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dense_max", [None, 1])
def test_every_token_against_the_reference_rule(case, dense_max):
    """Catches: a special token (by any of its names, or given by id) treated as letters, an empty token
    not skipped, a dead end that a boundary revives, a word-initial piece outside the trie, a trie without
    letter edges, the dense/sparse tables or final_score disagreeing with the rule."""
    tokens, words, kw, valid = CASES[case]
    lex = LexiconScorer(words, tokens, **kw, **({} if dense_max is None else {"dense_max_entries": dense_max}))
    assert lex.dense == (dense_max is None)
    names = {t: i for i, t in enumerate(tokens)}
    blank = kw.get("blank_id", 0)
    unk = kw.get("unk_id", names.get("<unk>"))
    eos = kw.get("sos_eos_id", next((names[n] for n in ("<sos/eos>", "</s>", "<eos>") if n in names), None))
    mark = kw.get("word_boundary", MARK)
    rng = torch.Generator().manual_seed(case)
    n, steps = 64, 7
    seqs = torch.randint(0, len(tokens), (n, steps), generator=rng)
    seqs[:8] = torch.tensor(valid)
    state = lex.init_state(n, 1, torch.device("cpu"))
    every = torch.arange(len(tokens)).expand(n, -1)
    for t in range(steps):
        got = lex.score(state, every)
        for r in range(n):
            for tok in range(len(tokens)):
                ok = prefix_state(tokens, seqs[r, :t].tolist() + [tok], words, blank, unk, eos, mark) is not None
                assert float(got[r, tok]) == (0.0 if ok else -math.inf), (tokens, seqs[r, :t].tolist(), tok)
        state = lex.select_state(state, torch.arange(n), seqs[:, t])
        final = lex.final_score(state)
        for r in range(n):
            part = prefix_state(tokens, seqs[r, :t + 1].tolist(), words, blank, unk, eos, mark)
            ok = part is not None and (not part or part in words)
            assert float(final[r]) == (0.0 if ok else -math.inf)
    assert prefix_state(tokens, valid, words, blank, unk, eos, mark) is not None
    assert bool((final[:8] == 0.0).all())  # the valid rows end after a whole word


def test_error_messages_name_the_problem_exactly():
    with pytest.raises(ValueError, match="^LexiconScorer: the word list is empty$"):
        LexiconScorer([" "], CHARS)
    for what in ("sos_eos_id", "unk_id", "blank_id"):
        with pytest.raises(ValueError, match=f"^LexiconScorer: {what}=7 is outside the token list \\(0 \\.\\. 6\\)$"):
            LexiconScorer(WORDS, CHARS, **{what: 7})
    many = ["<blank>", MARK] + [chr(0x100 + i) for i in range(70)]
    with pytest.raises(ValueError) as err:
        LexiconScorer(["zz", "zy", "zx", "zw", "zv", "zu"], many)
    letters = "".join(sorted(set("".join(many[1:]))))
    # nothing of the list is quoted: a file that is no word list may be any file (issue 28 item 25)
    assert str(err.value) == (f"LexiconScorer: none of the 6 words of the list can be spelled with these tokens "
                              f"(is it a word list? token letters: {letters[:60]!r})")
    twelve = ["<blank>"] + [chr(0x61 + i) for i in range(12)]
    with pytest.raises(ValueError) as err:
        LexiconScorer(WORDS, twelve)
    shown = ", ".join(repr(t) for t in twelve[1:])
    assert str(err.value) == ("LexiconScorer needs one word-boundary mark (no token starts with '\u2581' or '|' "
                              f"or ' '); tokens: [{shown}]")
    with pytest.raises(ValueError) as err:
        LexiconScorer(WORDS, twelve + ["m"], word_boundary="#")
    assert str(err.value).endswith(f"(no token starts with '#'); tokens: [{shown}, ...]")
    with pytest.raises(ValueError, match="no token starts with ''"):
        LexiconScorer(WORDS, CHARS, word_boundary="")


def test_unspellable_words_warn_at_the_callers_line():
    with pytest.warns(UserWarning) as rec:
        LexiconScorer(["AB", "XX", "Q1", "Q2", "Q3", "Q4", "Q5"], CHARS)
    message = str(rec[0].message)
    assert message.endswith("6 of 7 words have letters no token has and can never be output, e.g. 'Q1', 'Q2', 'Q3'")
    # stacklevel: the warning names the caller's line, not the library's own (the caller is this file, or
    # the trampoline of a mutation-testing run)
    assert rec[0].filename != lexicon_module.__file__
