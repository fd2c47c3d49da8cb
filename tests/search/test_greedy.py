"""Batched greedy CTC decoding against a per-utterance python loop."""
import pytest
import torch

from asrkit.search.greedy import check_ctc_inputs, collapse, ctc_greedy_search, greedy_search, trailing_blanks
from asrkit.search.hypotheses import NBest


def reference_greedy(lp, n, blank=0):
    best = lp[:n].argmax(-1).tolist()
    out, frames, prev = [], [], None
    for t, k in enumerate(best):
        if k != blank and k != prev:
            out.append(k)
            frames.append(t)
        prev = k
    score = float(lp[:n].max(-1).values.double().sum()) if n else 0.0
    return out, frames, score


def reference_trailing_blanks(ids, blank=0):
    """The blank frames at the end of a list of frame ids."""
    k = len(ids)
    while k > 0 and ids[k - 1] == blank:
        k -= 1
    return len(ids) - k


def test_batched_greedy_matches_a_per_utterance_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        b, t, v = 1 + trial % 5, 1 + (trial * 7) % 40, 2 + trial % 9
        lp = torch.randn(b, t, v, generator=g).mul(3).log_softmax(-1)
        lens = torch.randint(0, t + 1, (b,), generator=g)
        tokens, counts, frames = ctc_greedy_search(lp, lens)
        nbest = greedy_search(lp, lens)
        hyps = nbest.to_lists()
        for i in range(b):
            ref, ref_frames, ref_score = reference_greedy(lp[i], int(lens[i]))
            assert tokens[i, : counts[i]].tolist() == ref
            assert frames[i, : counts[i]].tolist() == ref_frames
            assert (tokens[i, counts[i]:] == -1).all()
            assert hyps[i][0].tokens == ref and hyps[i][0].token_frames == ref_frames
            assert hyps[i][0].score == pytest.approx(ref_score, abs=1e-4)


def test_repeats_separated_by_blank_are_kept():
    ids = torch.tensor([[3, 3, 0, 3, 4, 4, 0, 0]])
    lp = torch.nn.functional.one_hot(ids, 5).float().log()
    tokens, counts, frames = ctc_greedy_search(lp, torch.tensor([8]))
    assert tokens[0].tolist() == [3, 3, 4] and frames[0].tolist() == [0, 3, 4]


def test_frames_past_the_length_are_ignored():
    ids = torch.tensor([[1, 0, 2, 3], [1, 0, 2, 3]])
    lp = torch.nn.functional.one_hot(ids, 4).double().mul(5).log_softmax(-1)
    hyps = greedy_search(lp, torch.tensor([4, 2])).to_lists()
    assert hyps[0][0].tokens == [1, 2, 3] and hyps[1][0].tokens == [1]
    assert hyps[1][0].score == pytest.approx(float(lp[1, :2].max(-1).values.sum()))


def test_nbest_cat_pads_and_keeps_order():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(3, 12, 6, generator=g).log_softmax(-1)
    lens = torch.tensor([12, 3, 7])
    whole = greedy_search(lp, lens).to_lists()
    parts = NBest.cat([greedy_search(lp[:1], lens[:1]), greedy_search(lp[1:], lens[1:])]).to_lists()
    assert parts == whole


@pytest.mark.parametrize("lp,lens,match", [
    (torch.zeros(2, 5), torch.tensor([5, 5]), "batch, frames, vocab"),
    (torch.zeros(2, 5, 3), torch.tensor([5]), r"lengths must be \(2,\)"),
    (torch.zeros(2, 5, 3), torch.tensor([5, 6]), "utterance 1.*length 6"),
    (torch.zeros(1, 5, 1), torch.tensor([5]), "vocab size 1"),
])
def test_bad_inputs_are_named(lp, lens, match):
    with pytest.raises(ValueError, match=match):
        greedy_search(lp, lens)


def test_collapse_in_pieces_carries_the_previous_frame_and_the_blank_run():
    # streams cut at random frames: each piece collapsed and counted with what the frames before it left equals
    # the whole path's tokens, token frames and trailing blanks (repeats across a cut are one token)
    g = torch.Generator().manual_seed(3)
    for trial in range(30):
        b, t, v = 1 + trial % 4, 1 + (trial * 5) % 30, 2 + trial % 3
        ids = torch.randint(0, v, (b, t), generator=g)
        ids[:, : t // 3] = torch.where(torch.rand(b, t // 3, generator=g) < 0.6, 0, ids[:, : t // 3])  # blank runs
        lens = torch.randint(0, t + 1, (b,), generator=g)
        tokens = [[] for _ in range(b)]
        frames = [[] for _ in range(b)]
        last = torch.full((b,), -1)
        run = torch.zeros(b, dtype=torch.long)
        start = 0
        while start < t:
            n = int(torch.randint(1, 8, (1,), generator=g))
            piece = ids[:, start:start + n]
            valid = (lens - start).clamp(0, piece.shape[1])
            toks, counts, firsts, mask = collapse(piece, valid, previous=last)
            assert torch.equal(mask, torch.arange(piece.shape[1]) < valid[:, None])
            run = trailing_blanks(piece, valid, run)
            for i in range(b):
                tokens[i] += toks[i, : counts[i]].tolist()
                frames[i] += (firsts[i, : counts[i]] + start).tolist()
                if valid[i] > 0:
                    last[i] = piece[i, valid[i] - 1]
            start += n
        for i in range(b):
            n = int(lens[i])
            lp = torch.nn.functional.one_hot(ids[i], v).float().log()
            ref_tokens, ref_frames, _ = reference_greedy(lp, n)
            assert (tokens[i], frames[i]) == (ref_tokens, ref_frames), (trial, i)
            assert int(run[i]) == reference_trailing_blanks(ids[i, :n].tolist()), (trial, i)


def test_trailing_blanks_without_frames_or_a_run_before():
    ids = torch.tensor([[2, 0, 0, 0], [0, 0, 3, 0], [0, 0, 0, 0], [1, 1, 0, 1]])
    lens = torch.tensor([4, 4, 3, 2])
    assert trailing_blanks(ids, lens).tolist() == [3, 1, 3, 0]  # no run before: a silent row counts its own frames
    assert trailing_blanks(ids, lens, torch.tensor([5, 5, 5, 5])).tolist() == [3, 1, 8, 0]
    assert trailing_blanks(ids, torch.tensor([0, 0, 0, 0]), torch.tensor([7, 0, 2, 1])).tolist() == [7, 0, 2, 1]
    assert trailing_blanks(ids[:, :0], torch.tensor([0, 0, 0, 0]), torch.tensor([4, 0, 1, 2])).tolist() == [4, 0, 1, 2]
    assert trailing_blanks(ids[:, :0], torch.tensor([0, 0, 0, 0])).tolist() == [0, 0, 0, 0]
    assert trailing_blanks(torch.tensor([[5, 5, 2]]), torch.tensor([3]), blank=2).tolist() == [1]


def test_another_blank_id_is_dropped_and_id_0_is_a_token():
    ids = torch.tensor([[0, 0, 3, 0, 2, 2, 3, 2]])
    lp = torch.nn.functional.one_hot(ids, 4).float().log()
    tokens, counts, frames = ctc_greedy_search(lp, torch.tensor([8]), blank=3)
    assert tokens[0, : counts[0]].tolist() == [0, 0, 2, 2] and frames[0, : counts[0]].tolist() == [0, 3, 4, 7]


def test_input_checks_name_the_utterance_the_frame_and_the_dtype():
    lp = torch.zeros(3, 6, 4)
    lp[0, 2, 1] = float("-inf")  # log 0 is allowed
    lp[1, 4, 0], lp[1, 2, 3] = float("nan"), float("nan")
    lp[2, 1, 2] = float("inf")
    lens = torch.tensor([6, 6, 6])
    for bad, match in ((lp, "^utterance 1 \\(batch row 1\\): log_probs contain NaN or \\+inf at frame 2$"),
                       (lp[2:], "^utterance 0 \\(batch row 0\\): log_probs contain NaN or \\+inf at frame 1$")):
        with pytest.raises(ValueError, match=match):
            check_ctc_inputs(bad, lens[: bad.shape[0]])
    check_ctc_inputs(lp[:1], lens[:1])
    with pytest.raises(ValueError, match="^log_probs must be floating point, got torch.int64$"):
        check_ctc_inputs(lp[:1].long(), lens[:1])
    for dtype in (torch.float32, torch.complex64):
        with pytest.raises(ValueError, match=f"^lengths must be integers, got {dtype}$"):
            check_ctc_inputs(lp[:1], lens[:1].to(dtype))
