"""Loss terms against hand computations and torch references."""
import math

import pytest
import torch
import torch.nn.functional as F

from asrkit.models.losses import (ctc_loss, ctc_min_frames, interctc_combine, iterated_combine,
                                  label_smoothing_loss, token_accuracy)


def test_label_smoothing_hand_computed_case():
    # One token, V = 3, uniform prediction, smoothing 0.2: q = (0.8, 0.1, 0.1), p = 1/3 each.
    logits = torch.zeros(1, 1, 3)
    targets = torch.tensor([[0]])
    expected = 0.8 * math.log(0.8 * 3) + 2 * 0.1 * math.log(0.1 * 3)  # sum q log(q / p)
    assert label_smoothing_loss(logits, targets, 0.2).item() == pytest.approx(expected, abs=1e-6)


def test_label_smoothing_matches_kl_div_reference_with_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7)
    targets = torch.tensor([[1, 2, 3, -1], [4, 5, -1, -1], [6, 0, 2, 3]])
    smoothing = 0.1
    valid = targets >= 0
    q = torch.full((3, 4, 7), smoothing / 6)
    q.scatter_(-1, targets.clamp(min=0).unsqueeze(-1), 1 - smoothing)
    per_token = F.kl_div(logits.log_softmax(-1), q, reduction="none").sum(-1)  # (B, L)
    total = (per_token * valid).sum()
    torch.testing.assert_close(label_smoothing_loss(logits, targets, smoothing), total / 3)
    torch.testing.assert_close(label_smoothing_loss(logits, targets, smoothing, "token"), total / valid.sum())


def test_no_smoothing_is_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 9)
    targets = torch.tensor([[1, 2, 3, 4, -1], [5, 6, -1, -1, -1]])
    ce = F.cross_entropy(logits.view(-1, 9), targets.view(-1), ignore_index=-1, reduction="sum") / 2
    torch.testing.assert_close(label_smoothing_loss(logits, targets, 0.0), ce)
    with pytest.raises(ValueError, match="normalize"):
        label_smoothing_loss(logits, targets, 0.1, "utterance")


def test_token_accuracy_hand_made():
    logits = torch.full((2, 3, 4), -5.0)
    # argmax per position: [1, 2, 3], [0, 0, 0]
    for b, row in enumerate([[1, 2, 3], [0, 0, 0]]):
        for t, v in enumerate(row):
            logits[b, t, v] = 5.0
    targets = torch.tensor([[1, 0, 3], [0, -1, -1]])  # valid 4, correct 3 (pos (0,1) wrong)
    assert token_accuracy(logits, targets).item() == pytest.approx(0.75)


def test_interctc_combination():
    ctc = torch.tensor(10.0)
    inter = [torch.tensor(4.0), torch.tensor(8.0)]
    assert interctc_combine(ctc, inter, 0.3).item() == pytest.approx(0.7 * 10 + 0.3 * 6)
    assert interctc_combine(ctc, [], 0.3).item() == pytest.approx(10.0)


def test_ctc_min_frames_is_the_feasibility_boundary():
    assert ctc_min_frames([]) == 0
    assert ctc_min_frames([3, 4, 5]) == 3
    assert ctc_min_frames([3, 3, 3, 4, 4]) == 8
    torch.manual_seed(0)
    for tokens in ([3, 4, 5], [3, 3, 4], [5, 5, 5, 5]):
        need = ctc_min_frames(tokens)
        for frames, feasible in ((need, True), (need - 1, False)):
            lp = torch.randn(1, frames, 7).log_softmax(-1)
            loss = F.ctc_loss(lp.transpose(0, 1), torch.tensor([tokens]), torch.tensor([frames]),
                              torch.tensor([len(tokens)]), reduction="sum")
            assert bool(torch.isfinite(loss)) == feasible, (tokens, frames)


def test_ctc_loss_zeroes_and_counts_infeasible_utterances():
    torch.manual_seed(0)
    lp = torch.randn(2, 4, 6).log_softmax(-1)
    targets = torch.tensor([[1, 2, -1, -1, -1], [1, 2, 3, 4, 5]])  # second needs 5 frames, has 4
    loss, n_inf = ctc_loss(lp, torch.tensor([4, 4]), targets, torch.tensor([2, 5]))
    ref = F.ctc_loss(lp[:1].transpose(0, 1), targets[:1, :2], torch.tensor([4]), torch.tensor([2]), reduction="sum")
    assert int(n_inf) == 1
    torch.testing.assert_close(loss, ref / 2)


@pytest.mark.parametrize("tokens, frames, infeasible", [([1, 1, 2], 3, True), ([1, 1, 2], 4, False),
                                                         ([1, 2, 3], 2, True), ([3, 3, 3], 5, False),
                                                         ([1, 2, 3], 3, False), ([3, 3, 3], 4, True)])
def test_ctc_loss_counts_infeasibility_from_repeats_and_frames(tokens, frames, infeasible):
    """The count must agree with torch's own verdict (an infinite loss): catches a count that forgets the
    blank needed between equal neighbours, or reads padding as repeats."""
    lp = torch.randn(1, 6, 5, generator=torch.Generator().manual_seed(3)).log_softmax(-1)
    targets = torch.tensor([tokens + [-1, -1]])
    _, n_inf = ctc_loss(lp, torch.tensor([frames]), targets, torch.tensor([len(tokens)]))
    torch_inf = not torch.isfinite(F.ctc_loss(lp.transpose(0, 1), torch.tensor([tokens]), torch.tensor([frames]),
                                              torch.tensor([len(tokens)]), reduction="sum"))
    assert int(n_inf) == int(infeasible) == int(torch_inf)


def test_infeasible_utterance_sends_no_nan_gradient_into_the_batch():
    """An infinite loss masked only in value still back-propagates NaN into every parameter, and the trainer
    then skips the whole update: the feasible utterance's gradient must equal its gradient alone."""
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    targets = torch.tensor([[1, 2, -1, -1, -1], [1, 2, 3, 4, 5]])  # the second needs 5 frames, has 4
    loss, n_inf = ctc_loss(logits.log_softmax(-1), torch.tensor([4, 4]), targets, torch.tensor([2, 5]))
    loss.backward()
    assert int(n_inf) == 1 and torch.isfinite(logits.grad).all()
    alone = logits.detach()[:1].clone().requires_grad_(True)
    ref = F.ctc_loss(alone.log_softmax(-1).transpose(0, 1), targets[:1, :2], torch.tensor([4]), torch.tensor([2]),
                     reduction="sum") / 2
    ref.backward()
    torch.testing.assert_close(logits.grad[0], alone.grad[0], atol=1e-6, rtol=1e-5)
    assert logits.grad[1].abs().max() == 0.0  # the infeasible utterance contributes nothing


def test_infeasible_count_is_per_utterance_whatever_the_padding():
    """Repeats are counted per row (not over the batch) and only inside each row's length, whatever value
    pads it (here the last token repeated, which a count reading past the length would take as repeats)."""
    lp = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(4)).log_softmax(-1)
    targets = torch.tensor([[4, 5, 5, 5], [1, 1, 2, 2], [1, 2, 2, 0]])  # row 0: "4 5" padded with 5s
    _, n_inf = ctc_loss(lp, torch.tensor([2, 4, 3]), targets, torch.tensor([2, 4, 3]))
    # row 0 needs 2 frames (has 2), row 1 needs 6 (has 4), row 2 "1 2 2" needs 4 (has 3)
    assert int(n_inf) == 2


def test_ctc_loss_of_one_utterance_with_another_blank_id():
    """Catches a blank id that is not passed on, and a batch-size divisor that is not the batch size."""
    lp = torch.randn(1, 6, 5, generator=torch.Generator().manual_seed(5)).log_softmax(-1)
    targets = torch.tensor([[0, 1, 2]])
    loss, n_inf = ctc_loss(lp, torch.tensor([6]), targets, torch.tensor([3]), blank=4)
    ref = F.ctc_loss(lp.transpose(0, 1), targets, torch.tensor([6]), torch.tensor([3]), blank=4, reduction="sum")
    torch.testing.assert_close(loss, ref)
    assert int(n_inf) == 0


def test_iterated_combine_is_final_plus_weighted_sum():
    """Deja-vu's iterated loss: L_final + lambda * sum_k L_k (not a mean, not (1 - lambda) on the final)."""
    final, inter = torch.tensor(2.0), [torch.tensor(3.0), torch.tensor(5.0)]
    assert float(iterated_combine(final, inter, 0.3)) == pytest.approx(2.0 + 0.3 * 8.0)
    assert float(iterated_combine(final, [], 0.3)) == 2.0


def test_label_smoothing_with_two_tokens_and_one_target_per_token():
    """V = 2 puts all of the smoothing mass on the one other id; token normalisation divides by the one target."""
    logits = torch.tensor([[[0.3, -0.2]]])
    targets = torch.tensor([[1]])
    q = torch.tensor([0.1, 0.9])
    expected = float((q * (q.log() - logits[0, 0].log_softmax(-1))).sum())
    for normalize in ("batch", "token"):
        assert float(label_smoothing_loss(logits, targets, 0.1, normalize)) == pytest.approx(expected, abs=1e-6)


def test_token_accuracy_of_a_single_target():
    logits = torch.tensor([[[0.0, 2.0, 1.0], [0.0, 0.0, 0.0]]])
    assert float(token_accuracy(logits, torch.tensor([[1, -1]]))) == 1.0  # one valid target, predicted
