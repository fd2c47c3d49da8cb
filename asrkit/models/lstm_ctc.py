"""BiLSTM-CTC baseline: frontend -> (conv subsampling) -> stacked BLSTM -> linear CTC head."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import nn

from asrkit.models.losses import ctc_loss
from asrkit.nets.lstm import BLSTMEncoder


class BLSTMEncoderModel(nn.Module):
    """What both BiLSTM models share: frontend + BLSTM encoder, ``encode`` and ``output_lengths``."""

    def __init__(self, frontend: nn.Module, encoder: BLSTMEncoder, vocab_size: int):
        super().__init__()
        self.frontend = frontend
        self.encoder = encoder
        self.vocab_size = vocab_size
        self.subsampling_factor = encoder.subsampling_factor  # feature frames per encoder frame

    def output_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """(B,) waveform lengths in samples -> (B,) encoder frames (without speed perturbation)."""
        return self.encoder.output_lengths(self.frontend.num_frames(num_samples))

    def encode(self, wav: torch.Tensor, wav_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, S) waveforms -> (B, T, 2H) encodings, (B,) lengths."""
        feats, feat_lens = self.frontend(wav, wav_lens)
        return self.encoder(feats, feat_lens)


class BLSTMCTC(BLSTMEncoderModel):
    """Waveforms in, CTC loss out (blank = 0); see MODEL_INTERFACE.md."""

    def __init__(self, frontend: nn.Module, encoder: BLSTMEncoder, vocab_size: int):
        super().__init__(frontend, encoder, vocab_size)
        self.ctc_head = nn.Linear(encoder.output_dim, vocab_size)

    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T, 2H) -> (B, T, V) log-probabilities."""
        return self.ctc_head(enc).log_softmax(dim=-1)

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        enc, enc_lens = self.encode(batch["wav"], batch["wav_lens"])
        loss, num_inf = ctc_loss(self.ctc_log_probs(enc), enc_lens, batch["tokens"], batch["token_lens"])
        return {"loss": loss, "loss_ctc": loss.detach(), "num_infinite_ctc": num_inf}
