"""The token n-gram scorer's dense state machine against its lookup path, and the prefix closure."""
import itertools
import math
import random

import pytest
import torch

import asrkit.search.ctc_prefix as ctc_prefix
import asrkit.search.prefix_loop as prefix_loop
from asrkit.lm import NgramScorer, load_ngram, ngram_scorer
from asrkit.search import ctc_prefix_beam_search
from gain_bound import worst_gain
from host_sync import no_host_sync
from test_ngram import FIXTURES, LN10, TOL, WORDS, RefLM, write_random_arpa

DENSE_TOL = 1e-5  # plus rtol 1e-6: the float32 ulp at -230 (a missing <unk>) is 1.5e-5


def walk_both(dense, lookup, vocab, rng, n=8, steps=14):
    """Score every token with both scorers along random beam-style walks (blanks, -1, sos/eos,
    duplicated rows) and assert they agree; returns the walked token lists."""
    cpu = torch.device("cpu")
    sd, sl = dense.init_state(n // 2, 2, cpu), lookup.init_state(n // 2, 2, cpu)
    cand = torch.arange(vocab).expand(n, vocab)
    walks = [[] for _ in range(n)]
    for _ in range(steps):
        torch.testing.assert_close(dense.score(sd, cand), lookup.score(sl, cand), atol=DENSE_TOL, rtol=1e-6)
        torch.testing.assert_close(dense.final_score(sd), lookup.final_score(sl), atol=DENSE_TOL, rtol=1e-6)
        index = [rng.randrange(n) for _ in range(n)]
        picks = [rng.choice([-1, 0, 2] + list(range(1, vocab)) * 3) for _ in range(n)]
        sd = dense.select_state(sd, torch.tensor(index), torch.tensor(picks))
        sl = lookup.select_state(sl, torch.tensor(index), torch.tensor(picks))
        walks = [walks[i] + [t] for i, t in zip(index, picks)]
    torch.testing.assert_close(dense.final_score(sd), lookup.final_score(sl), atol=DENSE_TOL, rtol=1e-6)
    return walks


def both_paths(lm, tokens, **kw):
    dense, lookup = NgramScorer(lm, tokens, dense=True, **kw), NgramScorer(lm, tokens, dense=False, **kw)
    assert dense.dense and not lookup.dense
    return dense, lookup


# tokens the LM lacks ("OOV", "ZZ"), a duplicated piece ("CAT" twice) and one that is an LM word only as <s>
TOKENS = ["<blank>", "<unk>", "<sos/eos>"] + WORDS + ["OOV", "CAT", "ZZ", "<s>"]


@pytest.mark.parametrize("order,closed", [(1, True), (2, True), (2, False), (3, False), (4, True), (4, False),
                                          (5, False)])
def test_dense_equals_lookup_on_random_lms(tmp_path, order, closed):
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=100 + order * 2 + closed, closed=closed)
    lm = load_ngram(path)
    dense, lookup = both_paths(lm, TOKENS)
    assert dense.logp.shape == dense.next_state.shape == (lm.num_states, len(TOKENS))
    assert dense.logp.dtype == torch.float32 and dense.next_state.dtype == torch.int32
    walk_both(dense, lookup, len(TOKENS), random.Random(order))


@pytest.mark.parametrize("name", ["words_3gram", "words_3gram_pruned", "chars_2gram", "no_unk_2gram"])
def test_dense_equals_lookup_on_fixtures(name):
    lm = load_ngram(FIXTURES / f"{name}.arpa")
    words = sorted(w for w in lm.vocab if w[0] != "<")
    extra = [w for w in ("\u2581", "A", "B", "C", "Z", "MAYBE") if w not in words][:len(words)]  # a token LM still
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + sorted(words + extra)
    walk_both(*both_paths(lm, tokens), len(tokens), random.Random(len(name)))


def test_dense_with_other_special_ids(tmp_path):
    """blank and sos/eos elsewhere in the token list (sos/eos = the last token)."""
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, 3, seed=9, closed=False)
    tokens = ["<unk>", "<blank>"] + WORDS + ["<sos/eos>"]
    dense, lookup = both_paths(load_ngram(path), tokens, blank_id=1, sos_eos_id=len(tokens) - 1)
    rng = random.Random(3)
    cand = torch.arange(len(tokens)).expand(4, -1)
    sd, sl = dense.init_state(4, 1, torch.device("cpu")), lookup.init_state(4, 1, torch.device("cpu"))
    for _ in range(10):
        torch.testing.assert_close(dense.score(sd, cand), lookup.score(sl, cand), atol=DENSE_TOL, rtol=1e-6)
        assert (dense.score(sd, cand)[:, 1] == 0).all()
        picks = torch.tensor([rng.randrange(-1, len(tokens)) for _ in range(4)])
        sd, sl = dense.select_state(sd, torch.arange(4), picks), lookup.select_state(sl, torch.arange(4), picks)
    torch.testing.assert_close(dense.final_score(sd), lookup.final_score(sl), atol=DENSE_TOL, rtol=1e-6)


def test_dense_is_chosen_by_size():
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    tokens = ["<blank>", "<unk>", "<sos/eos>", "THE", "CAT"]
    entries = lm.num_states * len(tokens)
    assert NgramScorer(lm, tokens).dense
    assert NgramScorer(lm, tokens, dense_max_entries=entries).dense
    assert not NgramScorer(lm, tokens, dense_max_entries=entries - 1).dense
    assert NgramScorer(lm, tokens, dense=True, dense_max_entries=entries).dense
    assert not NgramScorer(lm, tokens, dense=False).dense
    assert not ngram_scorer(lm, tokens, units="token", dense_max_entries=entries - 1).dense
    assert ngram_scorer(lm, tokens, units="token", dense=True, dense_max_entries=entries).dense


def test_dense_tables_over_the_limit_are_refused_with_their_size_before_allocating(monkeypatch):
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + ["THE", "CAT"] * 10000  # 21 states x 20,003 tokens: 3.2 MB
    monkeypatch.setattr(lm, "dense_tables", lambda *a: pytest.fail("built the tables it refuses"))
    entries = lm.num_states * len(tokens)
    assert entries == 420063
    with pytest.raises(ValueError, match=rf"^dense tables of 21 LM states x 20003 tokens = {entries} entries "
                                         rf"\(3.2 MB\) exceed dense_max_entries={entries - 1}: leave dense "
                                         rf"unset \(the lookup path\) or raise the limit$"):
        NgramScorer(lm, tokens, dense=True, dense_max_entries=entries - 1)


MEASURE_DENSE = """
import resource, sys
import torch
from asrkit.lm.arpa import ArpaLM
from asrkit.lm.ngram import NgramLM
words = [f"W{i}" for i in range(2000)]
uni = {(w,): (-3.0, -0.5) for w in ["<s>", "</s>", "<unk>"] + words}
bi = {(words[i], words[(7 * i + j) % 2000]): (-1.0, -0.2) for i in range(2000) for j in range(5)}
tri = {(a, b, words[(3 * i) % 2000]): (-0.5, 0.0) for i, (a, b) in enumerate(list(bi)[:2000])}
lm = NgramLM(ArpaLM(order=3, ngrams=[uni, bi, tri]))
cols = torch.tensor([lm.word_to_id[w] for w in ("<unk>", "W1", "W2", "W3", "</s>")])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
logp, nxt, eos = lm.dense_tables(cols)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown // 1024, lm.num_states, tuple(logp.shape) == (lm.num_states, 5))
"""


def test_dense_tables_work_in_the_columns_not_the_whole_vocabulary():
    # The tables of 5 columns (14,000 states) used work rows over all 2,003 words: 12,000 x 2,003 x 12 bytes,
    # 296 MB here, the 22 GB of a word 3-gram mistaken for a token LM. Measured in a fresh process (RSS peak).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEASURE_DENSE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    grown_mb, states, shape_ok = out.stdout.split()
    assert int(states) > 12000 and shape_ok == "True" and int(grown_mb) < 60, out.stdout


# ---------------------------------------------------------------- closure under prefixes
# A 4-gram model whose listed n-grams lack contexts at every level ("A B C" and "A B" for the
# 4-gram "A B C D", "X Y" for "X Y Z", the suffix "C D" of "B C D"), with back-offs on the
# contexts that are listed, so a wrong inserted probability or back-off would show.
HOLES = """\\data\\
ngram 1=10
ngram 2=5
ngram 3=3
ngram 4=2

\\1-grams:
-1.3\t<unk>\t0
-99\t<s>\t-0.4
-1.1\t</s>
-0.9\tA\t-0.3
-1.0\tB\t-0.25
-1.2\tC\t-0.2
-1.4\tD\t-0.1
-1.5\tX\t-0.35
-1.6\tY\t-0.45
-1.7\tZ\t-0.15

\\2-grams:
-0.5\t<s> A\t-0.2
-0.6\tB C\t-0.3
-0.7\tY Z\t-0.12
-0.8\tC </s>
-0.4\tA D\t-0.5

\\3-grams:
-0.3\tB C D\t-0.22
-0.2\tX Y Z\t-0.33
-0.25\t<s> A D\t-0.1

\\4-grams:
-0.1\tA B C D
-0.15\t<s> A D Z

\\end\\
"""


def test_prefix_closure_changes_no_score(tmp_path):
    """Every history of up to order-1 words (after <s> or not) and every word: the closed tables
    give the dictionary reference's score, and the dense automaton the same."""
    path = tmp_path / "holes.arpa"
    path.write_text(HOLES, encoding="utf-8")
    lm, ref = load_ngram(path), RefLM(path)
    # inserted: 3-grams "A B C" (prefix) and "A D Z" (suffix); 2-grams "A B", "X Y" (prefixes), "C D", "D Z"
    assert lm.sizes[1:] == [5 + 4, 3 + 2, 2]
    assert lm.num_states == 10 + 9 + 5
    words = ["A", "B", "C", "D", "X", "Y", "Z", "</s>", "<unk>"]
    hists = [["<s>"] + list(h) for n in range(3) for h in itertools.product(words[:7], repeat=n)]
    hists += [list(h) for h in itertools.product(words[:7], repeat=3)]
    rows = len(hists)
    hist = torch.tensor([[lm.pad_id] * (3 - len(h)) + [lm.index(w) for w in h] for h in hists])
    cand = torch.tensor([lm.index(w) for w in words]).expand(rows, -1)
    got = lm.logprob(hist, lm.backoff_sums(hist), cand)
    want = torch.tensor([[ref.logprob(h if h[0] == "<s>" else ["<x>"] + h, w) for w in words] for h in hists])
    torch.testing.assert_close(got, want.float(), atol=TOL, rtol=0)
    # the automaton: walk each history from <s> (the ones without <s> start after "<s> Z Z Z")
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + words[:7]
    dense, lookup = both_paths(lm, tokens)
    prefix = ["Z", "Z", "Z"]
    state = dense.init_state(rows, 1, torch.device("cpu"))
    walked = [h[1:] if h[0] == "<s>" else prefix + h for h in hists]
    for t in range(max(map(len, walked))):
        toks = torch.tensor([tokens.index(w[t]) if t < len(w) else -1 for w in walked])
        state = dense.select_state(state, torch.arange(rows), toks)
    got = dense.score(state, torch.arange(3, len(tokens)).expand(rows, -1))
    want = torch.tensor([[ref.logprob(["<s>"] + w, x) for x in tokens[3:]] for w in walked])
    torch.testing.assert_close(got, want.float(), atol=TOL, rtol=0)
    walk_both(dense, lookup, len(tokens), random.Random(5), steps=20)


def test_pruned_fixture_gets_its_missing_context():
    lm = load_ngram(FIXTURES / "words_3gram_pruned.arpa")
    # 9 listed bigrams + "CAT SAT" (suffix of "THE CAT SAT") + "A DOG" (prefix of "A DOG SAT")
    assert lm.sizes[1] == 11 and lm.num_states == 10 + 11
    ids = torch.tensor([[lm.index("A"), lm.index("DOG")]])
    assert lm._lookup(2, ids[:, 0], ids[:, 1]).item() >= 0
    # P(DOG | <s> A) = bo(<s> A) + P(A DOG), the inserted P(A DOG) = bo(A) + P(DOG): as before
    assert lm.sentence_logprobs(["A", "DOG"], eos=False)[1] == pytest.approx((-0.1 - 0.35 - 1.6) * LN10, abs=TOL)


# ---------------------------------------------------------------- inside the search
def test_dense_scorer_in_prefix_search_never_syncs_and_equals_lookup(tmp_path, monkeypatch):
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, 4, seed=11, closed=False)
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + WORDS
    lm = load_ngram(path)
    dense, lookup = both_paths(lm, tokens)

    ran: list = []
    guarded = no_host_sync(prefix_loop.frame_loop, ran)
    gen = torch.Generator().manual_seed(4)
    lp = torch.randn(3, 40, len(tokens), generator=gen).mul(3).log_softmax(-1)
    lengths = torch.tensor([40, 17, 33])
    results = []
    for scorer in (dense, lookup):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(prefix_loop, "frame_loop", guarded)
            results.append(ctc_prefix_beam_search(lp, lengths, beam=6, scorers={"lm": scorer},
                                                  weights={"lm": 0.7, "length_bonus": 0.5}, native=False))
    assert len(ran) == 2
    assert results[0].to_lists() and torch.equal(results[0].tokens, results[1].tokens)
    torch.testing.assert_close(results[0].scores, results[1].scores, atol=1e-4, rtol=0)


# ---------------------------------------------------------------- context-state tables (one searchsorted)
def assert_state_tables_match_dense(lm):
    """Every state and every word: NgramLM.state_logprob gives the dense automaton's score and next state."""
    words = torch.arange(len(lm.vocab))
    logp, next_state, eos = lm.dense_tables(words)
    states = torch.arange(lm.num_states)
    got_lp, got_next = lm.state_logprob(states, words.expand(len(states), -1))
    assert got_lp.dtype == torch.float32 and got_next.dtype == torch.long
    torch.testing.assert_close(got_lp, logp, atol=DENSE_TOL, rtol=1e-6)
    assert torch.equal(got_next, next_state.long())
    tables = lm.state_tables()
    torch.testing.assert_close(tables.eos, eos, atol=DENSE_TOL, rtol=1e-6)
    assert tables.chain_keys.shape == tables.backoff.shape == (lm.num_states, lm.order)
    assert len(tables.keys) == sum(lm.sizes[1:]) + len(lm.vocab) + lm.num_states + 1  # n-grams, (s, pad), sentinel
    # the pad word is the identity: ln P 0, the same state
    pad = torch.full((len(states), 1), lm.pad_id)
    lp, nxt = lm.word_logprob(states, pad)
    assert torch.equal(lp, torch.zeros_like(lp)) and torch.equal(nxt[:, 0], states)


@pytest.mark.parametrize("order,closed", [(1, True), (2, False), (3, True), (3, False), (4, False), (5, True),
                                          (5, False)])
def test_state_tables_equal_dense_on_random_lms(tmp_path, order, closed):
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=200 + order * 2 + closed, closed=closed)
    assert_state_tables_match_dense(load_ngram(path))


@pytest.mark.parametrize("name", ["words_3gram", "words_3gram_pruned", "chars_2gram", "no_unk_2gram", "holes"])
def test_state_tables_equal_dense_on_fixtures(tmp_path, name):
    if name == "holes":
        path = tmp_path / "holes.arpa"
        path.write_text(HOLES, encoding="utf-8")
    else:
        path = FIXTURES / f"{name}.arpa"
    assert_state_tables_match_dense(load_ngram(path))


def test_state_walk_matches_reference(tmp_path):
    """Histories walked through next states from the start state score as the dictionary reference."""
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, 4, seed=17, closed=False)
    lm, ref = load_ngram(path), RefLM(path)
    rng = random.Random(2)
    sents = [rng.choices(WORDS + ["</s>", "<unk>"], k=rng.randint(0, 9)) for _ in range(12)]
    state = torch.full((len(sents),), lm.start_state)
    cand = torch.tensor([lm.index(w) for w in WORDS + ["</s>", "<unk>"]])
    for t in range(max(map(len, sents)) + 1):
        lp, nxt = lm.state_logprob(state, cand.expand(len(sents), -1))
        for r, sent in enumerate(sents):
            if t <= len(sent):
                want = [ref.logprob(["<s>"] + sent[:t], w) for w in WORDS + ["</s>", "<unk>"]]
                assert lp[r].tolist() == pytest.approx(want, abs=TOL)
        step = torch.tensor([lm.index(s[t]) if t < len(s) else lm.eos_id for s in sents])
        state = nxt.gather(1, (cand == step.unsqueeze(1)).long().argmax(1, keepdim=True)).squeeze(1)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_the_gain_bound_holds_on_both_paths(tmp_path, order):
    # What a search may assume the LM adds at most (asrkit.search.beam_search's early stop): per token, and once
    # more for </s>; positive back-offs can lift a score above 0.
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=40 + order, closed=False)
    rng = random.Random(order)
    for scorer in both_paths(load_ngram(path), TOKENS):
        walks = [[rng.randrange(3, len(TOKENS)) for _ in range(12)] for _ in range(50)]
        worst_gain(scorer, walks, eos=2)
        once, per = scorer.max_gain()[:2]
        assert once >= 0 and per >= 0
    dense, lookup = both_paths(load_ngram(path), TOKENS)
    assert dense.max_gain()[0] <= lookup.max_gain()[0] + 1e-6  # the dense tables' bound is exact, lookup's above it
    # a model whose scores are all log-probabilities below 0 (no positive back-off): nothing to gain
    chars = load_ngram(FIXTURES / "chars_2gram.arpa")
    for scorer in both_paths(chars, ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "C"]):
        assert scorer.max_gain() == (0.0, 0.0, False)


def ref_max_logprobs(arpa, vocab):
    """ln of max over every n-gram g = c + w and every state s (a substring of the model's n-grams, of 1 .. order-1
    words) that ends in c, of P(g) times the back-offs of the suffixes of s longer than c: per word w, from the
    ARPA's own dictionaries (read_arpa)."""
    table = {g: v for order in arpa.ngrams for g, v in order.items()}
    states = {g[i:j] for g in table for i in range(len(g)) for j in range(i + 1, min(len(g), i + arpa.order - 1) + 1)}
    states = states or {()}  # an order-1 model has one state, the empty context
    best = {w: -math.inf for w in vocab}
    for s in states:
        for j in range(len(s), -1, -1):  # the context: the last j words of s
            ctx = s[len(s) - j:]
            on_top = sum(table.get(s[len(s) - i:], (0.0, 0.0))[1] for i in range(j + 1, len(s) + 1))
            for g, (prob, _) in table.items():
                if g[:-1] == ctx:
                    best[g[-1]] = max(best[g[-1]], (prob + on_top) * LN10)
    return [best[w] for w in vocab]


@pytest.mark.parametrize("order,closed", [(1, True), (2, False), (3, False), (3, True)])
def test_max_logprobs_equal_a_reference_from_the_arpa(tmp_path, order, closed):
    from asrkit.lm import read_arpa

    path = write_random_arpa(tmp_path / "lm.arpa", WORDS[:6], order, seed=60 + order + closed, closed=closed)
    lm = load_ngram(path)
    got = lm.max_logprobs()
    assert got.shape == (len(lm.vocab),) and got.dtype == torch.float32
    want = ref_max_logprobs(read_arpa(path), lm.vocab[:-1] if lm.vocab[-1] == "<unk>" else lm.vocab)
    torch.testing.assert_close(got[:len(want)], torch.tensor(want), atol=1e-5, rtol=1e-6)
    # and no history scores a word above its bound (every state, every word: the dense tables)
    exact = lm.dense_tables(torch.arange(len(lm.vocab)))[0].max(0).values
    assert bool((exact <= got + 1e-5).all())
