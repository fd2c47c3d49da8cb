"""Joint CTC/attention Transformer (hybrid CTC/attention, Watanabe et al. 2017; Karita et al. 2019).

The CTC side is :class:`~asrkit.models.ctc_transformer.CTCTransformer` (with InterCTC, self-conditioning
and Deja-vu); this class adds a Transformer decoder over the encoder output. Loss terms:

    ctc_term  = (1 - interctc_weight) * loss_ctc + interctc_weight * loss_interctc
                (loss_ctc alone without intermediate layers; loss_interctc = mean over the layers)
    loss_att  = label-smoothed decoder loss: KL(q || p) summed over target tokens, divided by the
                batch size (decoder.lsm_normalize = batch, as ESPnet) or the token count (token);
                q = 1 - lsm_weight on the target, lsm_weight / (V - 1) on every other id
    loss      = ctc_weight * ctc_term + (1 - ctc_weight) * loss_att

``acc`` is the decoder's teacher-forced token accuracy over targets including <eos>. In eval mode the
output also holds ``attention`` (B, L+1, T): the last decoder layer's source attention averaged over
heads, for the trainer's plots. With
ctc_weight 1 the decoder is not run (no loss_att/acc); with ctc_weight 0 CTC is not run.
Decoder targets: input ``<sos> y1 .. yn``, output ``y1 .. yn <eos>`` (id 2 is both <sos> and <eos>).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import nn

from asrkit.config import ConfigError, ExperimentConfig
from asrkit.models.ctc_transformer import CTCTransformer, build_transformer_encoder
from asrkit.models.losses import label_smoothing_loss, token_accuracy
from asrkit.nets.decoder import DecoderState, TransformerDecoder
from asrkit.nets.transformer import TransformerEncoder

SOS_EOS_ID = 2


def decoder_io(tokens: torch.Tensor, token_lens: torch.Tensor, sos_eos: int = SOS_EOS_ID
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens (B, L) padded -1 -> ys_in (B, L+1) ``<sos> y`` padded with <eos> (a valid id; masked anyway),
    ys_out (B, L+1) ``y <eos>`` padded -1, ys_lens (B,) = token_lens + 1."""
    b = tokens.size(0)
    sos = tokens.new_full((b, 1), sos_eos)
    ys_in = torch.cat([sos, tokens.masked_fill(tokens < 0, sos_eos)], dim=1)
    ys_out = torch.cat([tokens, tokens.new_full((b, 1), -1)], dim=1)
    ys_out = ys_out.scatter(1, token_lens.unsqueeze(1), sos_eos)
    return ys_in, ys_out, token_lens + 1


class CTCAttentionTransformer(CTCTransformer):
    """Transformer encoder with a CTC head and an attention decoder; see the module docstring."""

    def __init__(self, frontend: nn.Module, encoder: TransformerEncoder, decoder: TransformerDecoder,
                 vocab_size: int, ctc_weight: float = 0.3, interctc_weight: float = 0.0,
                 lsm_weight: float = 0.1, lsm_normalize: str = "batch", sos_eos_id: int = SOS_EOS_ID):
        super().__init__(frontend, encoder, vocab_size, interctc_weight)
        if decoder.vocab_size != vocab_size:
            raise ValueError(f"decoder vocabulary {decoder.vocab_size} != model vocabulary {vocab_size}")
        self.decoder = decoder
        self.ctc_weight, self.lsm_weight, self.lsm_normalize = ctc_weight, lsm_weight, lsm_normalize
        self.sos_eos_id = sos_eos_id

    def decode_step(self, ys: torch.Tensor, memory: torch.Tensor, memory_lens: torch.Tensor,
                    state: Optional[DecoderState] = None) -> Tuple[torch.Tensor, DecoderState]:
        """(N, V) log P(next token | prefix ys (N, L), memory (N, T, D)); see TransformerDecoder.decode_step."""
        return self.decoder.decode_step(ys, memory, memory_lens, state)

    def score_tokens(self, enc: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor,
                     token_lens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced (B,) log P(y_1 .. y_L, <eos> | x) summed over the tokens, in one decoder pass.

        enc (B, T, D), enc_lens (B,): encoder output; tokens (B, L) padded with -1; token_lens (B,).
        Used by attention rescoring of an N-best list (rows = hypotheses, enc repeated per row).
        """
        ys_in, ys_out, ys_lens = decoder_io(tokens, token_lens, self.sos_eos_id)
        log_probs = self.decoder(ys_in, ys_lens, enc, enc_lens).float().log_softmax(-1)  # (B, L+1, V)
        picked = log_probs.gather(-1, ys_out.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, L+1)
        return picked.masked_fill(ys_out < 0, 0.0).sum(1)

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        enc, enc_lens, intermediates = self._encode_with_intermediates(batch)
        out: Dict[str, torch.Tensor] = {}
        loss = enc.new_zeros(())
        if self.ctc_weight > 0:
            ctc_term, terms = self._ctc_terms(enc, enc_lens, intermediates, batch)
            loss = loss + self.ctc_weight * ctc_term
            out.update(terms)
        if self.ctc_weight < 1:
            ys_in, ys_out, ys_lens = decoder_io(batch["tokens"], batch["token_lens"], self.sos_eos_id)
            logits = self.decoder(ys_in, ys_lens, enc, enc_lens)  # (B, L+1, V)
            loss_att = label_smoothing_loss(logits, ys_out, self.lsm_weight, self.lsm_normalize)
            loss = loss + (1.0 - self.ctc_weight) * loss_att
            out["loss_att"] = loss_att.detach()
            out["acc"] = token_accuracy(logits.detach(), ys_out)
            if not self.training:  # alignments for the trainer's attention plots: one more decoder pass
                weights = self.decoder.cross_attention_weights(ys_in, ys_lens, enc.detach(), enc_lens)
                out["attention"] = weights.mean(dim=1)  # (B, L+1, T), averaged over heads
        out["loss"] = loss
        return out


def build_ctc_attention(cfg: ExperimentConfig, vocab_size: int, frontend: nn.Module) -> CTCAttentionTransformer:
    """Registry builder for ``ctc_attention`` (model.encoder, model.decoder, weights from model.*)."""
    m = cfg.model
    encoder = build_transformer_encoder(m, frontend.output_dim, vocab_size)
    d = m.decoder
    if d.lsm_normalize not in ("batch", "token"):
        raise ConfigError(f"model.decoder.lsm_normalize must be 'batch' or 'token', got '{d.lsm_normalize}'")
    if m.encoder.d_model % d.num_heads:
        raise ConfigError(f"model.decoder.num_heads {d.num_heads} does not divide "
                          f"model.encoder.d_model {m.encoder.d_model}")
    decoder = TransformerDecoder(vocab_size, m.encoder.d_model, d.num_heads, d.ffn_dim, d.num_layers, d.dropout,
                                 d.attention_dropout, d.normalize_before, d.tie_embeddings)
    return CTCAttentionTransformer(frontend, encoder, decoder, vocab_size, m.ctc_weight, m.interctc_weight,
                                   m.lsm_weight, d.lsm_normalize)
