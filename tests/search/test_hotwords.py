"""The hotword scorer (asrkit.search.hotwords) against a brute-force reference.

The reference computes a hypothesis's bonus from its token sequence directly (no automaton): the bonus of
every phrase occurrence completed (sliding windows), plus the provisional bonus of the longest suffix that
begins a phrase, for its tokens past the last whole phrase along it but the first ``held`` bonus-carrying
tokens of the phrase. A step's score is the change of that potential; the end cancels the provisional part.
"""
from __future__ import annotations

import itertools
import random
from typing import Dict, List, Sequence, Tuple

import pytest
import torch
from torch.overrides import TorchFunctionMode

from asrkit.search import (CTCPrefixScorer, attention_rescore, beam_search, ctc_prefix_beam_search,
                           joint_beam_search)
from asrkit.search import hotwords
from asrkit.search.hotwords import (HotwordGraph, HotwordScorer, Phrase, as_phrases, compile_hotwords,
                                    hotword_scorer, parse_hotwords, read_hotwords, spell_with_tokens)
from tests.search.reference_ctc_prefix import reference_prefix_search

Phrases = Sequence[Tuple[Sequence[int], float]]


def _merged(phrases: Phrases) -> Dict[Tuple[int, ...], float]:
    out: Dict[Tuple[int, ...], float] = {}
    for ids, w in phrases:
        out[tuple(ids)] = max(w, out.get(tuple(ids), 0.0))
    return out


def ref_potential(seq: Sequence[int], phrases: Phrases, free: Sequence[int] = (),
                  held: int = hotwords.HELD_TOKENS) -> Tuple[float, float]:
    """(completed bonus C, provisional bonus pend) of a token sequence, by brute force."""
    table = _merged(phrases)
    seq = tuple(seq)
    done = 0.0
    for p, w in table.items():
        for i in range(len(seq) - len(p) + 1):
            if seq[i:i + len(p)] == p:
                done += w * sum(t not in free for t in p)
    prefixes = {p[:k] for p in table for k in range(1, len(p) + 1)}
    suffix = next((seq[i:] for i in range(len(seq)) if seq[i:] in prefixes), ())

    def acc(u: Tuple[int, ...]) -> float:  # the provisional bonus of the tokens of u, from a phrase's start
        carrying = [j for j in range(1, len(u) + 1) if u[j - 1] not in free]
        return sum(max(w for p, w in table.items() if p[:j] == u[:j]) for j in carrying[held:])

    whole = [k for k in range(1, len(suffix) + 1) if suffix[:k] in table]
    return done, acc(suffix) - (acc(suffix[:whole[-1]]) if whole else 0.0)


def ref_step(seq: Sequence[int], tok: int, phrases: Phrases, free: Sequence[int] = (),
             held: int = hotwords.HELD_TOKENS) -> float:
    c0, p0 = ref_potential(seq, phrases, free, held)
    c1, p1 = ref_potential(list(seq) + [tok], phrases, free, held)
    return (c1 + p1) - (c0 + p0)


def run_scorer(scorer: HotwordScorer, seq: Sequence[int], vocab: int) -> Tuple[List[List[float]], float]:
    """Every candidate's score at every step of ``seq`` (one hypothesis), then the final score."""
    state = scorer.init_state(1, 1, torch.device("cpu"))
    all_tokens = torch.arange(vocab)[None]
    rows = []
    for tok in seq:
        rows.append(scorer.score(state, all_tokens)[0].tolist())
        state = scorer.select_state(state, torch.tensor([0]), torch.tensor([tok]))
    return rows, float(scorer.final_score(state)[0])


def with_layout(graph: HotwordGraph, layout: str) -> HotwordGraph:
    """``graph`` reading its steps from the whole tables ("dense", what a small automaton has) or searching them
    among its arcs ("arcs", what an automaton over DENSE_MAX_ENTRIES does)."""
    assert graph.step_next is not None and graph.step_gain is not None
    return graph if layout == "dense" else graph._replace(step_next=None, step_gain=None)


def check_against_reference(phrases: Phrases, seq: Sequence[int], vocab: int, free: Sequence[int] = (),
                            layout: str = "dense", held: int = hotwords.HELD_TOKENS) -> None:
    scorer = HotwordScorer(with_layout(compile_hotwords(phrases, vocab, free=free, held=held), layout))
    rows, final = run_scorer(scorer, seq, vocab)
    for i, row in enumerate(rows):
        want = [0.0] + [ref_step(seq[:i], t, phrases, free, held) for t in range(1, vocab)]
        assert row == pytest.approx(want, abs=1e-5), f"step {i} after {list(seq[:i])}"
    done, pend = ref_potential(seq, phrases, free, held)
    assert final == pytest.approx(-pend, abs=1e-5)
    total = sum(row[t] for row, t in zip(rows, seq)) + final
    assert total == pytest.approx(done, abs=1e-4)


CASES = {
    "single": [((3, 4, 5), 1.0)],
    "multi_word_with_free_boundary": [((1, 3, 4, 1, 5, 6), 1.0)],
    "overlapping": [((3, 4), 1.0), ((4, 5), 2.0)],
    "prefix_of_another": [((3, 4), 1.0), ((3, 4, 5, 6), 0.5)],
    "nested_suffix": [((3, 4, 5), 1.0), ((4,), 3.0), ((5, 6), 1.0)],
    "failure_chain": [((3, 3, 4), 1.0), ((3, 4, 3, 3, 5), 2.0), ((3, 3, 3), 0.5)],
    "duplicates": [((3, 4), 1.0), ((3, 4), 2.5), ((3, 4), 0.5)],
}


@pytest.mark.parametrize("held", [0, 1, 2])
@pytest.mark.parametrize("layout", ["dense", "arcs"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_candidate_score_equals_the_brute_force_reference(case: str, layout: str, held: int) -> None:
    phrases = CASES[case]
    rng = random.Random(case)
    free = (1,) if "free" in case else ()
    tokens = sorted({t for p, _ in phrases for t in p} | {2, 7})  # 2: <sos/eos>-like, 7: outside every phrase
    seqs = [list(p) for p, _ in phrases] + [list(p) + list(q) for (p, _), (q, _) in itertools.product(phrases, phrases)]
    seqs += [[rng.choice(tokens) for _ in range(12)] for _ in range(6)]
    for seq in seqs:
        check_against_reference(phrases, seq, 8, free, layout, held)


def test_the_whole_step_tables_are_kept_only_where_they_fit(monkeypatch) -> None:
    phrases = [((3, 4, 5), 1.0), ((4, 6), 2.0), ((3, 3, 4), 0.5)]  # 7 states (root, 3, 34, 345, 4, 46, 33 ...)
    graph = compile_hotwords(phrases, 8)
    states, width = graph.reach.numel(), 9
    assert graph.step_next.shape == graph.step_gain.shape == (states * width,)
    assert graph.step_next.dtype == torch.long and graph.step_gain.dtype == torch.float32
    # every (state, token) entry, -1 and the blank included, equals what the arcs give
    rows = (torch.arange(states) * width + 1).repeat_interleave(width)
    grid_token = torch.arange(-1, 8).repeat(states)
    dense, arcs = HotwordScorer(graph), HotwordScorer(graph._replace(step_next=None, step_gain=None))
    index = torch.arange(rows.numel())
    assert torch.equal(dense.select_state(rows, index, grid_token), arcs.select_state(rows, index, grid_token))
    assert torch.equal(dense.score(rows, grid_token[:, None]), arcs.score(rows, grid_token[:, None]))
    assert torch.equal(dense.final_score(rows), arcs.final_score(rows))
    assert set(arcs.select_state(rows, index, grid_token).remainder(width).tolist()) == {1}  # rows, both layouts
    # the native loop reads the tables where they exist, and the arcs beside them; its states are rows too
    for g in (graph, graph._replace(step_next=None, step_gain=None)):
        kind, tables = HotwordScorer(g).native_form()
        want = dict(root_next=g.root_next, arc_keys=g.arc_keys, arc_dst=g.arc_dst, reach=g.reach, pend=g.pend)
        if g.step_next is not None:
            want.update(step_next=g.step_next, step_gain=g.step_gain)
        assert kind == "hotwords" and set(tables) == set(want) | {"vocab", "start_state"}
        assert all(tables[k] is v for k, v in want.items())
        assert int(tables["vocab"]) == 8 and int(tables["start_state"]) == g.start * width + 1
    moved = graph.to(torch.device("cpu"))
    assert torch.equal(moved.step_next, graph.step_next) and torch.equal(moved.step_gain, graph.step_gain)
    meta = graph.to(torch.device("meta"))  # every table moves (the search's device)
    assert {t.device.type for t in meta if isinstance(t, torch.Tensor)} == {"meta"}
    assert {t.device.type for t in graph._replace(step_next=None, step_gain=None).to(torch.device("meta"))
            if isinstance(t, torch.Tensor)} == {"meta"}
    for limit, kept in ((states * width, True), (states * width - 1, False)):
        hotwords._compile.cache_clear()
        monkeypatch.setattr(hotwords, "DENSE_MAX_ENTRIES", limit)
        small = compile_hotwords(phrases, 8)
        assert (small.step_next is not None, small.step_gain is not None) == (kept, kept)
    hotwords._compile.cache_clear()


def test_init_state_puts_the_tables_and_the_states_on_the_search_device() -> None:
    scorer = HotwordScorer(compile_hotwords([((3, 4), 1.0)], 6))
    state = scorer.init_state(2, 3, torch.device("meta"))
    assert state.shape == (6,) and state.dtype == torch.long and state.device.type == "meta"
    assert scorer.graph.step_next.device.type == scorer.graph.pend.device.type == "meta"


def _torch_calls(fn) -> int:
    """How many torch functions and tensor methods ``fn()`` calls."""

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.calls


def test_a_step_costs_the_same_few_ops_whatever_the_number_of_phrases() -> None:
    # the torch loop is dispatch-bound: with the step tables a step is one add and one read per candidate
    tokens = torch.tensor([[-1, 0, 3, 4, 5, 7]] * 4)
    index, chosen = torch.tensor([0, 1, 1, 3]), torch.tensor([3, -1, 0, 5])
    counts = []
    for n in (1, 1000):
        phrases = [((3 + k % 5, 3 + (k // 5) % 5, 3 + k // 25 % 5, 3 + k // 125), 1.0) for k in range(n)]
        scorer = HotwordScorer(compile_hotwords(phrases, 8 + n // 125))
        state = scorer.init_state(1, 4, torch.device("cpu"))
        counts.append((_torch_calls(lambda: scorer.score(state, tokens)),
                       _torch_calls(lambda: scorer.select_state(state, index, chosen))))
    assert counts == [(3, 3), (3, 3)]  # score: a view, the add, the read


def test_failure_cancels_the_partial_bonus_and_the_end_cancels_an_unfinished_match() -> None:
    scorer = HotwordScorer(compile_hotwords([((3, 4, 5), 2.0)], 8, held=0))  # every matched token gains at once
    rows, final = run_scorer(scorer, [3, 4], 8)
    assert final == pytest.approx(-4.0)
    rows, final = run_scorer(scorer, [3, 4, 7], 8)
    assert rows[0][3] == pytest.approx(2.0) and rows[1][4] == pytest.approx(2.0)
    assert rows[2][7] == pytest.approx(-4.0)  # the failed partial match loses its 4
    assert rows[2][5] == pytest.approx(2.0)  # completing keeps it
    assert rows[2][3] == pytest.approx(-2.0)  # 3 4 3: back to a partial match of one token
    rows, final = run_scorer(scorer, [3, 4, 2], 8)
    assert rows[2][2] == pytest.approx(-4.0)  # so does <eos> (id 2) in a label-synchronous search
    rows, final = run_scorer(scorer, [3, 4, 5, 2], 8)
    assert final == 0.0 and rows[3][2] == 0.0  # a whole phrase keeps its bonus at the end


def test_the_first_two_tokens_hold_no_bonus_and_the_phrase_pays_them_when_complete() -> None:
    # the default: a phrase's first two bonus-carrying tokens gain nothing while the match is partial, so a
    # hypothesis that only starts a word as some phrase does gains nothing over one that goes on with its word
    assert hotwords.HELD_TOKENS == 2
    scorer = HotwordScorer(compile_hotwords([((1, 3, 4, 5, 6), 2.0)], 8, free=(1,), start_token=1))  # "▁ 3 4 5 6"
    rows, final = run_scorer(scorer, [7, 1, 3, 4, 5, 6], 8)
    assert [rows[1][1], rows[2][3], rows[3][4], rows[4][5], rows[5][6]] == pytest.approx([0.0, 0.0, 0.0, 2.0, 6.0])
    assert rows[4][7] == 0.0 and rows[5][7] == pytest.approx(-2.0)  # a failure takes back what was gained
    assert final == 0.0
    assert run_scorer(scorer, [1, 3, 4, 5], 8)[1] == pytest.approx(-2.0) and run_scorer(scorer, [1, 3, 4], 8)[1] == 0.0
    two = HotwordScorer(compile_hotwords([((3, 4), 1.5)], 8))  # a two-token phrase is paid as it completes
    assert run_scorer(two, [3, 4], 8)[0][1][4] == pytest.approx(3.0)


def test_prefix_of_another_keeps_the_shorter_and_rewards_the_longer() -> None:
    scorer = HotwordScorer(compile_hotwords([((3, 4), 1.0), ((3, 4, 5), 1.0)], 8))
    rows, final = run_scorer(scorer, [3, 4, 5, 7], 8)
    # 3 holds nothing yet, 4 completes 3 4 (2 in all), 5 the longer one (3 more), 7 fails with nothing to take back
    assert [rows[0][3], rows[1][4], rows[2][5], rows[3][7]] == pytest.approx([0.0, 2.0, 3.0, 0.0])
    assert final == 0.0


def test_blank_and_unchanged_prefix_score_zero_and_keep_the_state() -> None:
    scorer = HotwordScorer(compile_hotwords([((3, 4), 1.0)], 6))
    state = scorer.init_state(1, 2, torch.device("cpu"))
    state = scorer.select_state(state, torch.tensor([0, 1]), torch.tensor([3, 5]))
    assert scorer.score(state, torch.tensor([[0, -1, 4], [0, -1, 4]])).tolist() == [[0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    kept = scorer.select_state(state, torch.tensor([0, 0]), torch.tensor([-1, 0]))
    assert kept.tolist() == [int(state[0])] * 2


def test_max_gain_bounds_every_step() -> None:
    phrases = CASES["nested_suffix"]
    scorer = HotwordScorer(compile_hotwords(phrases, 8))
    once, per, nonneg = scorer.max_gain()
    assert (once, per, nonneg) == (0.0, 3.0, False)  # "3 4 5", "4" and "3 4" (via "4") each complete 3 at most
    rng = random.Random(0)
    for _ in range(50):
        seq = [rng.choice([3, 4, 5, 6, 7]) for _ in range(8)]
        rows, final = run_scorer(scorer, seq, 8)
        for i in range(len(seq)):  # from any point, the rest of the sequence gains at most per * r
            rest = sum(row[t] for row, t in zip(rows[i:], seq[i:])) + final
            assert rest <= once + per * (len(seq) - i) + 1e-5


def test_compile_checks_and_caches_by_content() -> None:
    a = compile_hotwords([((3, 4), 1.0), ((5,), 2.0)], 8)
    assert compile_hotwords([((5,), 2.0), ((3, 4), 1.0)], 8) is a
    assert compile_hotwords([((5,), 2.0), ((3, 4), 1.5)], 8) is not a
    for bad, match in (([], "^compile_hotwords: no phrases$"), ([((), 1.0)], "^compile_hotwords: a phrase has no tokens$"),
                       ([((8,), 1.0)], r"\[8\] has ids outside 1\.\.7$"), ([((0,), 1.0)], "outside"),
                       ([((3,), 0.0)], "> 0"), ([((3,), float("nan"))], "> 0")):
        with pytest.raises(ValueError, match=match):
            compile_hotwords(bad, 8)


def test_start_token_makes_a_hypothesis_start_after_a_boundary() -> None:
    # phrase "▁ A B" (▁ = 1, free): matches at the start and after a boundary, not inside a word
    graph = compile_hotwords([((1, 3, 4), 1.0)], 6, free=(1,), start_token=1)
    scorer = HotwordScorer(graph)
    for seq, want in (([3, 4], 2.0), ([5, 1, 3, 4], 2.0), ([5, 3, 4], 0.0), ([1, 1, 3, 4, 1, 3, 4], 4.0)):
        rows, final = run_scorer(scorer, seq, 6)
        assert sum(row[t] for row, t in zip(rows, seq)) + final == pytest.approx(want), seq


CHARS = ["<blank>", "<unk>", "<sos/eos>", "\u2581"] + list("ABCDEHJLNOS")
PIECES = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "\u2581JO", "\u2581AN", "HN", "NA", "\u2581S"] + list("ABCDEHJLNOS")


def test_char_phrases_start_with_the_boundary_and_unspellable_ones_are_reported() -> None:
    warned: List[str] = []
    scorer = hotword_scorer([Phrase("JOHN", 1.0, "list line 1"), Phrase("42", 1.0, "list line 2"), "JOHN", "SO"],
                            spell_with_tokens(CHARS), CHARS, unk_id=1, warn=warned.append)
    assert warned == ["hotword '42' (list line 2) skipped: the model's units cannot spell it"]
    assert scorer.words == ("JOHN", "SO")  # the kept phrases' words, once each: a word LM search adds them
    assert hotword_scorer(["SO JOHN  SO", "JO"], spell_with_tokens(CHARS), CHARS).words == ("SO", "JOHN", "JO")
    ids = {t: i for i, t in enumerate(CHARS)}
    for text, want in (("JOHN", 4.0), ("A JOHN", 4.0), ("AJOHN", 0.0), ("JOHNJOHN", 4.0), ("JOHN JOHN", 8.0),
                       ("SO", 2.0)):
        seq = [ids[c] for c in text.replace(" ", "\u2581")]
        rows, final = run_scorer(scorer, seq, len(CHARS))
        assert sum(row[t] for row, t in zip(rows, seq)) + final == pytest.approx(want), text
    with pytest.raises(ValueError, match="^hotwords: no phrase can be spelled with the model's units$"):
        hotword_scorer(["42"], spell_with_tokens(CHARS), CHARS, unk_id=1)
    # ids the search cannot emit (the blank, past the vocabulary) are refused; without an unk id, 1 is a token
    assert hotword_scorer(["X"], lambda text: [1], CHARS, unk_id=None).native_form()[0] == "hotwords"
    for ids in ([0], [len(CHARS)]):
        with pytest.raises(ValueError, match="no phrase"):
            hotword_scorer(["X"], lambda text: ids, CHARS)


def test_without_a_boundary_token_phrases_match_anywhere() -> None:
    letters = ["<blank>", "<unk>", "<sos/eos>", "A", "B", "C", "<", ">"]
    encode = spell_with_tokens(letters)
    assert encode("AB C") == [3, 4, 5] and encode("<unk>") == [] and encode("A<") == [3, 6]
    scorer = hotword_scorer(["BC"], encode, letters, unk_id=1)
    rows, final = run_scorer(scorer, [3, 4, 5], len(letters))
    assert [row[t] for row, t in zip(rows, [3, 4, 5])] == pytest.approx([0.0, 0.0, 2.0]) and final == 0.0


def test_bpe_phrases_use_word_initial_pieces() -> None:
    encode = spell_with_tokens(PIECES)
    ids = {t: i for i, t in enumerate(PIECES)}
    assert encode("JOHN ANNA") == [ids["\u2581JO"], ids["HN"], ids["\u2581AN"], ids["NA"]]
    assert encode("JOHN 7") == [] and encode("SO") == [ids["\u2581S"], ids["O"]] and encode("<unk>") == []
    scorer = hotword_scorer([("JOHN ANNA", 0.5)], encode, PIECES, unk_id=1)
    seq = encode("JOHN ANNA")
    rows, final = run_scorer(scorer, seq, len(PIECES))
    assert [row[t] for row, t in zip(rows, seq)] == pytest.approx([0.0, 0.0, 0.5, 1.5]) and final == 0.0
    check_against_reference([(seq, 0.5)], encode("JOHN JOHN ANNA SO"), len(PIECES))


def test_parse_read_and_as_phrases(tmp_path) -> None:
    got = parse_hotwords(["JOHN  SMITH\n", "\n", "# a comment\n", "ANNA\t2.5\r\n"], "f.txt")
    assert got == [Phrase("JOHN SMITH", 1.0, "f.txt line 1"), Phrase("ANNA", 2.5, "f.txt line 4")]
    for line, match in (("ANNA\tx", "line 1: the weight 'x' is not a number"), ("ANNA\t-1", "line 1: the weight -1.0"),
                        ("ANNA\tinf", "must be a number > 0"), ("ANNA\t0", "the weight 0.0 must be")):
        with pytest.raises(ValueError, match=match):
            parse_hotwords([line], "f.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ValueError, match=f"hotwords file {empty}: no phrases"):
        read_hotwords(empty)
    with pytest.raises(ValueError, match="cannot read it"):
        read_hotwords(tmp_path / "missing.txt")
    good = tmp_path / "good.txt"
    good.write_text("ANNA\t2\n")
    assert read_hotwords(good) == [Phrase("ANNA", 2.0, f"{good} line 1")]
    assert as_phrases(["A", ("B C", 2)]) == [Phrase("A", 1.0, "hotwords[0]"), Phrase("B C", 2.0, "hotwords[1]")]
    with pytest.raises(TypeError, match="list of phrases"):
        as_phrases("ANNA")
    with pytest.raises(TypeError, match=r"hotwords\[0\]"):
        as_phrases([3])
    with pytest.raises(ValueError, match=r"hotwords\[0\] 'A': the weight 0.0"):
        as_phrases([("A", 0)])
    with pytest.raises(ValueError, match="no phrases"):
        as_phrases([" "])


@pytest.mark.parametrize("layout", ["dense", "arcs"])
def test_prefix_search_with_hotwords_equals_the_reference_search(layout: str) -> None:
    phrases = [((3, 4, 5), 1.0), ((4, 6), 2.0), ((3, 4), 0.5)]
    scorer = HotwordScorer(with_layout(compile_hotwords(phrases, 8), layout))
    gen = torch.Generator().manual_seed(3)
    lp = torch.randn(2, 9, 8, generator=gen, dtype=torch.float64).mul(2).log_softmax(-1)
    lengths = torch.tensor([9, 7])
    got = ctc_prefix_beam_search(lp, lengths, beam=6, scorers={"hotwords": scorer}, weights={"hotwords": 0.7},
                                 token_topk=None, token_min_logp=None, blank_skip_threshold=None, native=False)
    for b, hyps in enumerate(got.to_lists()):
        want = reference_prefix_search(lp[b, :int(lengths[b])].tolist(), 6,
                                       token_score=lambda p, c: 0.7 * ref_step(p, c, phrases),
                                       final_score=lambda p: -0.7 * ref_potential(p, phrases)[1])
        assert [tuple(h.tokens) for h in hyps] == [w[0] for w in want]
        assert [h.score for h in hyps] == pytest.approx([w[1] for w in want], abs=1e-6)


def _two_readings() -> torch.Tensor:
    """(1, 4, 6) log-probs of "3 then 5 (0.6) or 4 (0.4)", blanks between."""
    p = torch.full((4, 6), 1e-4, dtype=torch.float64)
    p[0, 3] = p[1, 0] = p[3, 0] = 1.0
    p[2, 5], p[2, 4] = 0.6, 0.4
    return (p / p.sum(-1, keepdim=True)).log()[None]


def test_a_biased_phrase_wins_only_with_hotwords_in_every_search() -> None:
    lp, lens = _two_readings(), torch.tensor([4])
    hot = {"hotwords": HotwordScorer(compile_hotwords([((3, 4), 1.0)], 6))}
    for native in (False, None):
        plain = ctc_prefix_beam_search(lp, lens, beam=4, native=native).to_lists()[0]
        biased = ctc_prefix_beam_search(lp, lens, beam=4, scorers=hot, weights={"hotwords": 0.5},
                                        native=native).to_lists()[0]
        assert plain[0].tokens == [3, 5] and biased[0].tokens == [3, 4]
        bonus = {tuple(h.tokens): h.score - h.ctc_score for h in biased}
        assert bonus[(3, 4)] == pytest.approx(1.0) and bonus[(3, 5)] == pytest.approx(0.0)
    # joint search (the CTC prefix score as the only model scorer) and attention rescoring of the biased N-best
    ctc = CTCPrefixScorer(lp, lens)
    assert beam_search({"ctc": ctc}, {"ctc": 1.0}, lens, beam=4).to_lists()[0][0].tokens == [3, 5]
    joint = beam_search({"ctc": ctc, **hot}, {"ctc": 1.0, "hotwords": 0.5}, lens, beam=4).to_lists()[0]
    assert joint[0].tokens == [3, 4] and joint[0].score - joint[0].ctc_score == pytest.approx(1.0)
    nbest = ctc_prefix_beam_search(lp, lens, beam=4, scorers=hot, weights={"hotwords": 0.5})
    rescored = attention_rescore(nbest, lambda u, t, n: torch.zeros(u.shape[0]), ctc_weight=0.5).to_lists()[0]
    assert rescored[0].tokens == [3, 4]


def test_joint_search_with_hotwords_and_an_lm_equals_the_reference_search() -> None:
    from tests.search.test_beam_search import ToyDecoder, problem, random_bigram, run_and_compare

    phrases = [((3, 4), 1.0), ((4, 5, 3), 2.0), ((3,), 0.5)]
    gen = torch.Generator().manual_seed(5)
    vocab = 7
    memory, lp, lens = problem(2, 8, vocab, gen)
    decoder = ToyDecoder(vocab, gen)
    hot = HotwordScorer(compile_hotwords(phrases, vocab))

    def hot_ref(prefix) -> List[float]:
        return [0.0] + [ref_step(prefix, t, phrases) for t in range(1, vocab)]

    run_and_compare(decoder, memory, lp, lens, lens.clone(), {"decoder": 0.7, "ctc": 0.3, "lm": 0.8}, beam=4, nbest=2,
                    lm=(hot, hot_ref), tol=1e-5)
    # beside an LM: the same search as the reference with both scorers summed
    bigram = random_bigram(vocab, gen)
    both = {"lm": bigram, "hotwords": hot}
    got = joint_beam_search(decoder, memory, lens, lp, ctc_weight=0.3, beam=4, nbest=2, scorers=both,
                            weights={"lm": 0.5, "hotwords": 0.8}).to_lists()
    alone = joint_beam_search(decoder, memory, lens, lp, ctc_weight=0.3, beam=4, nbest=2, scorers={"lm": bigram},
                              weights={"lm": 0.5}).to_lists()
    checked = 0
    for b in range(2):
        for h in got[b]:  # every hypothesis's score holds 0.8 x its brute-force bonus beside the LM's part
            mine = [a for a in alone[b] if a.tokens == h.tokens]
            if mine:
                checked += 1
                assert h.score - mine[0].score == pytest.approx(0.8 * ref_potential(h.tokens, phrases)[0], abs=1e-4)
    assert checked >= 2


def test_a_utf8_list_reads_under_the_c_locale(tmp_path, c_locale) -> None:
    listed = tmp_path / "names.txt"
    listed.write_text("ÉMILE ZOLA\t2\n", encoding="utf-8")
    assert read_hotwords(listed) == [Phrase("ÉMILE ZOLA", 2.0, f"{listed} line 1")]
