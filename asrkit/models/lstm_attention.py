"""Attention encoder-decoder baseline: BLSTM encoder, LSTM decoder with location-aware attention,
optional joint CTC (Kim et al. 2017 style multi-task loss).

``loss = ctc_weight * loss_ctc + (1 - ctc_weight) * loss_att``. ``loss_att`` is the label-smoothed
cross entropy of the teacher-forced decoder (PyTorch convention: target distribution
``(1 - lsm_weight) * onehot + lsm_weight / V``), summed over tokens and divided by the batch
size like :func:`ctc_loss`. The decoder reads ``<sos> y_1 .. y_L`` and predicts ``y_1 .. y_L <eos>``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from asrkit.models.losses import ctc_loss
from asrkit.models.lstm_ctc import BLSTMEncoderModel
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder, LSTMDecoderState

IGNORE_ID = -1  # token padding in batches


class BLSTMAttention(BLSTMEncoderModel):
    """Waveforms in, named loss terms out; see MODEL_INTERFACE.md. ``has_ctc`` tells whether
    :meth:`ctc_log_probs` exists (only with ``ctc_weight > 0``)."""

    def __init__(self, frontend: nn.Module, encoder: BLSTMEncoder, decoder: LSTMAttentionDecoder, vocab_size: int,
                 ctc_weight: float = 0.3, lsm_weight: float = 0.1, sos_eos_id: int = 2):
        super().__init__(frontend, encoder, vocab_size)
        if not 0.0 <= ctc_weight <= 1.0:
            raise ValueError(f"model.ctc_weight must be in [0, 1], got {ctc_weight}")
        if not 0.0 <= lsm_weight < 1.0:
            raise ValueError(f"model.lsm_weight must be in [0, 1), got {lsm_weight}")
        self.decoder = decoder
        self.ctc_weight, self.lsm_weight, self.sos_eos_id = ctc_weight, lsm_weight, sos_eos_id
        self.has_ctc = ctc_weight > 0
        self.ctc_head = nn.Linear(encoder.output_dim, vocab_size) if self.has_ctc else None

    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T, 2H) -> (B, T, V) log-probabilities of the auxiliary CTC head."""
        if self.ctc_head is None:
            raise RuntimeError("this blstm_attention model has no CTC head (model.ctc_weight = 0)")
        return self.ctc_head(enc).log_softmax(dim=-1)

    def decoder_io(self, tokens: torch.Tensor, token_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, L) padded with -1 -> decoder input (B, L+1) = <sos> y (padding = <eos>, never scored)
        and targets (B, L+1) = y <eos> padded with -1."""
        b = tokens.size(0)
        sos = tokens.new_full((b, 1), self.sos_eos_id)
        ys_in = torch.cat([sos, tokens.masked_fill(tokens == IGNORE_ID, self.sos_eos_id)], dim=1)
        ys_out = torch.cat([tokens, tokens.new_full((b, 1), IGNORE_ID)], dim=1)
        ys_out[torch.arange(b, device=tokens.device), token_lens] = self.sos_eos_id
        return ys_in, ys_out

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Optional[LSTMDecoderState] = None) -> Tuple[torch.Tensor, LSTMDecoderState]:
        """(N, V) log P(next token | prefix ys (N, L), memory (N, T, D)); see LSTMAttentionDecoder.decode_step."""
        return self.decoder.decode_step(ys, memory, memory_lens, state)

    def score_tokens(self, enc: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor,
                     token_lens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced (B,) log P(y_1 .. y_L, <eos> | x) summed over the tokens, in one decoder pass.

        enc (B, T, 2H), enc_lens (B,): encoder output; tokens (B, L) padded with -1; token_lens (B,).
        """
        ys_in, ys_out = self.decoder_io(tokens, token_lens)
        logits, _ = self.decoder(enc, enc_lens, ys_in)  # (B, L+1, V)
        log_probs = logits.float().log_softmax(-1)
        picked = log_probs.gather(-1, ys_out.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, L+1)
        return picked.masked_fill(ys_out == IGNORE_ID, 0.0).sum(1)

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Named terms (see module doc) plus ``attention`` (B, L+1, T): detached alignments for plotting."""
        enc, enc_lens = self.encode(batch["wav"], batch["wav_lens"])
        ys_in, ys_out = self.decoder_io(batch["tokens"], batch["token_lens"])
        logits, attention = self.decoder(enc, enc_lens, ys_in)  # (B, L+1, V), (B, L+1, T)
        b = enc.size(0)
        loss_att = F.cross_entropy(logits.flatten(0, 1).float(), ys_out.flatten(), ignore_index=IGNORE_ID,
                                   label_smoothing=self.lsm_weight, reduction="sum") / max(b, 1)
        valid = ys_out != IGNORE_ID
        acc = ((logits.argmax(-1) == ys_out) & valid).sum() / valid.sum().clamp(min=1)
        out = {"loss_att": loss_att.detach(), "acc": acc.detach(), "attention": attention.detach()}
        if self.has_ctc:
            loss_ctc, num_inf = ctc_loss(self.ctc_log_probs(enc), enc_lens, batch["tokens"], batch["token_lens"])
            out.update(loss_ctc=loss_ctc.detach(), num_infinite_ctc=num_inf)
            out["loss"] = self.ctc_weight * loss_ctc + (1.0 - self.ctc_weight) * loss_att
        else:
            out["loss"] = loss_att
        return out

    @torch.no_grad()
    def attention_weights(self, batch: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        """Teacher-forced alignments per utterance, trimmed to (L_b + 1, T_b) (rows: y_1 .. y_L, <eos>).

        Runs in the module's current mode: call ``model.eval()`` first for dropout-free plots.
        """
        enc, enc_lens = self.encode(batch["wav"], batch["wav_lens"])
        ys_in, _ = self.decoder_io(batch["tokens"], batch["token_lens"])
        _, attention = self.decoder(enc, enc_lens, ys_in)
        return [attention[i, : int(n) + 1, : int(t)].cpu()
                for i, (n, t) in enumerate(zip(batch["token_lens"], enc_lens))]
