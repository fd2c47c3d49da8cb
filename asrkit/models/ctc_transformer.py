"""Transformer encoder + CTC head; the frontend runs inside the model, so a batch of waveforms goes in.

Loss terms (each CTC loss is summed over utterances and divided by the batch size, see ``ctc_loss``):

    loss_ctc       CTC on the final encoder output
    loss_interctc  mean of the CTC losses on the intermediate layers (InterCTC and/or the Deja-vu
                   auxiliary loss), all through the one shared CTC head
    loss           (1 - interctc_weight) * loss_ctc + interctc_weight * loss_interctc
                   (just loss_ctc when the encoder has no intermediate layers)

:class:`~asrkit.models.ctc_attention.CTCAttentionTransformer` adds a decoder on top of this class.

Utterances too short for their transcript give an infinite CTC loss; ``ctc_loss`` zeroes them and
``num_infinite_ctc`` counts them, but they should be filtered up front: :meth:`CTCTransformer.can_align`
(or :meth:`CTCTransformer.output_lengths` with :func:`~asrkit.models.losses.ctc_min_frames`) says whether
an utterance of a given number of samples can emit its token ids.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from asrkit.config import ConfigError, ExperimentConfig, ModelConfig
from asrkit.models.losses import ctc_loss, ctc_min_frames, interctc_combine
from asrkit.nets.transformer import TransformerEncoder


class CTCTransformer(nn.Module):
    """See the module docstring; ``forward(batch)`` returns ``loss``, ``loss_ctc``, ``num_infinite_ctc``
    and, with intermediate layers, ``loss_interctc``."""

    def __init__(self, frontend: nn.Module, encoder: TransformerEncoder, vocab_size: int,
                 interctc_weight: float = 0.0):
        super().__init__()
        self.frontend = frontend
        self.encoder = encoder
        self.ctc_head = nn.Linear(encoder.d_model, vocab_size)
        self.vocab_size = vocab_size
        self.subsampling_factor = encoder.subsampling.factor  # feature frames per encoder frame
        self.interctc_weight = interctc_weight

    def encode(self, wav: torch.Tensor, wav_lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, S) waveforms -> (B, T, D) encodings, (B,) lengths."""
        feats, feat_lens = self.frontend(wav, wav_lens)
        return self.encoder(feats, feat_lens, self.ctc_head)

    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, V) log-probabilities."""
        return self.ctc_head(enc).log_softmax(dim=-1)

    def output_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """(B,) waveform lengths in samples -> (B,) encoder frames (without speed perturbation)."""
        return self.encoder.output_lengths(self.frontend.num_frames(num_samples))

    def can_align(self, num_samples: int, tokens: Sequence[int]) -> bool:
        """Whether an utterance of ``num_samples`` samples has enough encoder frames for CTC to emit ``tokens``."""
        frames = int(self.output_lengths(torch.tensor([num_samples]))[0])
        return frames >= max(ctc_min_frames(list(tokens)), 1)

    def _encode_with_intermediates(self, batch: Dict[str, torch.Tensor]
                                   ) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
        feats, feat_lens = self.frontend(batch["wav"], batch["wav_lens"])
        return self.encoder.forward_intermediate(feats, feat_lens, self.ctc_head)

    def _ctc_terms(self, enc: torch.Tensor, enc_lens: torch.Tensor, intermediates: List[torch.Tensor],
                   batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """The CTC term of the loss (with intermediate layers folded in) and its named parts (detached)."""
        tokens, token_lens = batch["tokens"], batch["token_lens"]
        loss_ctc, num_inf = ctc_loss(self.ctc_log_probs(enc), enc_lens, tokens, token_lens)
        # Every layer has the same frame count, so the final layer's infinite count covers them all.
        inter = [ctc_loss(self.ctc_log_probs(h), enc_lens, tokens, token_lens)[0] for h in intermediates]
        terms = {"loss_ctc": loss_ctc.detach(), "num_infinite_ctc": num_inf}
        if inter:
            terms["loss_interctc"] = torch.stack(inter).mean().detach()
        return interctc_combine(loss_ctc, inter, self.interctc_weight), terms

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        enc, enc_lens, intermediates = self._encode_with_intermediates(batch)
        loss, terms = self._ctc_terms(enc, enc_lens, intermediates, batch)
        return {"loss": loss, **terms}


def check_model_config(m: ModelConfig) -> None:
    """Config errors that the nets would only report as bare ValueErrors, named by their keys."""
    e = m.encoder
    for name, w in (("ctc_weight", m.ctc_weight), ("interctc_weight", m.interctc_weight),
                    ("lsm_weight", m.lsm_weight)):
        if not 0.0 <= w <= 1.0:
            raise ConfigError(f"model.{name} must be in [0, 1], got {w}")
    for k in list(e.interctc_layers) + ([e.dejavu_layer] if e.dejavu_layer else []):
        key = "dejavu_layer" if k == e.dejavu_layer and k not in e.interctc_layers else "interctc_layers"
        if not 1 <= k < e.num_layers:
            raise ConfigError(f"model.encoder.{key}: layer {k} is outside 1..{e.num_layers - 1} "
                              f"(encoder.num_layers is {e.num_layers})")
    if e.dejavu_layer < 0:
        raise ConfigError(f"model.encoder.dejavu_layer must be >= 0, got {e.dejavu_layer}")
    if m.interctc_weight > 0 and not (e.interctc_layers or e.dejavu_layer):
        raise ConfigError("model.interctc_weight > 0 but no intermediate layer is set "
                          "(model.encoder.interctc_layers or model.encoder.dejavu_layer)")
    if e.self_condition and not (e.interctc_layers or e.dejavu_layer):
        raise ConfigError("model.encoder.self_condition needs model.encoder.interctc_layers (or dejavu_layer)")


def build_transformer_encoder(m: ModelConfig, in_dim: int, vocab_size: int) -> TransformerEncoder:
    check_model_config(m)
    e = m.encoder
    try:
        return TransformerEncoder(in_dim, e.d_model, e.num_heads, e.ffn_dim, e.num_layers, e.dropout,
                                  e.attention_dropout, e.normalize_before, e.input_layer,
                                  interctc_layers=e.interctc_layers, self_condition=e.self_condition,
                                  vocab_size=vocab_size, dejavu_layer=e.dejavu_layer, dejavu_input=e.dejavu_input,
                                  dejavu_dim=e.dejavu_dim, dejavu_pos_dim=e.dejavu_pos_dim,
                                  dejavu_combine=e.dejavu_combine, conv_channels=e.conv_channels)
    except ValueError as exc:
        raise ConfigError(f"model.encoder: {exc}") from None


def build_ctc_transformer(cfg: ExperimentConfig, vocab_size: int, frontend: nn.Module) -> CTCTransformer:
    """Registry builder for ``ctc_transformer`` (pure CTC: model.ctc_weight and model.decoder are unused)."""
    encoder = build_transformer_encoder(cfg.model, frontend.output_dim, vocab_size)
    return CTCTransformer(frontend, encoder, vocab_size, cfg.model.interctc_weight)
