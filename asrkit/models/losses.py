"""Loss terms shared by the models."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def ctc_loss(log_probs: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor,
             target_lengths: torch.Tensor, blank: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """CTC loss summed over the batch and divided by the batch size.

    log_probs: (B, T, V) log-softmax outputs; targets: (B, L) padded with -1.
    Infeasible utterances (infinite loss: more labels than frames allow) are
    zeroed rather than poisoning the batch; their count is returned so the
    trainer can report them. Returns ``(loss, num_infinite)``.
    """
    per_utt = F.ctc_loss(log_probs.transpose(0, 1).float(), targets.clamp(min=0), lengths, target_lengths,
                         blank=blank, reduction="none", zero_infinity=False)
    infinite = ~torch.isfinite(per_utt)
    per_utt = per_utt.masked_fill(infinite, 0.0)
    return per_utt.sum() / max(log_probs.size(0), 1), infinite.sum()
