"""Tensor n-gram LM and its search scorers against a dictionary back-off reference (and KenLM)."""
import gzip
import math
import random
import shutil
from pathlib import Path

import pytest
import torch

from asrkit.lm import NgramScorer, WordNgramScorer, load_ngram, ngram_scorer

FIXTURES = Path(__file__).parent / "fixtures"
LN10 = math.log(10.0)
TOL = 1e-4


# ---------------------------------------------------------------- dictionary reference
class RefLM:
    """Plain dict back-off LM: its own ARPA reader and the textbook recursion (log10 inside, ln out)."""

    def __init__(self, path):
        opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
        self.table, self.order, k = {}, 0, 0
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if line.startswith("\\") and line.endswith("-grams:"):
                    k = int(line[1:line.index("-")])
                    self.order = max(self.order, k)
                elif line == "\\end\\":
                    k = 0
                elif k and line:
                    f = line.split()
                    self.table[tuple(f[1:k + 1])] = (float(f[0]), float(f[k + 1]) if len(f) > k + 1 else 0.0)
        self.table.setdefault(("<unk>",), (-100.0, 0.0))
        self.words = {w[0] for w in self.table if len(w) == 1}

    def logprob(self, history, word):
        """ln P(word | history); history is a list of words starting with <s>."""
        word = word if word in self.words else "<unk>"
        ctx = tuple(w if w in self.words else "<unk>" for w in history)[-(self.order - 1):] if self.order > 1 else ()
        total = 0.0
        while ctx + (word,) not in self.table:
            total += self.table.get(ctx, (0.0, 0.0))[1]
            ctx = ctx[1:]
        return (total + self.table[ctx + (word,)][0]) * LN10

    def sentence(self, words):
        hist, total = ["<s>"], 0.0
        for w in list(words) + ["</s>"]:
            total += self.logprob(hist, w)
            hist.append(w)
        return total


def write_random_arpa(path, words, order, seed, closed=True):
    """A random back-off model (probabilities need not normalise). closed=False drops some
    contexts and suffixes of kept n-grams, as SRILM pruning does; KenLM rejects those files."""
    rng = random.Random(seed)
    sents = [["<s>"] + rng.choices(words, k=rng.randint(1, 7)) + ["</s>"] for _ in range(60)]
    grams = [set() for _ in range(order)]
    grams[0] = {(w,) for w in ["<unk>", "<s>", "</s>"] + words}
    for s in sents:
        for k in range(2, order + 1):
            for i in range(len(s) - k + 1):
                if rng.random() < 0.5:
                    grams[k - 1].add(tuple(s[i:i + k]))
    for k in range(order, 2, -1):  # closure, then optionally break it
        for g in sorted(grams[k - 1]):  # sorted: the same file in every process (str hashes vary)
            for sub in (g[:-1], g[1:]):
                if closed or rng.random() < 0.7:
                    grams[k - 2].add(sub)
    lines = ["\\data\\"] + [f"ngram {k + 1}={len(g)}" for k, g in enumerate(grams)] + [""]
    for k, g in enumerate(grams):
        lines.append(f"\\{k + 1}-grams:")
        for gram in sorted(g):
            prob = -99.0 if gram == ("<s>",) else round(rng.uniform(-2.5, -0.05), 4)
            fields = [f"{prob}", " ".join(gram)]
            if k + 1 < order and gram[-1] != "</s>" and rng.random() < 0.8:
                fields.append(f"{round(rng.uniform(-0.8, 0.3), 4)}")
            lines.append("\t".join(fields))
        lines.append("")
    lines.append("\\end\\")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


SENTENCES = ["THE CAT SAT ON THE MAT", "A DOG SAT", "A DOG SAT ON THE CAT", "ZEBRA THE CAT", "CAT ZEBRA SAT",
             "THE CAT SAT", "MAT MAT MAT", "", "A B \u2581 C", "\u2581 A ZZ B C", "YES NO", "YES MAYBE"]


# ---------------------------------------------------------------- the LM itself
@pytest.mark.parametrize("name", ["words_3gram", "words_3gram_pruned", "chars_2gram", "no_unk_2gram"])
def test_fixture_sentences_match_reference(name):
    path = FIXTURES / f"{name}.arpa"
    lm, ref = load_ngram(path), RefLM(path)
    for sent in SENTENCES:
        words, hist = sent.split(), ["<s>"]
        got = lm.sentence_logprobs(words)
        for w, g in zip(words + ["</s>"], got):
            assert g == pytest.approx(ref.logprob(hist, w), abs=TOL), (name, sent, w)
            hist.append(w)


def test_backoff_paths_by_hand():
    lm = load_ngram(FIXTURES / "words_3gram_pruned.arpa")
    got = lm.sentence_logprobs("THE CAT SAT ZEBRA".split(), eos=False)
    # THE|<s>: bigram; CAT|<s> THE: trigram; SAT|THE CAT: trigram whose suffix "CAT SAT" is absent;
    # ZEBRA -> <unk>|CAT SAT: bo(CAT SAT)=0 (absent), bo(SAT)=-0.2, P(<unk>)=-1.5
    want = [-0.4, -0.2, -0.35, -0.2 - 1.5]
    assert got == pytest.approx([w * LN10 for w in want], abs=TOL)
    # A DOG SAT: the trigram is present although its context "A DOG" is not
    assert lm.sentence_logprobs(["A", "DOG", "SAT"], eos=False)[2] == pytest.approx(-0.5 * LN10, abs=TOL)


def test_missing_unk_gets_minus_100():
    lm = load_ngram(FIXTURES / "no_unk_2gram.arpa")
    assert lm.sentence_logprobs(["MAYBE"], eos=False)[0] == pytest.approx(-100 * LN10 - 0.5 * LN10, abs=TOL)


def test_gzip_loads_the_same(tmp_path):
    gz = tmp_path / "lm.arpa.gz"
    with open(FIXTURES / "words_3gram.arpa", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    words = "A DOG SAT ON THE MAT".split()
    assert load_ngram(gz).sentence_logprobs(words) == load_ngram(FIXTURES / "words_3gram.arpa").sentence_logprobs(words)


def test_ngram_word_missing_from_unigrams(tmp_path):
    path = tmp_path / "bad.arpa"
    path.write_text("\\data\\\nngram 1=3\nngram 2=1\n\n\\1-grams:\n-1\t<s>\n-1\t</s>\n-1\tA\n\n"
                    "\\2-grams:\n-1\tB A\n\n\\end\\\n", encoding="utf-8")
    with pytest.raises(ValueError, match="word 'B' occurs in the 2-gram 'B A' but not in the 1-grams"):
        load_ngram(path)


# ---------------------------------------------------------------- token-unit scorer
WORDS = ["THE", "THEY", "THEN", "CAT", "CATS", "CAR", "A", "AT", "SAT", "ON", "ONE", "DOG"]


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("order,closed", [(1, True), (2, False), (3, False), (4, True), (4, False)])
def test_token_scorer_batched_matches_reference(tmp_path, order, closed, dense):
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=order * 10 + closed, closed=closed)
    ref = RefLM(path)
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + WORDS + ["OOV"]
    scorer = NgramScorer(load_ngram(path), tokens, dense=dense)
    assert scorer.dense == dense
    rng = random.Random(order)
    n, vocab = 6, len(tokens)
    state = scorer.init_state(2, 3, torch.device("cpu"))
    hists = [["<s>"] for _ in range(n)]
    totals = torch.zeros(n, dtype=torch.float64)
    ref_totals = [0.0] * n
    cand = torch.arange(vocab).expand(n, vocab)
    for _ in range(12):
        got = scorer.score(state, cand)  # (N, V)
        for r in range(n):
            want = [0.0, ref.logprob(hists[r], "<unk>"), ref.logprob(hists[r], "</s>")]
            want += [ref.logprob(hists[r], w) for w in tokens[3:]]
            assert got[r].tolist() == pytest.approx(want, abs=TOL)
        index = torch.tensor([rng.randrange(n) for _ in range(n)])  # beam-style duplication
        picks = torch.tensor([rng.choice([-1, 0, 2] + list(range(1, vocab)) * 2) for _ in range(n)])
        # sos/eos ends a hypothesis in a real search: here it must leave the state unchanged
        totals = totals[index] + torch.where((picks >= 0) & (picks != 2), got[index, picks.clamp(min=0)], 0.0)
        hists = [list(hists[i]) for i in index.tolist()]
        ref_totals = [ref_totals[i] for i in index.tolist()]
        for r, t in enumerate(picks.tolist()):
            if t not in (-1, 0, 2):
                ref_totals[r] += ref.logprob(hists[r], tokens[t])
                hists[r].append(tokens[t])
        state = scorer.select_state(state, index, picks)
    final = scorer.final_score(state)
    for r in range(n):
        assert float(totals[r] + final[r]) == pytest.approx(ref.sentence(hists[r][1:]), abs=1e-3)
        assert float(totals[r]) == pytest.approx(ref_totals[r], abs=1e-3)


@pytest.mark.parametrize("dense", [True, False])
def test_token_units_with_char_pieces(dense):
    tokens = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "C", "Z"]
    scorer = ngram_scorer(FIXTURES / "chars_2gram.arpa", tokens, units="token", dense=dense)
    assert scorer.dense == dense
    ref = RefLM(FIXTURES / "chars_2gram.arpa")
    state = scorer.init_state(1, 1, torch.device("cpu"))
    state = scorer.select_state(state, torch.tensor([0]), torch.tensor([4]))  # "A"
    got = scorer.score(state, torch.tensor([[0, 1, 2, 5, 7, 3]]))[0]
    want = [0.0, ref.logprob(["<s>", "A"], "<unk>"), ref.logprob(["<s>", "A"], "</s>"),
            ref.logprob(["<s>", "A"], "B"), ref.logprob(["<s>", "A"], "Z"), ref.logprob(["<s>", "A"], "\u2581")]
    assert got.tolist() == pytest.approx(want, abs=TOL)
    assert got[4] == got[1]  # a token the LM lacks scores as <unk>


@pytest.mark.parametrize("order", [2, 3, 4])
def test_kenlm_agrees(tmp_path, order):
    kenlm = pytest.importorskip("kenlm")
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=order, closed=True)
    lm, model = load_ngram(path), kenlm.Model(str(path))
    rng = random.Random(order)
    for _ in range(30):
        words = rng.choices(WORDS + ["OOV"], k=rng.randint(0, 8))
        want = [s[0] * LN10 for s in model.full_scores(" ".join(words))]
        assert lm.sentence_logprobs(words) == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_token_scorer_agrees_with_kenlm(tmp_path, order, dense):
    """Both scorer paths, a batch of random sentences scored token by token, against KenLM."""
    kenlm = pytest.importorskip("kenlm")
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, order, seed=order + 20, closed=True)
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + WORDS + ["OOV"]
    scorer, model = NgramScorer(load_ngram(path), tokens, dense=dense), kenlm.Model(str(path))
    rng = random.Random(order)
    sents = [rng.choices(range(3, len(tokens)), k=rng.randint(0, 8)) for _ in range(16)]
    n = len(sents)
    state = scorer.init_state(n, 1, torch.device("cpu"))
    got = [[] for _ in range(n)]
    for t in range(max(map(len, sents))):
        toks = torch.tensor([s[t] if t < len(s) else -1 for s in sents])
        lp = scorer.score(state, toks.clamp(min=0).unsqueeze(1))[:, 0]
        for r in range(n):
            if t < len(sents[r]):
                got[r].append(float(lp[r]))
        state = scorer.select_state(state, torch.arange(n), toks)
    final = scorer.final_score(state)
    for r, sent in enumerate(sents):
        want = [s[0] * LN10 for s in model.full_scores(" ".join(tokens[i] for i in sent))]
        assert got[r] + [float(final[r])] == pytest.approx(want, abs=TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dense", [True, False])
def test_cuda_matches_cpu(tmp_path, dense):
    path = write_random_arpa(tmp_path / "lm.arpa", WORDS, 4, seed=3, closed=False)
    tokens = ["<blank>", "<unk>", "<sos/eos>"] + WORDS
    results = []
    for device in ("cpu", "cuda"):
        scorer = ngram_scorer(path, tokens, units="token", device=device, dense=dense)
        state = scorer.init_state(4, 1, torch.device(device))
        cand = torch.arange(len(tokens), device=device).expand(4, -1)
        rows = torch.arange(4, device=device)
        # made before the guard: a tensor built from a Python list on a GPU is a copy the host waits for
        picks = [torch.tensor([3 + t, 4, -1, 5 + t], device=device) for t in range(5)]
        torch.cuda.set_sync_debug_mode("error" if device == "cuda" else 0)
        try:
            for t in range(5):
                out = scorer.score(state, cand)
                state = scorer.select_state(state, rows, picks[t])
            out = torch.cat([out, scorer.final_score(state).unsqueeze(1)], 1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        results.append(out.cpu())
    torch.testing.assert_close(results[0], results[1], atol=TOL, rtol=0)


# ---------------------------------------------------------------- word LM over char / sentencepiece tokens
MARK = "\u2581"
OOV_WORDS = ["CA", "THEE", "ZOO", "DOGS"]  # prefixes of LM words and plain unknowns
LETTERS = sorted(set("".join(WORDS + OOV_WORDS)))
CHAR_TOKENS = ["<blank>", "<unk>", "<sos/eos>", MARK] + LETTERS
SP_TOKENS = ["<blank>", "<unk>", "<sos/eos>", MARK] + [MARK + w for w in ("THE", "CAT", "A", "ON", "DOG")] + \
    [MARK + p for p in ("TH", "CA", "S", "O", "D")] + ["EY", "EN", "TS", "AT", "NE", "OG"] + LETTERS


class RefWordSearch:
    """Reference for WordNgramScorer: decoded text split into words, scored with RefLM, plus the
    lookahead LA(prefix) = best unigram among LM words with that prefix, by brute force;
    ``unk_offset`` added to words outside the LM and to the LA of prefixes of no LM word."""

    def __init__(self, ref, tokens, lookahead, unk_offset=0.0):
        self.ref, self.tokens, self.lookahead, self.unk_offset = ref, tokens, lookahead, unk_offset
        self.uni = {w[0]: p * LN10 for w, (p, _) in ref.table.items() if len(w) == 1}
        self.words = [w for w in self.uni if w not in ("<s>", "</s>", "<unk>")]

    def la(self, prefix):
        if not self.lookahead or not prefix:
            return 0.0
        return max([self.uni[w] for w in self.words if w.startswith(prefix)],
                   default=self.uni["<unk>"] + self.unk_offset)

    def word(self, hist, word):
        return self.ref.logprob(hist, word) + (0.0 if word in self.words else self.unk_offset)

    def sentence(self, words):
        return self.ref.sentence(words) + self.unk_offset * sum(w not in self.words for w in words)

    def tokens_total(self, token_ids):
        """Sum of the step scores along ``token_ids``, then </s>."""
        state, total = (["<s>"], ""), 0.0
        for t in token_ids:
            total += self.step_score(state, t)
            state = self.advance(state, t)
        return total + self.step_score(state, 2)

    def kind(self, t):
        tok = self.tokens[t]
        if t in (0, 2):
            return ("skip" if t == 0 else "end"), ""
        if t == 1:
            return "cont", "\uffff"  # the tokenizer's <unk>: a letter no LM word has
        return ("start", tok[1:]) if tok.startswith(MARK) else ("cont", tok)

    def close(self, hist, part):
        return self.word(hist, part) - self.la(part) if part else 0.0

    def step_score(self, state, t):
        hist, part = state
        kind, letters = self.kind(t)
        if kind == "skip":
            return 0.0
        if kind == "end":
            return self.close(hist, part) + self.ref.logprob(hist + ([part] if part else []), "</s>")
        if kind == "start":
            return self.close(hist, part) + self.la(letters)
        return self.la(part + letters) - self.la(part)

    def advance(self, state, t):
        hist, part = state
        kind, letters = self.kind(t) if t >= 0 else ("skip", "")
        if kind == "start":
            return (hist + [part] if part else hist), letters
        return (hist, part + letters) if kind == "cont" else state


def spell(words, tokens, rng):
    """Token ids of a sentence: chars with "▁" between words, or a random sentencepiece segmentation."""
    ids = {t: i for i, t in enumerate(tokens)}
    out = []
    for k, word in enumerate(words):
        text = MARK + word
        if tokens is CHAR_TOKENS and k == 0 and rng.random() < 0.5:
            text = word  # a first word without the leading boundary
        i = 0
        while i < len(text):
            options = [p for p in tokens[3:] if text.startswith(p, i)]
            piece = rng.choice(options)
            out.append(ids[piece])
            i += len(piece)
        if rng.random() < 0.1:
            out.insert(len(out) - 1, 1)  # a <unk> token inside the word
    return out


@pytest.mark.parametrize("units", ["char", "sp"])
@pytest.mark.parametrize("lookahead", [True, False])
@pytest.mark.parametrize("order,closed,unk_offset", [(3, False, 0.0), (1, True, 0.0), (2, False, -7.0),
                                                     (4, True, -7.0), (5, False, -3.0)])
def test_word_scorer_matches_word_reference(tmp_path, units, lookahead, order, closed, unk_offset):
    path = write_random_arpa(tmp_path / "words.arpa", WORDS, order, seed=order + 2, closed=closed)
    tokens = CHAR_TOKENS if units == "char" else SP_TOKENS
    ref = RefWordSearch(RefLM(path), tokens, lookahead, unk_offset)
    scorer = ngram_scorer(path, tokens, units="word", lookahead=lookahead, unk_offset=unk_offset)
    assert isinstance(scorer, WordNgramScorer)
    rng = random.Random(7)
    n, vocab = 6, len(tokens)
    seqs = [spell(rng.choices(WORDS + OOV_WORDS, k=rng.randint(1, 4)), tokens, rng) for _ in range(n)]
    pos, states = [0] * n, [(["<s>"], "")] * n
    totals = torch.zeros(n, dtype=torch.float64)
    state = scorer.init_state(n, 1, torch.device("cpu"))
    cand = torch.arange(vocab).expand(n, vocab)
    for _ in range(40):
        got = scorer.score(state, cand)  # (N, V)
        for r in range(n):
            want = [ref.step_score(states[r], t) for t in range(vocab)]
            assert got[r].tolist() == pytest.approx(want, abs=TOL)
        index = [rng.randrange(n) for _ in range(n)]
        picks = []
        for src in index:
            roll = rng.random()
            nxt = seqs[src][pos[src]] if pos[src] < len(seqs[src]) else -1
            picks.append(-1 if roll < 0.15 else 0 if roll < 0.25 else nxt)
        totals = totals[index] + torch.tensor([got[s, t].item() if t >= 0 else 0.0 for s, t in zip(index, picks)],
                                              dtype=torch.float64)
        pos = [pos[s] + (picks[j] > 0) for j, s in enumerate(index)]
        seqs = [seqs[s] for s in index]
        states = [ref.advance(states[s], t) for s, t in zip(index, picks)]
        state = scorer.select_state(state, torch.tensor(index), torch.tensor(picks))
    final = scorer.final_score(state)
    for r in range(n):
        hist, part = states[r]
        words = hist[1:] + ([part] if part else [])
        assert float(totals[r] + final[r]) == pytest.approx(ref.sentence(words), abs=1e-3)
        assert final[r].item() == pytest.approx(ref.step_score(states[r], 2), abs=TOL)


def test_word_scorer_lookahead_by_hand():
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    scorer = WordNgramScorer(lm, CHAR_TOKENS + ["M"], lookahead=True, unk_offset=0.0)
    ids = {t: i for i, t in enumerate(CHAR_TOKENS + ["M"])}
    state = scorer.init_state(1, 1, torch.device("cpu"))
    for ch in "CA":
        state = scorer.select_state(state, torch.tensor([0]), torch.tensor([ids[ch]]))
    got = scorer.score(state, torch.tensor([[ids["T"], ids["Z"], ids[MARK]]]))[0] / LN10
    # LA(CA) = LA(CAT) = P(CAT) = -1.2; "CAZ" is no word's prefix: LA = P(<unk>) = -1.5;
    # "▁" completes "CA" (unknown): P(<unk> | <s>) = bo(<s>) + P(<unk>) = -0.6 - 1.5, minus LA(CA)
    assert got.tolist() == pytest.approx([0.0, -1.5 + 1.2, -0.6 - 1.5 + 1.2], abs=TOL)


def test_word_scorer_unk_offset_penalises_only_out_of_vocabulary_words():
    lm = load_ngram(FIXTURES / "words_3gram.arpa")
    tokens = CHAR_TOKENS + ["M"]
    ids = {t: i for i, t in enumerate(tokens)}
    plain = WordNgramScorer(lm, tokens, lookahead=True, unk_offset=0.0)
    offset = WordNgramScorer(lm, tokens, lookahead=True, unk_offset=-7.0)
    for text, oov in (("CAT", False), ("CA", True)):
        totals = []
        for scorer in (plain, offset):
            state, total = scorer.init_state(1, 1, torch.device("cpu")), 0.0
            for ch in text:
                total += float(scorer.score(state, torch.tensor([[ids[ch]]]))[0, 0])
                state = scorer.select_state(state, torch.tensor([0]), torch.tensor([ids[ch]]))
            totals.append(total + float(scorer.final_score(state)[0]))
        assert totals[1] - totals[0] == pytest.approx(-7.0 if oov else 0.0, abs=TOL)
    # a partial word that no LM word starts with gets <unk>'s look-ahead plus the offset at once
    state = offset.init_state(1, 1, torch.device("cpu"))
    state = offset.select_state(state, torch.tensor([0]), torch.tensor([ids["C"]]))
    got = offset.score(state, torch.tensor([[ids["Z"]]]))[0, 0] - plain.score(
        plain.select_state(plain.init_state(1, 1, torch.device("cpu")), torch.tensor([0]), torch.tensor([ids["C"]])),
        torch.tensor([[ids["Z"]]]))[0, 0]
    assert float(got) == pytest.approx(-7.0, abs=TOL)
