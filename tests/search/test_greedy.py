import torch

from asrkit.search.greedy import ctc_greedy_search


def reference_greedy(lp, n, blank=0):
    best = lp[:n].argmax(-1).tolist()
    out, frames, prev = [], [], None
    for t, k in enumerate(best):
        if k != blank and k != prev:
            out.append(k)
            frames.append(t)
        prev = k
    return out, frames


def test_batched_greedy_matches_a_per_utterance_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        b, t, v = 1 + trial % 5, 1 + (trial * 7) % 40, 2 + trial % 9
        lp = torch.randn(b, t, v, generator=g).mul(3).log_softmax(-1)
        lens = torch.randint(0, t + 1, (b,), generator=g)
        tokens, counts, frames = ctc_greedy_search(lp, lens)
        for i in range(b):
            ref, ref_frames = reference_greedy(lp[i], int(lens[i]))
            assert tokens[i, : counts[i]].tolist() == ref
            assert frames[i, : counts[i]].tolist() == ref_frames
            assert (tokens[i, counts[i]:] == -1).all()


def test_repeats_separated_by_blank_are_kept():
    ids = torch.tensor([[3, 3, 0, 3, 4, 4, 0, 0]])
    lp = torch.nn.functional.one_hot(ids, 5).float().log()
    tokens, counts, frames = ctc_greedy_search(lp, torch.tensor([8]))
    assert tokens[0].tolist() == [3, 3, 4] and frames[0].tolist() == [0, 3, 4]
