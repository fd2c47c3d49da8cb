"""One flat table from config ``model.name`` to a model builder."""
from __future__ import annotations

from typing import Callable, Dict, Optional

from torch import nn

from asrkit.audio.cmvn import CMVNStats
from asrkit.audio.frontend import Frontend
from asrkit.config import ConfigError, ExperimentConfig
from asrkit.models.ctc_attention import build_ctc_attention
from asrkit.models.ctc_transformer import build_ctc_transformer
from asrkit.models.lstm_attention import BLSTMAttention
from asrkit.models.lstm_ctc import BLSTMCTC
from asrkit.nets.lstm import BLSTMEncoder
from asrkit.nets.lstm_decoder import LSTMAttentionDecoder

Builder = Callable[[ExperimentConfig, int, Frontend], nn.Module]


def build_frontend_module(cfg: ExperimentConfig, cmvn_path: Optional[str]) -> Frontend:
    stats = CMVNStats.load(cmvn_path) if cmvn_path else None
    return Frontend(cfg.frontend, cfg.specaug, cfg.speed_perturb, stats)


def _blstm_encoder(cfg: ExperimentConfig, frontend: Frontend) -> BLSTMEncoder:
    e = cfg.model.lstm_encoder
    try:
        return BLSTMEncoder(frontend.output_dim, e.hidden_size, e.num_layers, e.dropout, e.input_layer,
                            e.pyramid_layers)
    except ValueError as exc:
        raise ConfigError(f"model.lstm_encoder: {exc}") from None


def _blstm_ctc(cfg: ExperimentConfig, vocab_size: int, frontend: Frontend) -> nn.Module:
    return BLSTMCTC(frontend, _blstm_encoder(cfg, frontend), vocab_size)


def _blstm_attention(cfg: ExperimentConfig, vocab_size: int, frontend: Frontend) -> nn.Module:
    encoder, d = _blstm_encoder(cfg, frontend), cfg.model.lstm_decoder
    try:
        decoder = LSTMAttentionDecoder(vocab_size, encoder.output_dim, d.embed_dim, d.hidden_size, d.num_layers,
                                       d.attention_dim, d.conv_channels, d.conv_kernel, d.dropout)
        return BLSTMAttention(frontend, encoder, decoder, vocab_size, cfg.model.ctc_weight, cfg.model.lsm_weight)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None


MODELS: Dict[str, Builder] = {
    "ctc_transformer": build_ctc_transformer,
    "ctc_attention": build_ctc_attention,
    "blstm_ctc": _blstm_ctc,
    "blstm_attention": _blstm_attention,
}


def build_model(cfg: ExperimentConfig, vocab_size: int, cmvn_path: Optional[str] = None) -> nn.Module:
    if cfg.model.name not in MODELS:
        raise ConfigError(f"model.name '{cfg.model.name}' is unknown (registered: {', '.join(sorted(MODELS))})")
    return MODELS[cfg.model.name](cfg, vocab_size, build_frontend_module(cfg, cmvn_path))
