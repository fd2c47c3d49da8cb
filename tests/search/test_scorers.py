"""LengthBonus, WordCount, index_rows and DecoderScorer (asrkit.search.scorers) called directly, against
hand-computed values and a from-scratch decoder; the searches that use them are tested elsewhere."""
from __future__ import annotations

from typing import List, NamedTuple

import pytest
import torch

from asrkit.search import DecoderScorer, LengthBonus, WordCount
from asrkit.search.scorers import index_rows

CPU = torch.device("cpu")
SOS = 2


# -- LengthBonus --------------------------------------------------------------------------------------------

def test_length_bonus_scores_one_per_token_as_floats_and_zero_for_the_blank() -> None:
    # Catches: a bool (not float) score tensor, which breaks any caller that negates or sums scores
    # in a float buffer; the blank (id 0) counted as a token.
    bonus = LengthBonus()
    state = bonus.init_state(2, 1, CPU)
    got = bonus.score(state, torch.tensor([[0, 1, 5], [3, 0, 2]]))
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]))
    assert (-got).min() == -1.0  # arithmetic works (a bool tensor cannot be negated)


# -- WordCount ----------------------------------------------------------------------------------------------

MARK = "\u2581"
PIECES = ["<blank>", "<unk>", "<sos/eos>", MARK, MARK + "THE", MARK + "A", "CAT", "S", ""]
CLOSES = torch.tensor([t.startswith(MARK) or t == "<sos/eos>" for t in PIECES])  # as WordNgramScorer.word_marks
OPENS = torch.tensor([-1, 1, -1, 0, 1, 1, 1, 1, -1])


def test_word_count_scores_each_word_once_as_it_closes() -> None:
    # Catches: counting boundary tokens (a doubled, leading or trailing "▁" scored as a word), a word
    # counted at its start instead of its close (then the last one is missing from final_score), a blank or
    # an empty piece that closes or clears the open word, a -1 ("prefix unchanged") read as token id -1.
    import random

    rng = random.Random(5)
    count = WordCount(CLOSES, OPENS)
    for _ in range(40):
        walk = [rng.choice([-1, 0, 1, 3, 3, 4, 5, 6, 7, 8]) for _ in range(rng.randint(0, 12))]
        state, total = count.init_state(1, 1, CPU), 0.0
        for tok in walk:
            score = count.score(state, torch.tensor([[max(tok, 0)]]))
            assert score.dtype == torch.get_default_dtype()
            total += float(score[0, 0]) if tok >= 0 else 0.0
            state = count.select_state(state, torch.tensor([0]), torch.tensor([tok]))
        text = "".join({0: "", 1: "?"}.get(t, PIECES[t]) for t in walk if t >= 0)  # <unk>: a letter
        words = len(text.replace(MARK, " ").split())
        assert total + float(count.final_score(state)[0]) == words, walk
        # ending with <eos> instead scores the same
        assert total + float(count.score(state, torch.tensor([[2]]))[0, 0]) == words, walk


def test_the_bonuses_state_their_gain_bounds() -> None:
    # Each scores at most 1 a token, and the end (an <eos> token, or the final score of the last word) once more.
    import random

    from gain_bound import worst_gain

    rng = random.Random(3)
    walks = [[rng.choice([1, 3, 3, 4, 6, 7, 8]) for _ in range(9)] for _ in range(40)]
    for scorer in (LengthBonus(), WordCount(CLOSES, OPENS)):
        assert tuple(scorer.max_gain()) == (1.0, 1.0, True)
        assert worst_gain(scorer, walks, eos=2) == 1.0  # the bound is reached
    gen = torch.Generator().manual_seed(0)
    memory, lens = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64), torch.tensor([3, 2])
    assert tuple(DecoderScorer(SpyDecoder(5, 4, gen), memory, lens).max_gain()) == (0.0, 0.0, False)  # log-probs


def test_word_count_rows_follow_the_selection_and_bad_masks_are_named() -> None:
    count = WordCount(CLOSES, OPENS)
    state = count.select_state(count.init_state(1, 3, CPU), torch.tensor([0, 0, 1]), torch.tensor([6, 3, 4]))
    state = count.select_state(state, torch.tensor([2, 1, 0, 0]), torch.tensor([-1, 0, 3, 7]))
    torch.testing.assert_close(count.final_score(state), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    kind, tables = count.native_form()
    assert kind == "word_count" and tables["closes"].dtype == torch.bool and tables["opens"].dtype == torch.int64
    assert tables["closes"].tolist() == CLOSES.tolist() and tables["opens"].tolist() == OPENS.tolist()
    with pytest.raises(ValueError, match=r"^WordCount: closes \(9,\) and opens \(8,\) must be \(V,\) masks of "
                                         r"one vocabulary$"):
        WordCount(CLOSES, OPENS[:8])
    with pytest.raises(ValueError, match=r"opens must hold -1, 0 or 1, got \[0, 1, 2\]"):
        WordCount(CLOSES, OPENS + 1)
    with pytest.raises(ValueError, match=r"opens must hold -1, 0 or 1, got \[-2, -1, 0\]"):
        WordCount(CLOSES, OPENS - 1)
    # Masks of other dtypes are taken as truth values and ids; the native search reads bool and int64.
    tables = WordCount(CLOSES.to(torch.uint8), OPENS.to(torch.int32)).native_form()[1]
    assert (tables["closes"].dtype, tables["opens"].dtype) == (torch.bool, torch.int64)
    # Token ids are read as they are, 0 included: only -1 means "prefix unchanged".
    custom = WordCount(torch.tensor([False, True]), torch.tensor([1, 0]))
    state = custom.select_state(custom.init_state(1, 3, CPU), torch.arange(3), torch.tensor([0, -1, 1]))
    assert state.tolist() == [1.0, 0.0, 0.0] and state.dtype == torch.get_default_dtype()
    assert custom.score(state, torch.tensor([[0, 1, -1]] * 3)).tolist() == [[0.0, 1.0, 0.0], [0.0] * 3, [0.0] * 3]


def test_length_bonus_state_follows_the_selected_rows() -> None:
    # Catches: select_state returning the old (N,) state when M != N rows are selected (a final score
    # of the wrong shape), or failing on M != N.
    bonus = LengthBonus()
    state = bonus.init_state(2, 3, CPU)  # N = 6
    for index in (torch.tensor([0, 0, 5, 2]), torch.arange(6), torch.tensor([4, 4, 4, 1, 1, 0, 2, 3])):
        new = bonus.select_state(state, index, torch.full_like(index, 4))
        torch.testing.assert_close(bonus.final_score(new), torch.zeros(index.shape[0]))


# -- index_rows ---------------------------------------------------------------------------------------------

class Plain(NamedTuple):  # no memory_fields attribute
    h: torch.Tensor
    c: torch.Tensor


class WithKeys(NamedTuple):
    h: torch.Tensor
    keys: torch.Tensor
    memory_fields = ("keys",)


class Outer(NamedTuple):
    inner: WithKeys
    layers: list
    pair: tuple


def test_index_rows_keeps_memory_fields_at_any_depth() -> None:
    # Catches: keep_memory_fields not passed down into nested NamedTuples, lists and tuples (a
    # decoder's per-layer states then copy their (N, T, D) keys at every search step).
    def wk(base: float) -> WithKeys:
        return WithKeys(torch.arange(4.0) + base, (torch.arange(4.0) + base) * 10)

    tree = Outer(wk(0), [wk(100), wk(200)], (wk(300), torch.arange(4)))
    index = torch.tensor([3, 3, 0, 1])
    kept = index_rows(tree, index, keep_memory_fields=True)
    for got, old in [(kept.inner, tree.inner), (kept.layers[0], tree.layers[0]), (kept.layers[1], tree.layers[1]),
                     (kept.pair[0], tree.pair[0])]:
        assert got.keys is old.keys
        assert got.h.tolist() == old.h[index].tolist()
    assert isinstance(kept.layers, list) and isinstance(kept.pair, tuple)
    assert kept.pair[1].tolist() == [3, 3, 0, 1]
    full = index_rows(tree, index)
    assert full.layers[1].keys.tolist() == [2030.0, 2030.0, 2000.0, 2010.0]


def test_index_rows_keep_memory_fields_on_a_namedtuple_without_them() -> None:
    # Catches: getattr(tree, "memory_fields") without a default (AttributeError), or a None default
    # (TypeError on `name in None`), for decoder states that declare no memory fields.
    tree = {"s": Plain(torch.arange(3.0), torch.arange(3.0) * 2), "none": None}
    got = index_rows(tree, torch.tensor([2, 0]), keep_memory_fields=True)
    assert got["s"].h.tolist() == [2.0, 0.0] and got["s"].c.tolist() == [4.0, 0.0] and got["none"] is None


def test_index_rows_names_an_unsupported_leaf() -> None:
    # Catches: a TypeError that does not name the offending type.
    with pytest.raises(TypeError, match="decoder state: cannot index a str"):
        index_rows((torch.zeros(2), "oops"), torch.tensor([0]))


# -- DecoderScorer ------------------------------------------------------------------------------------------

class DecState(NamedTuple):
    h: torch.Tensor  # (N, V) recurrent state
    keys: torch.Tensor  # (N, T, V) computed from the memory alone
    memory_fields = ("keys",)


class SpyDecoder:
    """A recurrent toy decoder (float64) with a memory-only state field; records every call.
    h_i = tanh(0.5 h_{i-1} + E[y_i]); log P = log_softmax(W[y_last] + h + mean_t keys)."""

    def __init__(self, vocab: int, dim: int, gen: torch.Generator) -> None:
        self.embed = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)
        self.table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * 2
        self.proj = torch.randn(dim, vocab, generator=gen, dtype=torch.float64)
        self.calls: List[tuple] = []

    def decode_step(self, ys, memory, memory_lens, state=None):
        self.calls.append((ys, state))
        if state is None:
            keys = memory @ self.proj  # (N, T, V)
            h = torch.zeros(ys.shape[0], self.table.shape[0], dtype=torch.float64)
            steps = ys.unbind(1)
        else:
            keys, h, steps = state.keys, state.h, (ys[:, -1],)
        for tok in steps:
            h = torch.tanh(0.5 * h + self.embed[tok])
        mask = torch.arange(memory.shape[1]) < memory_lens[:, None]
        pooled = (keys * mask[..., None]).sum(1) / memory_lens[:, None]
        return (self.table[ys[:, -1]] + h + pooled).log_softmax(-1), DecState(h, keys)

    def from_scratch(self, prefix: List[int], memory: torch.Tensor, lens: torch.Tensor, b: int) -> torch.Tensor:
        """(V,) log P(next | <sos> prefix) of utterance b, one row, no incremental state."""
        ys = torch.tensor([[SOS, *prefix]])
        return SpyDecoder.decode_step(self, ys, memory[b:b + 1], lens[b:b + 1], None)[0][0]


def test_decoder_scorer_scores_every_id_and_passes_its_incremental_state_on() -> None:
    # Catches: the incremental decoder state dropped (None) in init_state or select_state (every step
    # silently decodes from scratch, O(L^2)); the state's rows not re-indexed; its memory-only fields
    # copied instead of kept (keep_memory_fields off); score of id 0 read from id 1 (clamp to 1).
    gen = torch.Generator().manual_seed(0)
    vocab, dim = 6, 4
    memory = torch.randn(2, 5, dim, generator=gen, dtype=torch.float64)
    lens = torch.tensor([5, 3])
    dec = SpyDecoder(vocab, dim, gen)
    scorer = DecoderScorer(dec, memory, lens)
    beam = 2
    state = scorer.init_state(2, beam, CPU)
    assert scorer.vocab_size == vocab
    prefixes = [[] for _ in range(4)]
    steps = [(torch.tensor([1, 0, 3, 3]), torch.tensor([4, 5, 1, 3])),
             (torch.tensor([1, 1, 2, 3]), torch.tensor([3, 1, 5, 5]))]
    for index, tokens in steps:
        got = scorer.score(state, torch.arange(vocab).expand(4, vocab))
        for n in range(4):
            torch.testing.assert_close(got[n], dec.from_scratch(prefixes[n], memory, lens, n // beam))
        old = state
        state = scorer.select_state(state, index, tokens)
        ys, passed = dec.calls[-1]
        assert passed is not None, "select_state decoded from scratch"
        assert passed.keys is old.dec.keys  # memory-only field kept, not copied
        torch.testing.assert_close(passed.h, old.dec.h[index])
        assert ys.tolist() == [[SOS, *prefixes[int(i)], int(t)] for i, t in zip(index, tokens)]
        prefixes = [prefixes[int(i)] + [int(t)] for i, t in zip(index, tokens)]
    final = scorer.final_score(state)
    for n in range(4):
        assert float(final[n]) == pytest.approx(float(dec.from_scratch(prefixes[n], memory, lens, n // beam)[SOS]),
                                                abs=1e-12)


def test_decoder_scorer_vocab_size_is_unknown_until_init_state() -> None:
    # Catches: a placeholder other than None (callers test `vocab_size is None`).
    gen = torch.Generator().manual_seed(1)
    scorer = DecoderScorer(SpyDecoder(5, 3, gen), torch.randn(1, 4, 3, dtype=torch.float64), torch.tensor([4]))
    assert scorer.vocab_size is None
    scorer.init_state(1, 3, CPU)
    assert scorer.vocab_size == 5


@pytest.mark.parametrize("memory,lens", [
    (torch.zeros(2, 4), torch.tensor([4, 4])),  # 2-D memory, lengths fit its first dim
    (torch.zeros(2, 4, 3), torch.tensor([4, 4, 4])),  # 3-D memory, lengths of another batch
])
def test_decoder_scorer_bad_memory_is_named(memory: torch.Tensor, lens: torch.Tensor) -> None:
    # Catches: either check skipped when the other passes (`and` for `or`); a message without shapes.
    shapes = rf"got \({', '.join(map(str, memory.shape))},?\) and \({lens.shape[0]},\)"
    with pytest.raises(ValueError, match=r"memory must be \(B, T, D\) with lengths \(B,\), " + shapes):
        DecoderScorer(SpyDecoder(5, 3, torch.Generator().manual_seed(2)), memory, lens)


def test_decoder_scorer_batch_mismatch_is_named() -> None:
    # Catches: a message without the counts, or with the frame count instead of the utterance count.
    scorer = DecoderScorer(SpyDecoder(5, 3, torch.Generator().manual_seed(3)), torch.zeros(2, 7, 3),
                           torch.tensor([7, 7]))
    with pytest.raises(ValueError, match="DecoderScorer holds 2 utterances, the search has 3"):
        scorer.init_state(3, 1, CPU)
