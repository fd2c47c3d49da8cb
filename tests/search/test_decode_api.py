"""asrkit.search.decode_ctc: the docs' example (docs/benchmarks.md), conversions, special ids and every input error."""
from __future__ import annotations

import math
import pathlib
import re

import numpy as np
import pytest
import torch

from asrkit.search import ctc_prefix_beam_search, decode_ctc
from reference_ctc_prefix import reference_prefix_search
from test_ctc_prefix import BigramScorer, peaky_log_probs, random_log_probs, ref_nbest, topk_candidates

EXAMPLE_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
CHARS = ["<blank>", "<unk>", "'", " ", "a", "b", "c"]


def spelled(text_ids, vocab: int, frames_per: int = 2, eps: float = 1e-3) -> torch.Tensor:
    """(T, V) log-probs spelling the ids: each id for `frames_per` frames then a blank frame."""
    path = []
    for i in text_ids:
        path += [i] * frames_per + [0]
    probs = torch.full((len(path), vocab), eps / (vocab - 1), dtype=torch.float64)
    probs[torch.arange(len(path)), torch.tensor(path)] = 1 - eps
    return probs.log()


def test_the_docs_example_runs_as_written() -> None:
    # Catches: the docs' example that no longer runs or no longer gives the text (it is executed
    # exactly as printed, with pyctcdecode-style labels: "" is the blank).
    blocks = re.findall(r"```python\n(.*?)```", EXAMPLE_PAGE.read_text(encoding="utf-8"), re.S)
    example = [b for b in blocks if "decode_ctc(" in b]
    assert example, f"{EXAMPLE_PAGE} has no decode_ctc example"
    labels = ["", "a", "b", " ", "'"]
    utts = [[1, 2, 3, 2], [4, 1, 1, 2], [2]]
    rows = [spelled(u, 5) for u in utts]
    frames = max(r.shape[0] for r in rows)
    log_probs = np.full((3, frames, 5), math.log(1e-9 / 4), dtype=np.float32)
    log_probs[..., 0] = math.log(1 - 1e-9)
    for b, r in enumerate(rows):
        log_probs[b, :r.shape[0]] = r.numpy()
    lengths = np.array([r.shape[0] for r in rows])
    scope = {"log_probs": log_probs, "lengths": lengths, "labels": labels}
    exec(example[0], scope)  # noqa: S102 (our own docs)
    assert scope["texts"] == ["ab b", "'aab", "b"]


def test_equals_the_reference_search_with_numpy_and_list_inputs() -> None:
    # Catches: numpy or list inputs converted wrongly (dtype, transposed), lengths ignored, ids or
    # text not those of the reference's best prefix.
    gen = torch.Generator().manual_seed(1)
    lp = peaky_log_probs(3, 30, 7, gen)
    lengths = [30, 17, 4]
    want = [reference_prefix_search(lp[b, :n].tolist(), 6)[0] for b, n in enumerate(lengths)]
    for args in ((lp, torch.tensor(lengths)), (lp.numpy(), np.array(lengths)), (lp.tolist(), lengths)):
        got = decode_ctc(*args, CHARS, beam=6, token_topk=None, token_min_logp=None, blank_skip_threshold=None)
        for b in range(3):
            assert tuple(got[b][0].tokens) == want[b][0]
            assert got[b][0].score == pytest.approx(want[b][1], abs=1e-4)
            assert got[b][0].text == " ".join("".join(CHARS[i] for i in want[b][0]).split())


def test_a_blank_at_another_id_is_moved_and_ids_are_mapped_back() -> None:
    # Catches: blank_id ignored (id 0 searched as the blank), or token ids returned in the
    # permuted order instead of the caller's.
    gen = torch.Generator().manual_seed(2)
    lp = peaky_log_probs(2, 25, 6, gen)  # blank at 0 here ...
    order = [1, 2, 3, 4, 5, 0]  # ... and at 5 in the caller's layout
    moved = lp[..., order]
    tokens = ["a", "b", "c", "d", "e", "<pad>"]
    got = decode_ctc(moved, None, tokens, beam=5, blank_id=5)
    want = ctc_prefix_beam_search(lp, torch.tensor([25, 25]), beam=5, nbest=1).to_lists()
    for b in range(2):
        assert [order.index(order[i - 1]) for i in want[b][0].tokens] == got[b][0].tokens
        assert got[b][0].text == "".join(tokens[i] for i in got[b][0].tokens)
    assert decode_ctc(moved, None, tokens, beam=5)[0][0].tokens == got[0][0].tokens  # "<pad>" found by name


def test_an_lm_scorer_is_fused_with_its_weight() -> None:
    # Catches: lm or lm_weight / length_bonus not passed on to the search.
    gen = torch.Generator().manual_seed(3)
    lp = peaky_log_probs(2, 20, 7, gen)
    lm = BigramScorer(7, gen)
    got = decode_ctc(lp, [20, 11], CHARS, beam=4, nbest=4, lm=lm, lm_weight=0.7, length_bonus=0.3)
    want = ctc_prefix_beam_search(lp, torch.tensor([20, 11]), beam=4, scorers={"lm": lm},
                                  weights={"lm": 0.7, "length_bonus": 0.3}).to_lists()
    for b in range(2):
        assert [h.tokens for h in got[b]] == [h.tokens for h in want[b]]
        assert [h.score for h in got[b]] == pytest.approx([h.score for h in want[b]], abs=1e-6)


LP = torch.zeros(1, 6, 7).log_softmax(-1)


def _decode_fails(kwargs: dict, error: type, match: str) -> None:
    """decode_ctc on the 6-frame example with ``kwargs`` replacing its arguments raises ``error``."""
    args = dict(log_probs=LP, lengths=[6], tokens=CHARS)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        decode_ctc(args.pop("log_probs"), args.pop("lengths"), args.pop("tokens"), **args)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(tokens=CHARS[:-1]), ValueError, "token list has 6 entries but log_probs has 7 classes"),
    (dict(tokens=None), ValueError, "tokens .* is required"),
    (dict(unk_id=3), ValueError, "unk_id=3 is the token ' ', but the token list has '<unk>' at id 1"),
    (dict(tokens=["<blank>", " ", "'", "a", "b", "c", "d"], unk_id=1), ValueError, "unk_id=1 is the token ' ', an ordinary symbol"),
    (dict(tokens=["<blank>", " ", "'", "a", "b", "c", "d"], eos_id=2), ValueError, "eos_id=2 is the token \"'\", an ordinary symbol"),
    (dict(tokens=["<blank>", "<unk>", "<sos/eos>", "a", "b", "c", "d"], eos_id=1), ValueError, "eos_id=1 is the token '<unk>'"),
    (dict(blank_id=7), ValueError, "blank_id=7 is outside the token list \\(ids 0..6\\)"),
    (dict(blank_id=2), ValueError, "blank_id=2 is the token \"'\", but the token list has '<blank>' at id 0"),
    (dict(unk_id=1.0), TypeError, "unk_id must be an int or None, got float"),
    (dict(tokens=["x", "<unk>", "'", " ", "a", "b", "c"]), ValueError, "blank_id: no token named"),
    (dict(tokens=["<blank>", "<unk>", "<unk>", " ", "a", "b", "c"]), ValueError, "unk_id: the token list has several"),
    (dict(tokens=["<blank>", "<unk>", "'", " ", "a", "b", "c"], blank_id=0, unk_id=1, eos_id=1), ValueError,
     "unk_id and eos_id are both 1 \\('<unk>'\\)"),
    (dict(lengths=[6.5]), ValueError, "lengths must be whole numbers"),
    (dict(lengths=[7]), ValueError, "utterance 0 .*length 7 outside \\[0, 6\\]"),
    (dict(lengths=[6, 6]), ValueError, "lengths must be \\(1,\\)"),
    (dict(log_probs=LP.exp()), ValueError, "frame 0: log_probs look like probabilities .*sums to 1.0000"),
    (dict(log_probs=LP + 3.0), ValueError, "frame 0: log_probs has a positive value .*logits"),
    (dict(log_probs=LP - 2.0), ValueError, "not normalised \\(log sum exp = -2"),
    (dict(log_probs=LP.long()), ValueError, "floating point"),
    (dict(log_probs="abc"), TypeError, "log_probs must be a torch tensor, a numpy array"),
    (dict(lm="lm.arpa"), TypeError, "asrkit.lm.ngram_scorer\\('lm.arpa', tokens"),
    (dict(lm=object()), TypeError, "BatchScorer protocol"),
])
def test_bad_inputs_are_named(kwargs: dict, error: type, match: str) -> None:
    _decode_fails(kwargs, error, match)


def test_positive_values_are_found_on_valid_frames_only() -> None:
    # Catches: padding frames past an utterance's length (often zero-filled garbage) rejected; a
    # positive value on a later valid frame of a later utterance missed or misplaced.
    lp = LP.expand(2, 6, 7).clone()
    lp[0, 4:] = 5.0  # padding of utterance 0 (length 4)
    assert decode_ctc(lp, [4, 6], CHARS)[0][0].tokens is not None
    lp[1, 3, 2] = 0.5
    with pytest.raises(ValueError, match="utterance 1 \\(batch row 1\\), frame 3: log_probs has a positive value"):
        decode_ctc(lp, [4, 6], CHARS)


def test_an_lm_built_with_other_special_ids_is_refused() -> None:
    # Catches: an LM scorer whose unk / end-of-sentence ids differ from the token list's used silently
    # (the "every apostrophe scored as end of sentence").
    gen = torch.Generator().manual_seed(4)
    lm = BigramScorer(7, gen)
    lm.sos_eos_id, lm.unk_id = 2, 1
    tokens = ["<blank>", "<unk>", "'", "<sos/eos>", "a", "b", "c"]
    with pytest.raises(ValueError, match="built with sos_eos_id=2, but eos_id is 3"):
        decode_ctc(LP, [6], tokens, lm=lm)
    lm.sos_eos_id = 3
    decode_ctc(LP, [6], tokens, lm=lm)


def test_eos_id_none_is_accepted_and_a_2d_input_is_one_utterance() -> None:
    # Catches: eos_id=None failing (the TypeError), a (T, V) input not taken as one utterance.
    got = decode_ctc(spelled([4, 5], 7).float(), None, CHARS, eos_id=None)
    assert len(got) == 1 and got[0][0].text == "ab" and got[0][0].tokens == [4, 5]


def test_nan_and_inf_are_named_without_the_search_checks() -> None:
    # Catches: NaN or +inf reaching the search once decode_ctc skips ctc_prefix_beam_search's own
    # input pass (its one amax pass must find both).
    lp = LP.expand(2, 6, 7).clone()
    lp[1, 4, 3] = float("nan")
    with pytest.raises(ValueError, match="utterance 1 \\(batch row 1\\): log_probs contain NaN at frame 4"):
        decode_ctc(lp, None, CHARS)
    lp[1, 4, 3] = float("inf")
    with pytest.raises(ValueError, match="utterance 1 \\(batch row 1\\), frame 4: log_probs has a positive value"):
        decode_ctc(lp, None, CHARS)


def test_defaults_are_the_documented_ones() -> None:
    # Catches: a changed default beam (10), nbest (1), lm_weight (0.5) or pruning (token_topk 8,
    # token_min_logp -12, blank_skip_threshold 0.999): the results must be the reference search's with those.
    gen = torch.Generator().manual_seed(21)
    lp = random_log_probs(2, 20, 30, gen, scale=0.5)  # flat frames: the 9th best token would matter
    lp[1, 5:9] = torch.tensor([0.9995, *([0.0005 / 29] * 29)], dtype=torch.float64).log()  # skipped frames
    tokens = ["<blank>"] + [chr(0x61 + i) for i in range(29)]
    got = decode_ctc(lp, [20, 17], tokens, nbest=10)
    one = decode_ctc(lp, [20, 17], tokens)
    for b, n in enumerate([20, 17]):
        ref = ref_nbest(lp[b], n, 10, candidates=topk_candidates(lp[b], 8, -12.0), skip_blank_above=0.999)
        assert [tuple(h.tokens) for h in got[b]] == [r[0] for r in ref]
        assert [h.score for h in got[b]] == pytest.approx([r[1] for r in ref], abs=1e-9)
        assert len(one[b]) == 1 and one[b][0].tokens == got[b][0].tokens
    lm = BigramScorer(30, gen)
    with_lm = decode_ctc(lp, [20, 17], tokens, lm=lm, nbest=3)
    want = ctc_prefix_beam_search(lp, torch.tensor([20, 17]), nbest=3, scorers={"lm": lm}, weights={"lm": 0.5})
    assert [[h.score for h in row] for row in with_lm] == [[h.score for h in row] for row in want.to_lists()]


@pytest.mark.parametrize("prune", [dict(token_topk=1), dict(token_min_logp=-1.5)])
def test_pruning_options_are_passed_on(prune: dict) -> None:
    # Catches: token_topk or token_min_logp dropped on the way to the search (here they change the result).
    gen = torch.Generator().manual_seed(7)
    lp = random_log_probs(2, 12, 7, gen, scale=0.7)
    got = decode_ctc(lp, None, CHARS, beam=4, nbest=4, blank_skip_threshold=None, **prune)
    want = ctc_prefix_beam_search(lp, torch.tensor([12, 12]), beam=4, blank_skip_threshold=None,
                                  **{**dict(token_topk=None, token_min_logp=None), **prune}).to_lists()
    exact = ctc_prefix_beam_search(lp, torch.tensor([12, 12]), beam=4, token_topk=None, token_min_logp=None,
                                   blank_skip_threshold=None).to_lists()
    mine = [[h.tokens for h in row] for row in got]
    assert mine == [[h.tokens for h in row] for row in want]
    assert mine != [[h.tokens for h in row] for row in exact]  # the option matters on this input


def test_decoded_carries_the_ctc_score_and_token_frames() -> None:
    # Catches: Decoded.ctc_score or token_frames left empty or taken from the wrong field.
    gen = torch.Generator().manual_seed(8)
    lp = peaky_log_probs(2, 20, 7, gen)
    lm = BigramScorer(7, gen)
    got = decode_ctc(lp, [20, 15], CHARS, beam=4, nbest=4, lm=lm)
    want = ctc_prefix_beam_search(lp, torch.tensor([20, 15]), beam=4, scorers={"lm": lm}, weights={"lm": 0.5})
    for mine, ref in zip(got, want.to_lists()):
        assert [h.ctc_score for h in mine] == [h.ctc_score for h in ref]
        assert [h.token_frames for h in mine] == [list(h.token_frames) for h in ref]
        assert all(h.ctc_score != h.score for h in mine)  # the LM part is in score only


def test_text_drops_eos_and_prints_word_marks_as_spaces() -> None:
    # Catches: an emitted <sos/eos> printed in the text, "|" / "▁" printed as themselves.
    tokens = ["<blank>", "<unk>", "<sos/eos>", "|", "\u2581", "a", "b"]
    got = decode_ctc(spelled([5, 3, 6, 2, 4, 5], 7), None, tokens, token_topk=None)
    assert got[0][0].tokens == [5, 3, 6, 2, 4, 5]  # the eos id stays in the ids ...
    assert got[0][0].text == "a b a"  # ... but not in the text


def test_inputs_that_look_odd_but_are_valid_are_accepted() -> None:
    # Catches: the log-probability check reading padding (zero-length and length-1 utterances), a
    # probability row with zeros taken for logits, a value rounding to just above 0 refused, whole-number
    # float or 0-dim lengths refused, flashlight's one-character blank ("-") taken for an ordinary symbol.
    lp = spelled([4, 5], 7).expand(3, 6, 7).clone()
    lp[0] = 3.0  # utterance 0 has no frames: all padding
    lp[1, 1:] = -5.0  # utterance 1 has one frame: the rest is padding, not normalised
    lp[2, 2] = -30.0
    lp[2, 2, 4] = 1e-6  # rounding just above zero (float64: exactly the tolerance); the row is normalised
    got = decode_ctc(lp, torch.tensor([0.0, 1.0, 6.0]), CHARS)
    assert got[0][0].tokens == [] and got[1][0].tokens == [4]
    assert decode_ctc(spelled([4, 5], 7), 6, CHARS)[0][0].tokens == [4, 5]  # a 0-dim length
    dash = ["-", "<unk>", "'", " ", "a", "b", "c"]
    assert decode_ctc(spelled([4, 5], 7), None, dash, blank_id=0)[0][0].text == "ab"
    probs = torch.zeros(1, 3, 7, dtype=torch.float64)
    probs[0, :, 4] = 1.0  # one-hot probabilities: exact zeros
    with pytest.raises(ValueError, match="frame 0: log_probs look like probabilities"):
        decode_ctc(probs, None, CHARS)
    with pytest.raises(ValueError, match="frame 0: log_probs has a positive value"):
        decode_ctc(probs * 1.5, None, CHARS)  # non-negative but not summing to 1: scores, not probabilities


@pytest.mark.parametrize("frame", [0, 3, 6])
def test_normalisation_is_checked_on_the_first_middle_and_last_frame(frame: int) -> None:
    # Catches: the middle ((n-1)//2) or last (n-1) checked frame moved, or the first offending one misreported.
    lp = spelled([4, 5, 6, 4], 7, frames_per=1)[:7].clone()  # 7 frames, all normalised
    lp[frame] -= 2.0
    with pytest.raises(ValueError, match=f"utterance 0 \\(batch row 0\\), frame {frame}: log_probs are not normalised"):
        decode_ctc(lp, None, CHARS)
    one = spelled([4], 7)[:1].clone() - 2.0
    with pytest.raises(ValueError, match="frame 0: log_probs are not normalised"):
        decode_ctc(one, None, CHARS)  # a one-frame utterance is checked too


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(tokens=None), ValueError, "^tokens \\(the list of the V output symbols\\) is required$"),
    (dict(tokens=list(range(7))), TypeError, "^tokens must be a sequence of strings \\(one per output class\\)$"),
    (dict(tokens="abcdefg"), TypeError, "^tokens must be a sequence of strings"),
    (dict(log_probs=LP[..., None]), ValueError, "or \\(frames, vocab\\), got shape \\(1, 6, 7, 1\\)"),
    (dict(log_probs="abc"), TypeError, "log_probs must be a torch tensor.*\\(str: "),
    (dict(lengths="six"), TypeError, "^lengths must be a torch tensor, a numpy array or a nested list"),
    (dict(lengths=torch.tensor([True])), ValueError, "lengths must be integers, got torch.bool"),
    (dict(lm=pathlib.Path("lm.arpa")), TypeError, "asrkit.lm.ngram_scorer\\('lm.arpa', tokens"),
    (dict(lm=object()), TypeError, "BatchScorer protocol .*got object$"),
    (dict(tokens=["<blank>", " ", "'", "a", "b", "c", "d"], eos_id=2), ValueError, "pass the id of the eos token"),
    (dict(tokens=["<blank>", "a", "b", "c", "d", "e", "f"], unk_id=0), ValueError,
     "^blank_id and unk_id are both 0 \\('<blank>'\\)$"),
])
def test_more_bad_inputs_are_named(kwargs: dict, error: type, match: str) -> None:
    _decode_fails(kwargs, error, match)


def test_an_lm_is_checked_for_each_special_id_and_the_blank_position() -> None:
    # Catches: the blank or unk id of an LM scorer not compared, or named wrongly; an LM accepted with
    # the blank moved away from id 0.
    gen = torch.Generator().manual_seed(4)
    lm = BigramScorer(7, gen)
    tokens = ["<blank>", "<unk>", "'", "<sos/eos>", "a", "b", "c"]
    lm.blank_id = 3
    with pytest.raises(ValueError, match="built with blank_id=3, but blank_id is 0"):
        decode_ctc(LP, [6], tokens, lm=lm)
    lm.blank_id, lm.unk_id = 0, 2
    with pytest.raises(ValueError, match="built with unk_id=2, but unk_id is 1"):
        decode_ctc(LP, [6], tokens, lm=lm)
    lm.unk_id = 1
    moved = ["a", "<unk>", "'", "<sos/eos>", "b", "c", "<blank>"]
    with pytest.raises(ValueError, match="^blank_id=6: an LM scorer needs the blank at id 0"):
        decode_ctc(LP, [6], moved, lm=BigramScorer(7, gen))


def test_native_chooses_the_frame_loop_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: `native` dropped or inverted on the way to the search. True and False give the same
    # n-best (scores to rounding, on a blank moved from another id too); True runs the C++ loop and
    # False the torch frame loop, seen through which of them is called.
    import asrkit.search.ctc_prefix as ctc_prefix
    import asrkit.search.prefix_loop as prefix_loop
    from asrkit.search import native_build

    if native_build.load() is None:
        pytest.skip("no C++ compiler: the native loop cannot build")
    gen = torch.Generator().manual_seed(5)
    lp = random_log_probs(3, 16, 9, gen, scale=0.6)
    tokens = ["a", "b", "c", "<blank>", "d", "e", "f", "g", "h"]  # the blank at id 3: moved to 0 and back
    ran: list = []
    real_loop, real_native = prefix_loop.frame_loop, ctc_prefix.native_loop.search
    monkeypatch.setattr(prefix_loop, "frame_loop", lambda *a, **k: ran.append("torch") or real_loop(*a, **k))
    monkeypatch.setattr(ctc_prefix.native_loop, "search", lambda *a, **k: ran.append("native") or real_native(*a, **k))
    on = decode_ctc(lp, [16, 11, 0], tokens, nbest=4, native=True)
    assert ran == ["native"]
    off = decode_ctc(lp, [16, 11, 0], tokens, nbest=4, native=False)
    assert ran[1:] and set(ran[1:]) == {"torch"}
    ran.clear()
    decode_ctc(lp, [16, 11, 0], tokens, nbest=4)  # the default: native where it can run
    assert ran == ["native"]
    for b in range(3):
        assert [h.tokens for h in on[b]] == [h.tokens for h in off[b]]
        assert [h.score for h in on[b]] == pytest.approx([h.score for h in off[b]], abs=1e-6)
        assert [h.token_frames for h in on[b]] == [h.token_frames for h in off[b]]


def test_native_true_where_it_cannot_run_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: native=True silently falling back to the torch loop; the error says why.
    gen = torch.Generator().manual_seed(6)
    lp = random_log_probs(1, 8, 7, gen, scale=0.6)
    lm = BigramScorer(7, gen)  # a plain BatchScorer: no native form
    with pytest.raises(ValueError, match=r"native=True.*BigramScorer.*no native form"):
        decode_ctc(lp, None, CHARS, lm=lm, native=True)
    assert decode_ctc(lp, None, CHARS, lm=lm, native=None)[0][0].tokens == \
        decode_ctc(lp, None, CHARS, lm=lm, native=False)[0][0].tokens  # auto: the torch loop, no error
    monkeypatch.setenv("ASRKIT_NATIVE", "0")
    with pytest.raises(ValueError, match="native=True.*ASRKIT_NATIVE=0"):
        decode_ctc(lp, None, CHARS, native=True)
