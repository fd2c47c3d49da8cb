"""The label-synchronous CTC prefix scorer against torch's ctc_loss, brute force and a python reference."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from asrkit.search import CTCPrefixScorer
from reference_beam_search import RefCTC, logsumexp

CPU = torch.device("cpu")


def random_log_probs(b: int, t: int, v: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(b, t, v, generator=gen, dtype=torch.float64) * 2).log_softmax(-1).to(dtype)


def drive(scorer: CTCPrefixScorer, seqs, beam: int, n_cand: int, gen: torch.Generator):
    """Feed each row its sequence, then <eos>, among random other candidates; returns
    (sum of scores incl. <eos>, sum before <eos> + final_score) per row (N,)."""
    n = len(seqs)
    batch = n // beam
    state = scorer.init_state(batch, beam, CPU)
    total = torch.zeros(n, dtype=torch.float64)
    via_final = torch.zeros(n, dtype=torch.float64)
    steps = max(len(s) for s in seqs) + 1
    vocab = scorer.vocab_size
    for step in range(steps):
        want = torch.tensor([s[step] if step < len(s) else 2 for s in seqs])  # (N,)
        cands = torch.randint(1, vocab, (n, n_cand), generator=gen)
        col = torch.randint(0, n_cand, (n,), generator=gen)
        cands[torch.arange(n), col] = want
        final = scorer.final_score(state)
        scores = scorer.score(state, cands)[torch.arange(n), col]
        for r, s in enumerate(seqs):
            if step < len(s):
                total[r] += scores[r]
                via_final[r] += scores[r]
            elif step == len(s):
                total[r] += scores[r]
                via_final[r] += final[r]
        state = scorer.select_state(state, torch.arange(n), want)
    return total, via_final


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sequence_score_plus_eos_equals_minus_ctc_loss(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(6):
        batch, frames, vocab, beam = 1 + trial % 3, 12 + 9 * trial, 5 + trial, 1 + trial % 2
        lp = random_log_probs(batch, frames, vocab, gen, dtype)
        lengths = torch.randint(frames // 2, frames + 1, (batch,), generator=gen)
        lengths[0] = frames
        seqs = []
        for r in range(batch * beam):  # token ids 1..V-1 except <eos> (2); repeats included
            length = int(torch.randint(0, int(lengths[r // beam]) // 2 + 1, (1,), generator=gen))
            ids = torch.randint(3, vocab, (length,), generator=gen).tolist()
            seqs.append([1 if (i % 5 == 4) else t for i, t in enumerate(ids)])
        scorer = CTCPrefixScorer(lp, lengths)
        total, via_final = drive(scorer, seqs, beam, 3, gen)
        width = max(1, max(len(s) for s in seqs))
        targets = torch.tensor([s + [1] * (width - len(s)) for s in seqs])
        row_lp = lp.double().repeat_interleave(beam, 0).transpose(0, 1)  # (T, N, V)
        want = -F.ctc_loss(row_lp, targets, lengths.repeat_interleave(beam), torch.tensor([len(s) for s in seqs]),
                           blank=0, reduction="none", zero_infinity=False)
        torch.testing.assert_close(total, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(via_final, want, atol=1e-4, rtol=0)


def test_prefix_probability_equals_brute_force_over_all_paths() -> None:
    gen = torch.Generator().manual_seed(1)
    frames, vocab = 6, 4
    lp = random_log_probs(1, frames, vocab, gen, torch.float64)
    prefix_mass: dict = {}
    for path in itertools.product(range(vocab), repeat=frames):  # 4096 alignments
        labels = [k for i, k in enumerate(path) if k != 0 and (i == 0 or path[i - 1] != k)]
        logp = sum(float(lp[0, t, k]) for t, k in enumerate(path))
        for cut in range(len(labels) + 1):
            prefix_mass.setdefault(tuple(labels[:cut]), []).append(logp)
    scorer = CTCPrefixScorer(lp, torch.tensor([frames]))
    for prefix in [(1,), (3,), (1, 3), (3, 3), (1, 3, 1), (3, 3, 3), (1, 1, 3, 3)]:
        state = scorer.init_state(1, 1, CPU)
        psi = 0.0
        for tok in prefix:
            psi += float(scorer.score(state, torch.tensor([[tok]]))[0, 0])
            state = scorer.select_state(state, torch.tensor([0]), torch.tensor([tok]))
        assert psi == pytest.approx(logsumexp(prefix_mass[prefix]), abs=1e-9), prefix


def test_scores_equal_the_python_reference_on_random_prefixes() -> None:
    gen = torch.Generator().manual_seed(2)
    lp = random_log_probs(2, 9, 6, gen, torch.float64)
    lengths = torch.tensor([9, 4])
    scorer = CTCPrefixScorer(lp, lengths)
    refs = [RefCTC(lp[b, :int(lengths[b])].tolist(), 6) for b in range(2)]
    beam = 3
    prefixes = [[(), (3,), (3, 3)], [(), (4, 5), (1, 4, 1, 1, 5)]]  # the last is too long for 4 frames
    all_tokens = torch.arange(6).expand(2 * beam, 6)
    state = scorer.init_state(2, beam, CPU)
    for step in range(5):
        want = torch.tensor([p[step] if step < len(p) else -1 for ps in prefixes for p in ps])
        scorer.score(state, all_tokens)
        state = scorer.select_state(state, torch.arange(2 * beam), want)
    got = scorer.score(state, all_tokens).view(2, beam, 6)
    for b in range(2):
        for k, prefix in enumerate(prefixes[b]):
            ref = refs[b](prefix)
            for c in range(6):
                if ref[c] == float("-inf"):
                    assert got[b, k, c] == float("-inf"), (b, prefix, c)
                else:
                    assert float(got[b, k, c]) == pytest.approx(ref[c], abs=1e-9), (b, prefix, c)
    assert not torch.isnan(got).any()


def test_padded_frames_do_not_matter() -> None:
    gen = torch.Generator().manual_seed(3)
    lp = random_log_probs(1, 10, 5, gen, torch.float64)
    padded = torch.cat([lp, random_log_probs(1, 7, 5, gen, torch.float64)], 1)
    tokens = torch.arange(5).expand(1, 5)
    results = []
    for x in (lp, padded):
        scorer = CTCPrefixScorer(x, torch.tensor([10]))
        state = scorer.init_state(1, 1, CPU)
        out = []
        for tok in (3, 4, 4):
            out.append(scorer.score(state, tokens))
            state = scorer.select_state(state, torch.tensor([0]), torch.tensor([tok]))
        out.append(scorer.final_score(state)[:, None])
        results.append(torch.cat(out, 1))
    torch.testing.assert_close(results[0], results[1], atol=1e-9, rtol=0)


def test_select_state_reuses_the_cached_forward_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(4)
    scorer = CTCPrefixScorer(random_log_probs(2, 8, 5, gen), torch.tensor([8, 6]))
    state = scorer.init_state(2, 2, CPU)
    scorer.score(state, torch.tensor([[3, 4], [4, 1], [1, 3], [3, 3]]))

    def no_recompute(*args, **kwargs):
        raise AssertionError("select_state recomputed the forward variables")

    monkeypatch.setattr(torch, "logcumsumexp", no_recompute)
    new = scorer.select_state(state, torch.tensor([1, 0, 3, 2]), torch.tensor([1, 3, 3, 1]))
    torch.testing.assert_close(new.r_n, torch.stack([state.cand_r_n[1, 1], state.cand_r_n[0, 0],
                                                     state.cand_r_n[3, 0], state.cand_r_n[2, 0]]))
    torch.testing.assert_close(new.psi, state.cand_psi[[1, 0, 3, 2], [1, 0, 0, 0]])
    assert new.last.tolist() == [1, 3, 3, 1]


def test_blank_scores_minus_inf_and_zero_frames_allow_only_the_empty_hypothesis() -> None:
    scorer = CTCPrefixScorer(torch.zeros(2, 3, 4).log_softmax(-1), torch.tensor([3, 0]))
    state = scorer.init_state(2, 1, CPU)
    got = scorer.score(state, torch.arange(4).expand(2, 4))
    assert got[0, 0] == float("-inf") and got[1, 0] == float("-inf")
    assert torch.isfinite(got[0, 1:]).all()
    assert got[1, 2] == 0.0 and got[1, 1] == float("-inf") and got[1, 3] == float("-inf")
    assert float(got[0, 2]) == pytest.approx(3 * math.log(0.25), abs=1e-6)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="utterance 1.*length 9"):
        CTCPrefixScorer(torch.zeros(2, 8, 4).log_softmax(-1), torch.tensor([8, 9]))
    with pytest.raises(ValueError, match="holds 2 utterances"):
        CTCPrefixScorer(torch.zeros(2, 8, 4).log_softmax(-1), torch.tensor([8, 5])).init_state(3, 1, CPU)


def _sequence_scores(scorer: CTCPrefixScorer, seqs) -> torch.Tensor:
    """(N,) sum of each row's token scores, its <eos> score and nothing after (beam 1, one row per utterance)."""
    n = len(seqs)
    state = scorer.init_state(n, 1, CPU)
    total = torch.zeros(n, dtype=torch.float64)
    for step in range(max(len(s) for s in seqs) + 1):
        tok = torch.tensor([s[step] if step < len(s) else 2 for s in seqs])
        got = scorer.score(state, tok[:, None])[:, 0]
        assert got.dtype == torch.float64
        total += torch.tensor([float(got[r]) if step <= len(s) else 0.0 for r, s in enumerate(seqs)],
                              dtype=torch.float64)
        state = scorer.select_state(state, torch.arange(n), tok)
    return total


def test_float32_input_over_3000_frames_is_scored_in_float64() -> None:
    # Catches: the float64 upcast of the input dropped, so the cumulative sums over T run in float32
    # (error ~1e-4 at T = 3000 instead of ~1e-11), and scores returned in the input's dtype.
    gen = torch.Generator().manual_seed(5)
    frames = 3000
    lp = random_log_probs(2, frames, 4, gen, torch.float32)
    lengths = torch.tensor([frames, 2500])
    seqs = [[1, 3, 3, 1], [3, 1]]
    got = _sequence_scores(CTCPrefixScorer(lp, lengths), seqs)
    want = -F.ctc_loss(lp.double().transpose(0, 1), torch.tensor([[1, 3, 3, 1], [3, 1, 0, 0]]), lengths,
                       torch.tensor([4, 2]), blank=0, reduction="none", zero_infinity=False)
    torch.testing.assert_close(got, want, atol=1e-8, rtol=0)


def test_zero_frames_and_one_frame() -> None:
    # Catches: the zero-frame input not padded (or padded wrongly) so scoring fails or gives the
    # empty hypothesis a score other than log 1; a one-frame input mistaken for the zero-frame case
    # (its log-probabilities replaced by the padding).
    tokens = torch.arange(5).expand(2, 5)
    empty = CTCPrefixScorer(torch.zeros(2, 0, 5), torch.tensor([0, 0]))
    state = empty.init_state(2, 1, CPU)
    got = empty.score(state, tokens)
    assert got[:, 2].tolist() == [0.0, 0.0]  # <eos>: log P(empty | x) = 0
    assert torch.isneginf(got[:, [0, 1, 3, 4]]).all()
    assert empty.final_score(state).tolist() == [0.0, 0.0]

    one = torch.tensor([[[0.5, 0.2, 0.1, 0.15, 0.05]], [[0.1, 0.6, 0.1, 0.1, 0.1]]], dtype=torch.float64).log()
    scorer = CTCPrefixScorer(one, torch.tensor([1, 1]))
    state = scorer.init_state(2, 1, CPU)
    got = scorer.score(state, tokens)
    # One frame: P(prefix c) = P_1(c), P(empty) = P_1(blank) (brute force over the V one-frame paths).
    torch.testing.assert_close(got[:, [1, 3, 4]], one[:, 0, [1, 3, 4]], atol=1e-12, rtol=0)
    torch.testing.assert_close(got[:, 2], one[:, 0, 0], atol=1e-12, rtol=0)
    state = scorer.select_state(state, torch.arange(2), torch.tensor([3, 1]))
    torch.testing.assert_close(scorer.final_score(state), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32])
def test_lengths_of_any_integer_dtype_are_accepted(dtype: torch.dtype) -> None:
    # Catches: lengths kept in their own integer dtype (int16 lengths then fail as gather indices).
    gen = torch.Generator().manual_seed(6)
    lp = random_log_probs(2, 10, 5, gen, torch.float64)
    lengths = torch.tensor([10, 7], dtype=dtype)
    got = _sequence_scores(CTCPrefixScorer(lp, lengths), [[1, 3], [4, 4, 1]])
    want = -F.ctc_loss(lp.transpose(0, 1), torch.tensor([[1, 3, 0], [4, 4, 1]]), lengths.long(), torch.tensor([2, 3]),
                       blank=0, reduction="none")
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_out_of_range_candidate_ids_do_not_disturb_the_real_ones() -> None:
    # Catches: candidate ids gathered unclamped, so a padding id (-1) or an id beyond the CTC
    # vocabulary (a decoder-only symbol) makes the whole batched call fail.
    gen = torch.Generator().manual_seed(7)
    scorer = CTCPrefixScorer(random_log_probs(1, 8, 5, gen, torch.float64), torch.tensor([8]))
    state = scorer.init_state(1, 2, CPU)
    scorer.score(state, torch.tensor([[3], [3]]))
    state = scorer.select_state(state, torch.tensor([0, 1]), torch.tensor([-1, 3]))  # rows: () and (3,)
    plain = scorer.score(state, torch.tensor([[1, 3, 4], [1, 3, 4]]))
    mixed = scorer.score(state, torch.tensor([[1, -1, 3, 5, 4], [7, 1, 3, 4, -1]]))
    torch.testing.assert_close(mixed[0, [0, 2, 4]], plain[0], atol=0, rtol=0)
    torch.testing.assert_close(mixed[1, [1, 2, 3]], plain[1], atol=0, rtol=0)


def test_the_prefix_score_never_gains() -> None:
    # beam_search's early stop takes the CTC prefix score to add nothing (max_gain 0, 0): psi(h + c) <= psi(h) and
    # log P_ctc(h | x) <= psi(h), checked along random continuations that end by <eos> or the final score.
    import random

    from gain_bound import worst_gain

    gen = torch.Generator().manual_seed(8)
    lp = random_log_probs(1, 12, 5, gen, dtype=torch.float64).expand(30, -1, -1)  # one utterance per walk
    scorer = CTCPrefixScorer(lp, torch.full((30,), 12))
    assert scorer.max_gain() == (0.0, 0.0, False)
    rng = random.Random(8)
    assert worst_gain(scorer, [[rng.choice([1, 3, 4]) for _ in range(5)] for _ in range(30)], eos=2) <= 1e-9
