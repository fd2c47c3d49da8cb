"""Per-row hotword lists: a union automaton of several lists, each row of a batch (each stream) in its own list.

The core property: a row with list A, searched beside rows with list B and with none, gets exactly what it gets
decoded alone with A (hypotheses, scores), on the torch loop and the native loop, offline and streaming; and
each row's scores equal the brute-force reference of its own list (tests/search/test_hotwords.py's)."""
from __future__ import annotations

import random
from typing import List, Optional

import pytest
import torch

from asrkit.search import HotwordScorer, HotwordUnion, ctc_prefix_beam_search, decode_ctc
from asrkit.search import hotwords
from asrkit.search.hotwords import compile_hotwords, empty_graph, hotword_scorer, spell_with_tokens, union_graph
from asrkit.search.streaming import StreamingCtcSearch
from tests.search.reference_ctc_prefix import reference_prefix_search
from tests.search.test_hotwords import ref_potential, ref_step, run_scorer, with_layout

VOCAB = 8
LIST_A = [((3, 4, 5), 1.0), ((4, 6), 2.0), ((3, 4), 0.5)]
LIST_B = [((5, 6, 7), 1.5), ((6, 3, 4), 1.0), ((7,), 0.5)]  # arcs on the tokens of A too: no crossing allowed
LOOPS = [False, True]  # native


def _lp(batch: int, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, VOCAB, generator=gen, dtype=torch.float64).mul(2.5).log_softmax(-1)


def _union(layout: str) -> HotwordScorer:
    """Lists A, B and none as one automaton (rows: A, none, B, A)."""
    graphs = [with_layout(compile_hotwords(p, VOCAB), layout) for p in (LIST_A, LIST_B)]
    return HotwordScorer(union_graph([graphs[0], empty_graph(VOCAB), graphs[1]]), rows=[0, 1, 2, 0])


def _search(lp, lengths, scorer: Optional[HotwordScorer], native: bool, beam: int = 6):
    scorers = {} if scorer is None else {"hotwords": scorer}
    weights = {} if scorer is None else {"hotwords": 0.8}
    return ctc_prefix_beam_search(lp, lengths, beam=beam, scorers=scorers, weights=weights, token_topk=None,
                                  token_min_logp=None, blank_skip_threshold=None, native=native).to_lists()


def _same(got, want) -> None:
    assert [tuple(h.tokens) for h in got] == [tuple(h.tokens) for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
    assert [h.ctc_score for h in got] == pytest.approx([h.ctc_score for h in want], abs=1e-4)


def test_a_union_scores_each_row_as_its_own_list_alone_and_as_the_reference() -> None:
    rng = random.Random(5)
    for layout in ("dense", "arcs"):
        union = _union(layout)
        assert (union.graph.step_next is None) == (layout == "arcs")
        for row, phrases in enumerate((LIST_A, [], LIST_B)):
            for seq in [[3, 4, 5, 6, 3, 4], [5, 6, 3, 4, 7, 7], [rng.randrange(1, VOCAB) for _ in range(10)]]:
                got, final = run_scorer(union.for_rows([row]), seq, VOCAB)
                for i, scores in enumerate(got):
                    want = [0.0] + [ref_step(seq[:i], t, phrases) if phrases else 0.0 for t in range(1, VOCAB)]
                    assert scores == pytest.approx(want, abs=1e-5), (layout, row, seq[:i])
                assert final == pytest.approx(-ref_potential(seq, phrases)[1] if phrases else 0.0, abs=1e-5)


def test_no_row_ever_reaches_another_lists_states() -> None:
    union = _union("dense").graph
    sizes = [compile_hotwords(LIST_A, VOCAB).reach.numel(), 1, compile_hotwords(LIST_B, VOCAB).reach.numel()]
    bounds = torch.tensor([0] + sizes).cumsum(0)
    width = VOCAB + 1
    nxt = union.step_next.view(-1, width) // width  # (S, V + 1) next state ids
    block = torch.bucketize(torch.arange(nxt.shape[0]), bounds[1:], right=True)
    assert torch.equal(union.block, block)
    assert torch.equal(block[nxt], block[:, None].expand_as(nxt))  # every move stays in its list's block
    assert union.starts == (0, int(bounds[1]), int(bounds[2]))
    # the arcs layout falls back to the state's own list's root
    arcs = HotwordScorer(union._replace(step_next=None, step_gain=None))
    rows = torch.arange(nxt.shape[0]) * width + 1
    for tok in range(-1, VOCAB):
        moved = arcs.select_state(rows, torch.arange(rows.numel()), torch.full_like(rows, tok)) // width
        assert torch.equal(moved, nxt[:, tok + 1])


@pytest.mark.parametrize("native", LOOPS)
@pytest.mark.parametrize("layout", ["dense", "arcs"])
def test_each_row_of_a_mixed_batch_equals_that_row_decoded_alone_with_its_list(native: bool, layout: str) -> None:
    lp, lengths = _lp(4, 12, 1), torch.tensor([12, 10, 11, 9])
    got = _search(lp, lengths, _union(layout), native)
    lists = [LIST_A, None, LIST_B, LIST_A]
    for b, phrases in enumerate(lists):
        alone = None if phrases is None else HotwordScorer(with_layout(compile_hotwords(phrases, VOCAB), layout))
        _same(got[b], _search(lp[b:b + 1], lengths[b:b + 1], alone, native)[0])
        want = reference_prefix_search(
            lp[b, :int(lengths[b])].tolist(), 6,
            token_score=lambda p, c: 0.8 * ref_step(p, c, phrases) if phrases else 0.0,
            final_score=lambda p: -0.8 * ref_potential(p, phrases)[1] if phrases else 0.0)
        assert [tuple(h.tokens) for h in got[b]] == [w[0] for w in want]
        assert [h.score for h in got[b]] == pytest.approx([w[1] for w in want], abs=1e-6)
    assert [h.tokens for h in got[0]] != [h.tokens for h in _search(lp[:1], lengths[:1], None, native)[0]]


def test_the_native_loop_refuses_a_start_per_row_of_another_batch_size() -> None:
    lp, lengths = _lp(3, 6, 2), torch.tensor([6, 6, 6])
    with pytest.raises(ValueError, match="lists are given for 4 utterances, the search has 3"):
        _search(lp, lengths, _union("dense"), native=True)
    with pytest.raises(ValueError, match="lists are given for 4 utterances, the search has 3"):
        _search(lp, lengths, _union("dense"), native=False)
    with pytest.raises(ValueError, match="row list index 3 outside the 3 lists"):
        _union("dense").for_rows([0, 3])


TOKENS = ["<blank>", "<unk>", "\u2581", "A", "B", "C", "D", "E"]


@pytest.mark.parametrize("native", LOOPS)
def test_decode_ctc_takes_a_list_per_utterance(native: bool) -> None:
    lp = _lp(3, 14, 3)
    lists: List[Optional[list]] = [["AB", ("BAD", 2.0)], None, ["CE"]]
    got = decode_ctc(lp, tokens=TOKENS, beam=5, nbest=3, hotwords=lists, native=native)
    for b, hw in enumerate(lists):
        alone = decode_ctc(lp[b:b + 1], tokens=TOKENS, beam=5, nbest=3, hotwords=hw, native=native)[0]
        assert [h.text for h in got[b]] == [h.text for h in alone]
        assert [h.score for h in got[b]] == pytest.approx([h.score for h in alone], abs=1e-4)
    every = decode_ctc(lp, tokens=TOKENS, beam=5, hotwords=["AB", ("BAD", 2.0)], native=native)  # one list: all
    assert [h[0].score for h in every][0] == pytest.approx(got[0][0].score, abs=1e-4)
    plain = decode_ctc(lp, tokens=TOKENS, beam=5, native=native)
    assert [h[0].score for h in decode_ctc(lp, tokens=TOKENS, beam=5, hotwords=[None, [], None], native=native)] \
        == [h[0].score for h in plain]


@pytest.mark.parametrize("native", LOOPS)
def test_each_utterance_wins_its_own_phrase(native: bool) -> None:
    tokens = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "C", "D"]
    p = torch.full((4, 7), 1e-4)
    p[0, 4] = p[1, 0] = p[3, 0] = 1.0  # "A", then "D" (0.6) or "C" (0.4)
    p[2, 6], p[2, 5] = 0.6, 0.4
    lp = (p / p.sum(-1, keepdim=True)).log()[None].expand(3, -1, -1)
    texts = lambda hw: [h[0].text for h in decode_ctc(lp, tokens=tokens, hotwords=hw, native=native)]  # noqa: E731
    assert texts([["AC"], None, ["AD", "CA"]]) == ["AC", "AD", "AD"] and texts(["AC"]) == ["AC"] * 3
    assert texts([None, ["AC"], []]) == ["AD", "AC", "AD"]
    assert [h[0].text for h in decode_ctc(lp[:1], tokens=tokens, hotwords=[["AC"]], native=native)] == ["AC"]
    with pytest.raises(ValueError, match="^hotwords: no phrases$"):
        decode_ctc(lp, tokens=tokens, hotwords=[])


def test_per_row_scorer_of_no_lists_is_none_and_skips_unknown_spellings() -> None:
    encode = spell_with_tokens(TOKENS)
    assert hotwords.per_row_scorer([None, []], encode, TOKENS) is None
    assert hotwords.per_row_scorer([["AB"]], encode, TOKENS).rows == (0,)  # one list: no empty block
    with pytest.raises(ValueError, match="^utterance 1: hotwords: no phrase can be spelled"):
        hotwords.per_row_scorer([["AB"], ["BA"]], lambda text: [1, 3] if text == "BA" else encode(text), TOKENS,
                                unk_id=1)


def test_decode_ctc_per_utterance_errors_name_the_utterance() -> None:
    lp = _lp(2, 5, 4)
    with pytest.raises(ValueError, match="hotwords gives 3 lists for 2 utterances"):
        decode_ctc(lp, tokens=TOKENS, hotwords=[["AB"], None, None])
    with pytest.raises(ValueError, match="utterance 1: hotwords: no phrase can be spelled"):
        with pytest.warns(UserWarning, match="'99'"):
            decode_ctc(lp, tokens=TOKENS, hotwords=[["AB"], ["99"]])
    with pytest.raises(TypeError, match=r"hotwords of utterance 0\[0\]"):
        decode_ctc(lp, tokens=TOKENS, hotwords=[[3], None])


def _scorer_of(phrases: List[str]) -> HotwordScorer:
    return hotword_scorer(phrases, spell_with_tokens(TOKENS), TOKENS, unk_id=1)


@pytest.mark.parametrize("native", LOOPS)
def test_streams_with_their_own_lists_in_one_batch_equal_each_stream_alone(native: bool) -> None:
    lp, lengths = _lp(3, 15, 6), torch.tensor([15, 13, 15])
    union = HotwordUnion(len(TOKENS))
    opts = dict(beam=5, token_topk=None, token_min_logp=None, blank_skip_threshold=None, native=native,
                dtype=torch.float64)
    search = StreamingCtcSearch(scorers={"hotwords": union.scorer}, weights={"hotwords": 0.9}, **opts)
    a, b = _scorer_of(["AB", "BAD"]), _scorer_of(["CE", "DAB"])
    states = [search.new_state({"hotwords": union.view(union.add(a))}), search.new_state()]
    for lo, hi in ((0, 5), (5, 9)):  # list B joins mid-stream: the union grows, the live streams go on
        search.advance(states, lp[:2, lo:hi], torch.tensor([hi - lo, hi - lo]))
    states.append(search.new_state({"hotwords": union.view(union.add(b))}))
    assert union.add(_scorer_of(["BAD", "AB"])) == 1 and union.add(b) == 2  # cached by content
    rest = torch.stack([lp[0, 9:], lp[1, 9:], lp[2, :6]])
    search.advance(states, rest, torch.tensor([6, 4, 6]))
    search.advance(states[2:], lp[2:, 6:], torch.tensor([9]))
    got = search.finish(states).to_lists()
    for row, (scorer, length) in enumerate(zip((a, None, b), lengths.tolist())):
        alone = {} if scorer is None else {"hotwords": scorer}
        one = StreamingCtcSearch(scorers=alone, weights={"hotwords": 0.9} if alone else {}, **opts)
        state = one.new_state()
        one.advance([state], lp[row:row + 1, :length], torch.tensor([length]))
        _same(got[row], one.finish([state]).to_lists()[0])


def test_a_union_appends_lists_by_content_and_compacts_to_those_in_use() -> None:
    union = HotwordUnion(len(TOKENS))
    assert union.states == 1 and union.scorer.graph.lists == 1 and union.scorer.rows is None
    a, b, c = _scorer_of(["AB"]), _scorer_of(["CE", "DAB"]), _scorer_of(["BAD"])
    assert [union.add(a), union.add(b), union.add(c), union.add(_scorer_of(["CE", "DAB"]))] == [1, 2, 3, 2]
    assert union.index(c.graph) == 3 and union.index(_scorer_of(["EE"]).graph) is None
    assert set(union.scorer.words) == {"AB", "CE", "DAB", "BAD"}
    sizes = [1] + [int(s.graph.reach.numel()) for s in (a, b, c)]
    assert union.states == sum(sizes) and union.states_outside({0, 1, 3}) == sizes[2]
    with pytest.raises(ValueError, match="give the scorer of one list"):
        union.add(union.scorer)
    # a stream of list 3 (C) moved by a compaction that drops list 2 (B) scores as before
    seq = [2, 4, 3, 6, 2, 4, 3]  # "▁BAD▁BA"
    want, want_final = run_scorer(union.view(3), seq, len(TOKENS))
    view = union.view(3)
    state = view.init_state(1, 1, torch.device("cpu"))
    for tok in seq[:3]:  # "▁BA": a partial match of "BAD"
        state = view.select_state(state, torch.tensor([0]), torch.tensor([tok]))
    moved, state_map = union.compact({3, 1})
    assert moved == {0: 0, 1: 1, 3: 2} and union.scorer.graph.lists == 3 and union.states == sum(sizes) - sizes[2]
    assert state_map.tolist() == list(range(sizes[0] + sizes[1])) + [-1] * sizes[2] + \
        list(range(sizes[0] + sizes[1], union.states))
    state = union.move_rows(state, state_map)
    scorer, rows = union.scorer, []
    for tok in seq[3:]:
        rows.append(scorer.score(state, torch.arange(len(TOKENS))[None])[0].tolist())
        state = scorer.select_state(state, torch.tensor([0]), torch.tensor([tok]))
    assert torch.allclose(torch.tensor(rows), torch.tensor(want[3:]), atol=1e-6) and max(rows[0]) == 3.0
    assert float(scorer.final_score(state)[0]) == pytest.approx(want_final, abs=1e-6)
    assert run_scorer(union.view(2), seq, len(TOKENS)) == (want, want_final)  # C is list 2 now
    assert union.add(c) == 2 and union.add(b) == 3  # the dropped list comes back appended


def test_union_graph_checks_and_keeps_the_step_tables_only_where_every_list_has_them(monkeypatch) -> None:
    a, b = compile_hotwords(LIST_A, VOCAB), compile_hotwords(LIST_B, VOCAB)
    with pytest.raises(ValueError, match="no hotword lists"):
        union_graph([])
    with pytest.raises(ValueError, match="lists of 8 and 9 tokens"):
        union_graph([a, empty_graph(9)])
    both = union_graph([a, b])
    assert both.step_next is not None and both.max_out == max(a.max_out, b.max_out)
    assert union_graph([a, with_layout(b, "arcs")]).step_next is None
    nested = union_graph([both, empty_graph(VOCAB)])  # a union of unions keeps every list's block and start
    assert nested.lists == 3 and nested.starts == both.starts + (int(both.reach.numel()),)
    assert torch.equal(nested.block, torch.cat([both.block, torch.tensor([2])]))
    monkeypatch.setattr(hotwords, "DENSE_MAX_ENTRIES", int(both.reach.numel()) * (VOCAB + 1))
    assert union_graph([a, b]).step_next is not None
    monkeypatch.setattr(hotwords, "DENSE_MAX_ENTRIES", int(both.reach.numel()) * (VOCAB + 1) - 1)
    assert union_graph([a, b]).step_next is None and union_graph([a, b]).step_gain is None
    kind, tables = HotwordScorer(both, rows=[1, 0]).native_form()
    assert torch.equal(tables["block"], both.block)
    assert tables["row_start"].tolist() == [both.starts[1] * (VOCAB + 1) + 1, 1]
    assert "row_start" not in HotwordScorer(both).native_form()[1]
    assert both.to(torch.device("cpu")) is both  # already there: no copy


@pytest.mark.parametrize("native", LOOPS)
def test_a_union_added_to_a_live_search_leaves_the_streams_before_it_as_they_were(native: bool) -> None:
    lp, lengths = _lp(2, 12, 8), torch.tensor([12, 12])
    opts = dict(beam=5, token_topk=None, token_min_logp=None, blank_skip_threshold=None, native=native,
                dtype=torch.float64)
    search = StreamingCtcSearch(**opts)
    plain = search.new_state()
    search.advance([plain], lp[:1, :5], torch.tensor([5]))
    union = HotwordUnion(len(TOKENS))
    a = _scorer_of(["AB", "BAD"])
    search.add_scorer("hotwords", union.scorer, 0.9, [plain], union.view(0))
    with pytest.raises(ValueError, match="already has a scorer 'hotwords'"):
        search.add_scorer("hotwords", union.scorer, 0.9, [])
    own = search.new_state({"hotwords": union.view(union.add(a))})
    search.advance([plain, own], torch.stack([lp[0, 5:], lp[1, :7]]), torch.tensor([7, 7]))
    search.advance([own], lp[1:, 7:], torch.tensor([5]))
    got = search.finish([plain, own]).to_lists()
    for row, scorer in enumerate((None, a)):
        one = StreamingCtcSearch(scorers={} if scorer is None else {"hotwords": scorer},
                                 weights={} if scorer is None else {"hotwords": 0.9}, **opts)
        state = one.new_state()
        one.advance([state], lp[row:row + 1], lengths[row:row + 1])
        _same(got[row], one.finish([state]).to_lists()[0])


def test_a_union_knows_a_list_by_its_content_and_weights() -> None:
    union = HotwordUnion(len(TOKENS))
    one = _scorer_of(["AB", "BAD"])
    assert union.add(one) == 1
    hotwords._compile.cache_clear()  # the same list compiled again: an equal automaton, another object
    again = _scorer_of(["AB", "BAD"])
    assert again.graph is not one.graph and union.add(again) == 1
    heavier = hotword_scorer([("AB", 2.0), "BAD"], spell_with_tokens(TOKENS), TOKENS, unk_id=1)  # same trie
    assert torch.equal(heavier.graph.arc_dst, one.graph.arc_dst) and union.add(heavier) == 2
    with pytest.raises(ValueError, match=r"^HotwordUnion.add: give the scorer of one list$"):
        union.add(union.scorer)
    with pytest.raises(ValueError, match=r"^union_graph: no hotword lists$"):
        union_graph([])


def test_the_empty_list_and_a_union_s_tables_are_whole() -> None:
    empty = empty_graph(5)
    assert (empty.reach.tolist(), empty.pend.tolist(), empty.max_out, empty.start) == ([0.0], [0.0], 0.0, 0)
    assert empty.arc_keys.tolist() == [5] and empty.arc_dst.tolist() == [0]
    both = union_graph([compile_hotwords(LIST_A, VOCAB), empty_graph(VOCAB)])
    assert both.arc_keys.shape == both.arc_dst.shape and both.max_out == compile_hotwords(LIST_A, VOCAB).max_out
    assert union_graph([empty_graph(VOCAB)] * 2).max_out == 0.0
    meta = both.to(torch.device("meta"))
    assert {t.device.type for t in meta if isinstance(t, torch.Tensor)} == {"meta"}  # the blocks too
