"""Typed configuration: one frozen dataclass per YAML section.

A YAML file maps onto :class:`ExperimentConfig`; every key must be a field of
its section, so a typo is an error that names the key and the file instead of
a silently ignored setting. ``--set section.key=value`` overrides are parsed
as YAML scalars and checked the same way.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid configuration; the message names the key (and file)."""


@dataclass(frozen=True)
class FrontendConfig:
    """Feature extraction. ``kind``: ``logmel`` (torch.stft) or ``kaldi_fbank`` (torchaudio.compliance.kaldi)."""
    kind: str = "logmel"
    sample_rate: int = 16000
    n_fft: int = 512
    win_length: int = 400  # samples (25 ms at 16 kHz)
    hop_length: int = 160  # samples (10 ms at 16 kHz)
    window: str = "hann"  # hann | hamming | povey (kaldi_fbank only: povey, hamming, hanning, ...)
    n_mels: int = 80
    fmin: float = 20.0
    fmax: Optional[float] = None  # None: sample_rate / 2
    log_floor: float = 1e-10
    dither: float = 0.0  # kaldi_fbank only; applied in training only


@dataclass(frozen=True)
class SpecAugmentConfig:
    enabled: bool = False
    num_freq_masks: int = 2
    freq_mask_width: int = 27  # max bins per mask
    num_time_masks: int = 2
    time_mask_width: int = 40  # max frames per mask
    time_mask_ratio: float = 0.05  # cap a time mask at this fraction of the utterance
    time_warp: int = 0  # max warp distance in frames; 0 disables


@dataclass(frozen=True)
class SpeedPerturbConfig:
    enabled: bool = False
    factors: Tuple[float, ...] = (0.9, 1.0, 1.1)


@dataclass(frozen=True)
class DataConfig:
    max_frames: int = 20000  # per batch, in 10 ms feature frames (sum over utterances incl. padding)
    max_batch_size: int = 64
    min_duration: float = 0.1  # seconds; shorter utterances are dropped with a report
    max_duration: float = 30.0
    num_workers: int = 0
    bucket_width: float = 0.5  # not used by every sampler; seconds


@dataclass(frozen=True)
class TokenizerConfig:
    kind: str = "char"  # char | sentencepiece
    path: str = "tokenizer.json"  # relative paths resolve against the experiment dir


@dataclass(frozen=True)
class EncoderConfig:
    """Transformer encoder (models ctc_transformer, ctc_attention)."""
    input_layer: str = "conv2d"  # conv2d (x4) | conv2d6 | conv2d8
    conv_channels: int = 0  # channels of the subsampling convolutions; 0 = d_model
    d_model: int = 256
    num_heads: int = 4
    ffn_dim: int = 1024
    num_layers: int = 12
    dropout: float = 0.1
    attention_dropout: float = 0.0
    normalize_before: bool = True  # pre-LN (default) or post-LN
    # Intermediate CTC: 1-based layer indices whose output gets an auxiliary CTC loss (InterCTC).
    interctc_layers: Tuple[int, ...] = ()
    self_condition: bool = False  # add projected intermediate CTC posteriors back into the residual stream
    # Deja-vu feature re-presentation after this 1-based layer (0 = off); aux CTC right before it.
    dejavu_layer: int = 0
    dejavu_input: str = "subsampled"  # subsampled (conv output) | stacked_fbank (raw frames stacked to the rate)
    dejavu_dim: int = 0  # d_c of the paper; 0 = d_model
    dejavu_pos_dim: int = 0  # d_e (concatenated sinusoid); 0 = d_model // 4
    # How the two halves of the Deja-vu layer's 2S outputs become S frames: a (feature-queried half),
    # b (activation-queried half), sum, or concat (on the feature axis, before the output projection).
    dejavu_combine: str = "concat"


@dataclass(frozen=True)
class DecoderConfig:
    """Transformer attention decoder (model ctc_attention)."""
    num_layers: int = 6
    num_heads: int = 4
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    normalize_before: bool = True
    tie_embeddings: bool = False  # share input embedding and output projection
    lsm_normalize: str = "batch"  # label-smoothed loss divided by the batch size (ESPnet) or by the token count


@dataclass(frozen=True)
class LSTMEncoderConfig:
    """Bidirectional LSTM encoder (models blstm_ctc, blstm_attention)."""
    input_layer: str = "conv2d"  # conv2d | conv2d6 | conv2d8 | none
    hidden_size: int = 320  # per direction
    num_layers: int = 4
    dropout: float = 0.2
    pyramid_layers: Tuple[int, ...] = ()  # 1-based layers after which frames are halved (pyramidal BLSTM)


@dataclass(frozen=True)
class LSTMDecoderConfig:
    """LSTM decoder with location-aware attention (model blstm_attention)."""
    embed_dim: int = 128
    hidden_size: int = 320
    num_layers: int = 1
    attention_dim: int = 320
    conv_channels: int = 10  # location filters F (Chorowski et al. 2015)
    conv_kernel: int = 31  # odd width of the convolution over the previous alignment
    dropout: float = 0.2


@dataclass(frozen=True)
class ModelConfig:
    name: str = "ctc_transformer"  # key in asrkit.models.registry
    ctc_weight: float = 0.3  # loss = ctc_weight * ctc + (1 - ctc_weight) * attention (+ intermediate terms)
    interctc_weight: float = 0.0  # weight of the intermediate CTC terms
    lsm_weight: float = 0.1  # decoder label smoothing
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    lstm_encoder: LSTMEncoderConfig = field(default_factory=LSTMEncoderConfig)
    lstm_decoder: LSTMDecoderConfig = field(default_factory=LSTMDecoderConfig)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    optimizer: str = "adamw"  # adam | adamw
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.0
    scheduler: str = "warmup_inverse_sqrt"  # warmup_inverse_sqrt (Noam shape) | warmup_cosine | constant
    warmup_steps: int = 1000
    grad_clip: float = 5.0
    accum_grad: int = 1
    amp: str = "none"  # none | bf16 | fp16 (fp16 on CUDA only)
    seed: int = 1
    log_interval: int = 10
    save_every_steps: int = 0  # 0 = only at epoch ends
    keep_best: int = 5  # best checkpoints kept by best_metric
    best_metric: str = "valid_loss"  # valid_loss | valid_acc
    max_nonfinite_steps: int = 20  # stop after this many non-finite steps in a row
    plot_attention: int = 0  # attention images of this many validation utterances per epoch


@dataclass(frozen=True)
class ExperimentConfig:
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    specaug: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    speed_perturb: SpeedPerturbConfig = field(default_factory=SpeedPerturbConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cmvn: Optional[str] = None  # global CMVN stats JSON (asrkit compute-cmvn); relative to the experiment dir


@dataclass(frozen=True)
class DecodeConfig:
    """How ``asrkit decode`` / ``asrkit transcribe`` search (``conf/decode_*.yaml``).

    ``mode``: ``greedy`` (best CTC path) | ``ctc_prefix`` (frame-synchronous CTC prefix beam search,
    optional LM fusion) | ``attention`` (label-synchronous beam search on the attention decoder,
    optional LM) | ``joint`` (the same with the CTC prefix score, weight ``ctc_weight``) |
    ``rescore`` (CTC prefix beam search N-best rescored by the attention decoder).
    """
    mode: str = "greedy"
    beam: int = 10
    nbest: int = 1  # hypotheses written per utterance (OUT/nbest when > 1)
    batch_size: int = 16  # utterances per search batch
    ctc_weight: float = 0.3  # joint: weight of the CTC prefix score; rescore: weight of the CTC score
    # LM shallow fusion: an ARPA file (.arpa or .arpa.gz) or a neural LM dir from 'asrkit train-lm'.
    lm: Optional[str] = None
    lm_units: str = "token"  # ARPA only: token (the LM's words are the tokenizer's tokens) | word
    lm_lookahead: bool = True  # word ARPA only: unigram look-ahead for partial words
    lm_unk_offset: float = 0.0  # word ARPA only: ln score added to out-of-vocabulary words (e.g. -10)
    lm_weight: float = 0.5  # alpha
    length_bonus: float = 0.0  # beta, per emitted token (per word with a word LM)
    # CTC prefix search pruning (all null: exact search)
    token_topk: Optional[int] = 8
    token_min_logp: Optional[float] = -12.0
    blank_skip_threshold: Optional[float] = 0.999
    # Label-synchronous search (attention, joint)
    pre_beam: int = 0  # candidates per hypothesis scored by partial scorers; 0 = 1.5 x beam
    max_len_ratio: float = 1.0  # max output tokens = ratio x encoder frames (at most)


@dataclass(frozen=True)
class LMModelConfig:
    """Neural LM (``asrkit train-lm``) over the tokenizer's ids. ``name``: ``lstm`` | ``transformer``."""
    name: str = "lstm"
    embed_dim: int = 256  # token embedding size; the Transformer's d_model
    hidden_size: int = 512  # lstm only: units per layer
    num_layers: int = 2
    num_heads: int = 4  # transformer only
    ffn_dim: int = 1024  # transformer only
    dropout: float = 0.1
    tie_embeddings: bool = False  # output projection shares the embedding matrix (lstm: hidden_size == embed_dim)


@dataclass(frozen=True)
class LMDataConfig:
    """Sentence batching for LM training; lengths count tokens plus one (<sos> or <eos>)."""
    max_tokens: int = 8000  # per batch: sentences x longest sentence (padding included)
    max_batch_size: int = 128
    max_len: int = 256  # longer training sentences are dropped (counted in the log); dev sentences are kept
    bucket_width: int = 4  # tokens: sentences shuffled within buckets of similar length


@dataclass(frozen=True)
class LMExperimentConfig:
    """An LM dir's ``config.yaml``. ``train`` is the ASR :class:`TrainConfig` (optimizer, schedule, clipping,
    seed, epochs, keep_best); ``train-lm`` refuses the keys it does not implement (see asrkit.train.lm_trainer)."""
    model: LMModelConfig = field(default_factory=LMModelConfig)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one YAML value against a field type; ``where`` names the key for errors."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for section, got {value!r}")
        return from_dict(tp, value, where)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], where)
    if origin in (tuple, Tuple, list, List, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin in (tuple, Tuple) else items
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def from_dict(cls: Type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys are an error naming the full key path."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(f"unknown config key '{path}' (valid keys here: {', '.join(sorted(names))})")
        kwargs[key] = _convert(value, hints[key], path)
    return cls(**kwargs)


def to_dict(cfg: Any) -> Dict[str, Any]:
    """Plain nested dict (tuples as lists) suitable for YAML."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)


def apply_overrides(data: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key.path=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}': '{p}' is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return data


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    seen: Dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key '{key}' "
                              f"(first on line {seen[key]})")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_as(cls: Type[T], path: str | os.PathLike, overrides: Sequence[str] = ()) -> T:
    """Load a YAML file (plus ``--set`` overrides) into the checked dataclass ``cls``."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_StrictLoader) or {}
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys")
    apply_overrides(data, overrides)
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Load an experiment YAML (plus ``--set`` overrides) into a checked :class:`ExperimentConfig`."""
    return load_yaml_as(ExperimentConfig, path, overrides)


def load_decode_config(path: Optional[str | os.PathLike] = None, overrides: Sequence[str] = ()) -> DecodeConfig:
    """A decoding YAML (``conf/decode_*.yaml``) plus overrides; defaults (greedy CTC) when ``path`` is None."""
    if path is None:
        return from_dict(DecodeConfig, apply_overrides({}, overrides))
    return load_yaml_as(DecodeConfig, path, overrides)


def load_lm_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> LMExperimentConfig:
    """Load a neural LM YAML (``conf/lm_*.yaml``, or an LM dir's config.yaml) plus ``--set`` overrides."""
    return load_yaml_as(LMExperimentConfig, path, overrides)

def save_config(cfg: Any, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(to_dict(cfg), fh, sort_keys=False)
