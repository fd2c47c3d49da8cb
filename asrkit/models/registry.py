"""Parts by kind: ``model.encoder.kind`` and ``model.decoder.kind`` -> builders, composed into one AsrModel.

A new encoder or decoder is a module in nets/, its config section in asrkit.config, and one line here.
Config errors that the nets would report as bare ValueErrors are re-raised naming their keys.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from torch import nn

from asrkit.audio.cmvn import CMVNStats
from asrkit.audio.frontend import Frontend
from asrkit.config import (BLSTMEncoderConfig, ConfigError, ConformerEncoderConfig, ExperimentConfig, ModelConfig,
                           TransformerDecoderConfig, TransformerEncoderConfig, LSTMLocationDecoderConfig)
from asrkit.models.asr import AsrModel, CTCHead, Decoder, Encoder, MLPCTCHead
from asrkit.models.dynamic_chunk import DynamicChunk
from asrkit.nets.conformer import ConformerLayer
from asrkit.nets.decoder import TransformerDecoder
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder
from asrkit.nets.transformer import TransformerEncoder


def _transformer(e: TransformerEncoderConfig, in_dim: int, vocab_size: int, m: ModelConfig) -> Encoder:
    layer_builder = None
    if isinstance(e, ConformerEncoderConfig):
        if not e.normalize_before:
            raise ConfigError("model.encoder.normalize_before: the Conformer is pre-LN only")

        def layer_builder() -> nn.Module:
            return ConformerLayer(e.d_model, e.num_heads, e.ffn_dim, e.conv_kernel, e.dropout, e.attention_dropout,
                                  causal_conv=e.streaming.causal_conv)

    return TransformerEncoder(in_dim, e.d_model, e.num_heads, e.ffn_dim, e.num_layers, e.dropout,
                              e.attention_dropout, e.normalize_before, e.input_layer,
                              interctc_layers=e.interctc_layers, self_condition=e.self_condition,
                              vocab_size=vocab_size, dejavu_layer=e.dejavu_layer, dejavu_input=e.dejavu_input,
                              dejavu_dim=e.dejavu_dim, dejavu_pos_dim=e.dejavu_pos_dim,
                              dejavu_combine=e.dejavu_combine, conv_channels=e.conv_channels,
                              layer_builder=layer_builder, positional=layer_builder is None,
                              intermediate_norm=m.intermediate_loss == "interctc",
                              chunk_frames=e.streaming.chunk_frames, left_chunks=e.streaming.left_chunks,
                              dynamic_chunk=e.streaming.dynamic_chunk)


def _blstm(e: BLSTMEncoderConfig, in_dim: int, vocab_size: int, m: ModelConfig) -> Encoder:
    return BLSTMEncoder(in_dim, e.hidden_size, e.num_layers, e.dropout, e.input_layer, e.pyramid_layers)


def _transformer_decoder(d: TransformerDecoderConfig, memory_dim: int, vocab_size: int) -> Decoder:
    if memory_dim % d.num_heads:
        raise ConfigError(f"model.decoder.num_heads {d.num_heads} does not divide the encoder's output size "
                          f"{memory_dim}")
    return TransformerDecoder(vocab_size, memory_dim, d.num_heads, d.ffn_dim, d.num_layers, d.dropout,
                              d.attention_dropout, d.normalize_before, d.tie_embeddings)


def _lstm_location_decoder(d: LSTMLocationDecoderConfig, memory_dim: int, vocab_size: int) -> Decoder:
    return LSTMAttentionDecoder(vocab_size, memory_dim, d.embed_dim, d.hidden_size, d.num_layers, d.attention_dim,
                                d.conv_channels, d.conv_kernel, d.dropout, sharpening=d.sharpening,
                                smoothing=d.smoothing, window=d.window)


INTERMEDIATE_LOSSES = ("interctc", "iterated")
ENCODERS: Dict[str, Callable[..., Encoder]] = {
    "transformer": _transformer,
    "conformer": _transformer,  # the same stack with Conformer layers
    "blstm": _blstm,
}
DECODERS: Dict[str, Optional[Callable[..., Decoder]]] = {
    "transformer": _transformer_decoder,
    "lstm_location": _lstm_location_decoder,
    "none": None,
}


def check_model_config(m: ModelConfig) -> None:
    """What the parts cannot check alone: weights, and how the encoder, CTC head and decoder fit together."""
    for name, w in (("ctc_weight", m.ctc_weight), ("interctc_weight", m.interctc_weight),
                    ("lsm_weight", m.lsm_weight)):
        if not 0.0 <= w <= 1.0:
            raise ConfigError(f"model.{name} must be in [0, 1], got {w}")
    if m.lsm_normalize not in ("batch", "token"):
        raise ConfigError(f"model.lsm_normalize must be 'batch' or 'token', got '{m.lsm_normalize}'")
    if m.intermediate_loss not in INTERMEDIATE_LOSSES:
        raise ConfigError(f"model.intermediate_loss must be one of {', '.join(INTERMEDIATE_LOSSES)}, "
                          f"got '{m.intermediate_loss}'")
    no_decoder = m.decoder.kind == "none"
    if no_decoder and m.ctc_weight != 1.0:
        raise ConfigError(f"model.decoder.kind is none (a pure CTC model) but model.ctc_weight is {m.ctc_weight}: "
                          f"set it to 1.0")
    if not no_decoder and m.ctc_weight == 1.0:
        raise ConfigError(f"model.ctc_weight 1.0 trains no decoder: set model.decoder.kind: none "
                          f"(the {m.decoder.kind} decoder would stay untrained)")
    e = m.encoder
    if isinstance(e, TransformerEncoderConfig):
        for k in list(e.interctc_layers) + ([e.dejavu_layer] if e.dejavu_layer else []):
            key = "dejavu_layer" if k == e.dejavu_layer and k not in e.interctc_layers else "interctc_layers"
            if not 1 <= k < e.num_layers:
                raise ConfigError(f"model.encoder.{key}: layer {k} is outside 1..{e.num_layers - 1} "
                                  f"(encoder.num_layers is {e.num_layers})")
        if e.dejavu_layer < 0:
            raise ConfigError(f"model.encoder.dejavu_layer must be >= 0, got {e.dejavu_layer}")
        intermediate = bool(e.interctc_layers or e.dejavu_layer)
        if intermediate and m.ctc_weight == 0.0:
            raise ConfigError("model.encoder has intermediate CTC layers but model.ctc_weight is 0 (no CTC head)")
        if e.self_condition and not intermediate:
            raise ConfigError("model.encoder.self_condition needs model.encoder.interctc_layers (or dejavu_layer)")
        if e.streaming.causal_conv and not isinstance(e, ConformerEncoderConfig):
            raise ConfigError(f"model.encoder.streaming.causal_conv: the {e.kind} encoder has no convolution module "
                              f"(only kind conformer has one)")
        if e.self_condition and m.intermediate_loss != "interctc":
            raise ConfigError("model.encoder.self_condition feeds the shared CTC head's posteriors back: it needs "
                              "model.intermediate_loss: interctc")
    else:
        intermediate = False
    if m.interctc_weight > 0 and not intermediate:
        raise ConfigError("model.interctc_weight > 0 but no intermediate layer is set "
                          "(model.encoder.interctc_layers or model.encoder.dejavu_layer)")


def build_frontend_module(cfg: ExperimentConfig, cmvn_path: Optional[str]) -> Frontend:
    stats = CMVNStats.load(cmvn_path) if cmvn_path else None
    return Frontend(cfg.frontend, cfg.specaug, cfg.speed_perturb, stats, vtlp=cfg.augment.vtlp)


def build_model(cfg: ExperimentConfig, vocab_size: int, cmvn_path: Optional[str] = None) -> AsrModel:
    """The AsrModel that ``cfg.model`` describes: encoder, then decoder (if any), then CTC head (if any)."""
    m = cfg.model
    check_model_config(m)
    frontend = build_frontend_module(cfg, cmvn_path)
    try:  # parameter creation order is fixed (it decides the initial weights for a seed)
        encoder = ENCODERS[m.encoder.kind](m.encoder, frontend.output_dim, vocab_size, m)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"model.encoder: {exc}") from None
    build_decoder = DECODERS[m.decoder.kind]
    try:
        decoder = None if build_decoder is None else build_decoder(m.decoder, encoder.output_dim, vocab_size)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"model.decoder: {exc}") from None
    ctc = CTCHead(encoder.output_dim, vocab_size) if m.ctc_weight > 0 else None
    aux_heads = None
    if m.intermediate_loss == "iterated":
        aux_heads = [MLPCTCHead(encoder.output_dim, vocab_size) for _ in encoder.intermediate_layers]
    return AsrModel(frontend, encoder, vocab_size, ctc, decoder, ctc_weight=m.ctc_weight, lsm_weight=m.lsm_weight,
                    interctc_weight=m.interctc_weight, lsm_normalize=m.lsm_normalize, aux_heads=aux_heads,
                    dynamic_chunk=_dynamic_chunk(m.encoder))


def _dynamic_chunk(e: object) -> Optional[DynamicChunk]:
    """The chunk draw of a ``streaming.dynamic_chunk`` encoder; None for every other."""
    if not isinstance(e, TransformerEncoderConfig) or not e.streaming.dynamic_chunk:
        return None
    s = e.streaming
    return DynamicChunk(s.full_context_prob, s.max_chunk_frames, s.left_chunks, s.dynamic_left_chunks)

