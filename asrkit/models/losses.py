"""Loss terms shared by the models."""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor,
             target_lengths: torch.Tensor, blank: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """CTC loss summed over the batch and divided by the batch size.

    log_probs: (B, T, V) log-softmax outputs; targets: (B, L) padded with -1.
    An utterance with more labels than its frames can emit (one frame per label plus a blank between
    equal neighbours) has an infinite loss; it contributes 0 to the loss *and* to the gradient
    (``zero_infinity``: masking only the value would still send NaN gradients into the whole batch),
    and the count of such utterances is returned so the trainer can report them.
    Returns ``(loss, num_infinite)``.
    """
    per_utt = F.ctc_loss(log_probs.transpose(0, 1).float(), targets.clamp(min=0), lengths, target_lengths,
                         blank=blank, reduction="none", zero_infinity=True)
    infeasible = ~ctc_feasible(targets, target_lengths, lengths)
    return per_utt.sum() / max(log_probs.size(0), 1), infeasible.sum()


def ctc_feasible(targets: torch.Tensor, target_lengths: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B,) bool: can CTC emit each of ``targets`` (B, L), padded, in its ``lengths`` (B,) frames? It needs one
    frame per label plus a blank between equal neighbours (:func:`ctc_min_frames` on tensors)."""
    valid = torch.arange(targets.size(1), device=targets.device)[None] < target_lengths[:, None]  # (B, L)
    repeats = ((targets[:, 1:] == targets[:, :-1]) & valid[:, 1:]).sum(dim=1)  # (B,)
    return target_lengths + repeats <= lengths


def ctc_min_frames(tokens: Sequence[int]) -> int:
    """Fewest CTC frames that can emit ``tokens``: one per label plus a blank between equal neighbours."""
    return len(tokens) + sum(1 for a, b in zip(tokens, tokens[1:]) if a == b)


def interctc_combine(loss_ctc: torch.Tensor, inter_losses: Sequence[torch.Tensor], weight: float) -> torch.Tensor:
    """The CTC term with intermediate losses (ESPnet's InterCTC convention).

    ``(1 - weight) * loss_ctc + weight * mean(inter_losses)``; just ``loss_ctc`` without intermediate layers.
    """
    if not inter_losses:
        return loss_ctc
    return (1.0 - weight) * loss_ctc + weight * torch.stack(list(inter_losses)).mean()


def iterated_combine(loss_ctc: torch.Tensor, inter_losses: Sequence[torch.Tensor], weight: float) -> torch.Tensor:
    """The CTC term with the iterated loss of Tjandra et al. (Deja-vu): ``loss_ctc + weight * sum(inter_losses)``."""
    if not inter_losses:
        return loss_ctc
    return loss_ctc + weight * torch.stack(list(inter_losses)).sum()


def label_smoothing_loss(logits: torch.Tensor, targets: torch.Tensor, smoothing: float,
                         normalize: str = "batch") -> torch.Tensor:
    """KL(q || p) between smoothed targets q and the decoder's softmax p, summed over tokens.

    logits: (B, L, V); targets: (B, L) padded with -1 (ignored). q puts ``1 - smoothing`` on the target
    and ``smoothing / (V - 1)`` on every other id. KL = cross-entropy(q, p) - entropy(q), so it is 0 for
    a perfect prediction of q and equals plain cross-entropy when ``smoothing = 0``. ``normalize``:
    ``batch`` divides the sum by the batch size (ESPnet's default), ``token`` by the number of targets.
    """
    if normalize not in ("batch", "token"):
        raise ValueError(f"label smoothing normalize must be 'batch' or 'token', got '{normalize}'")
    vocab = logits.size(-1)
    valid = targets >= 0  # (B, L)
    logp = logits.float().log_softmax(dim=-1)  # (B, L, V)
    logp_target = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, L)
    confidence, other = 1.0 - smoothing, smoothing / max(vocab - 1, 1)
    # Cross-entropy against q without building the (B, L, V) target tensor.
    cross = -(confidence * logp_target + other * (logp.sum(dim=-1) - logp_target))
    neg_entropy = sum(w * n * math.log(w) for w, n in ((confidence, 1), (other, vocab - 1)) if w > 0)
    total = ((cross + neg_entropy) * valid).sum()
    denom = logits.size(0) if normalize == "batch" else valid.sum().clamp(min=1)
    return total / denom


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of non-padding targets (B, L) (padding -1) that are the argmax of logits (B, L, V)."""
    valid = targets >= 0
    correct = (logits.argmax(dim=-1) == targets) & valid
    return correct.sum().float() / valid.sum().clamp(min=1).float()
