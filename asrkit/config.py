"""Typed configuration: one frozen dataclass per YAML section.

A YAML file maps onto :class:`ExperimentConfig`; every key must be a field of
its section, so a typo is an error that names the key and the file instead of
a silently ignored setting. ``--set section.key=value`` overrides are parsed
as YAML scalars and checked the same way.
"""
from __future__ import annotations

import dataclasses
import os
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

import yaml

from asrkit.atomic import atomic_write

T = TypeVar("T")

# Keys that format-1 configs had, with what replaced them (format 2: models composed of parts).
FORMAT_1_KEYS = {
    "model.name": "a model is now its parts: set model.encoder.kind (transformer | conformer | blstm) and "
                  "model.decoder.kind (transformer | lstm_location | none, the latter with model.ctc_weight: 1.0)",
    "model.lstm_encoder": "use model.encoder with kind: blstm",
    "model.lstm_decoder": "use model.decoder with kind: lstm_location",
    "model.decoder.lsm_normalize": "moved to model.lsm_normalize",
}


class ConfigError(ValueError):
    """An invalid configuration; the message names the key (and file)."""


# An error quotes a short excerpt of a value, never all of it: a value may be a long string or list from a file.
_EXCERPT = reprlib.Repr()
_EXCERPT.maxstring = _EXCERPT.maxother = 40
_EXCERPT.maxlist = _EXCERPT.maxtuple = _EXCERPT.maxdict = _EXCERPT.maxset = 4
_EXCERPT.maxlevel = 2
EXCERPT_CHARS = 80


def _quote(value: Any) -> str:
    """``repr(value)`` cut to at most :data:`EXCERPT_CHARS` characters (strings and containers shortened inside)."""
    return _cut(_EXCERPT.repr(value))


def _clip(text: str) -> str:
    """A string from a file for a one-line message, unquoted: escaped (no newline) and cut to :data:`EXCERPT_CHARS`."""
    return _cut(repr(text[:EXCERPT_CHARS + 1])[1:-1])  # one more than fits, so a longer text shows "..."


def _cut(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 3] + "..."


def _check_least(cfg: Any, section: str, least: Mapping[str, int]) -> None:
    """Refuse a count or interval of ``cfg`` below its least value (``least``: field -> value), naming the key:
    a 0 there is a division by zero or an empty loop far from the config that set it."""
    for key, low in least.items():
        value = getattr(cfg, key)
        if value < low:
            raise ConfigError(f"{section}.{key} must be at least {low}, got {value}")


# Each frontend kind's window and dither when a config leaves them unset: kaldi_fbank takes Kaldi compute-fbank's
# (povey window, --dither 1.0); logmel dithers never.
FRONTEND_KIND_DEFAULTS: Dict[str, Tuple[str, float]] = {"logmel": ("hann", 0.0), "kaldi_fbank": ("povey", 1.0)}


@dataclass(frozen=True)
class FrontendConfig:
    """Feature extraction. ``kind``: ``logmel`` (torch.stft) or ``kaldi_fbank`` (torchaudio.compliance.kaldi).

    ``window`` and ``dither`` left unset (None) take the kind's defaults (:data:`FRONTEND_KIND_DEFAULTS`) when the
    config is built, so a loaded config, and the config.yaml a run writes, states the values it uses.
    """
    kind: str = "logmel"  # logmel (torch.stft) | kaldi_fbank (torchaudio.compliance.kaldi)
    sample_rate: int = 16000  # Hz; audio at another rate is resampled when read
    n_fft: int = 512  # FFT size in samples
    win_length: int = 400  # samples (25 ms at 16 kHz)
    hop_length: int = 160  # samples (10 ms at 16 kHz)
    # None: the kind's (logmel: hann; kaldi_fbank: povey, Kaldi's). logmel: hann | hamming; kaldi_fbank: povey |
    # hamming | hann (hanning) | rectangular | blackman
    window: Optional[str] = None
    n_mels: int = 80  # mel filters: the feature dimension
    fmin: float = 20.0  # Hz, the lowest mel filter's lower edge
    fmax: Optional[float] = None  # None: sample_rate / 2
    log_floor: float = 1e-10  # features are log(max(mel energy, log_floor))
    # kaldi_fbank only: Gaussian noise of this standard deviation in int16 units (Kaldi's --dither), added in
    # training only, so decoding, validation and CMVN stats are deterministic. None: the kind's (kaldi_fbank: 1.0)
    dither: Optional[float] = None
    # subtract each utterance's mean feature vector (asrkit.audio.utterance_cmn): removes gain and
    # channel/spectral-tilt offsets, so voices and recordings unlike the training ones read better. true: the
    # whole utterance's mean, before global CMVN (cannot stream); causal: a running mean over the frames so
    # far, after global CMVN, started from its mean (0) with utterance_cmn_prior_frames of weight (streams)
    utterance_cmn: Union[bool, str] = False
    utterance_cmn_prior_frames: float = 100.0  # causal only: the prior's weight in frames (1 s); 0 = none

    def __post_init__(self) -> None:
        if self.kind not in FRONTEND_KIND_DEFAULTS:
            raise ConfigError(f"frontend.kind {_quote(self.kind)} is unknown "
                              f"(choose from: {', '.join(FRONTEND_KIND_DEFAULTS)})")
        window, dither = FRONTEND_KIND_DEFAULTS[self.kind]
        # A frozen dataclass: the unset fields are filled in here, once, as the config is built.
        if self.window is None:
            object.__setattr__(self, "window", window)
        if self.dither is None:
            object.__setattr__(self, "dither", dither)
        if not (isinstance(self.utterance_cmn, bool) or self.utterance_cmn == "causal"):
            raise ConfigError(f"frontend.utterance_cmn must be true, false or causal, "
                              f"got {_quote(self.utterance_cmn)}")
        if self.utterance_cmn_prior_frames < 0:
            raise ConfigError(f"frontend.utterance_cmn_prior_frames must be >= 0, "
                              f"got {self.utterance_cmn_prior_frames}")


@dataclass(frozen=True)
class SpecAugmentConfig:
    enabled: bool = False  # training only; evaluation never masks
    num_freq_masks: int = 2  # masks over mel bins, per utterance
    freq_mask_width: int = 27  # max bins per mask
    num_time_masks: int = 2  # masks over frames, per utterance
    time_mask_width: int = 40  # max frames per mask
    time_mask_ratio: float = 0.05  # cap a time mask at this fraction of the utterance
    time_warp: int = 0  # max warp distance in frames; 0 disables


@dataclass(frozen=True)
class SpeedPerturbConfig:
    enabled: bool = False  # training only: each utterance resampled by a factor drawn from factors
    factors: Tuple[float, ...] = (0.9, 1.0, 1.1)  # speed factors, drawn with equal probability


def _check_prob(cfg: Any, section: str) -> None:
    if not 0.0 <= cfg.prob <= 1.0:
        raise ConfigError(f"{section}.prob must be in [0, 1], got {cfg.prob}")


def _check_range(cfg: Any, section: str, key: str, low: float = -float("inf"), high: float = float("inf")) -> None:
    """A ``[low, high]`` pair of ``cfg`` (a range values are drawn from, uniformly): two numbers, the first not above
    the second, both inside ``[low, high]``."""
    value = getattr(cfg, key)
    if len(value) != 2 or value[0] > value[1]:
        raise ConfigError(f"{section}.{key} must be a range [low, high] with low <= high, got {list(value)}")
    if value[0] < low or value[1] > high:
        raise ConfigError(f"{section}.{key} must lie within [{low:g}, {high:g}], got {list(value)}")


@dataclass(frozen=True)
class ReverbConfig:
    """Reverberation by a room impulse response (asrkit.audio.reverb): read from ``rir_list`` (Kaldi's rir_list
    lines ``--rir-id X --room-id Y path``, or one audio path a line), else simulated by pyroomacoustics'
    image-source method in shoebox rooms drawn from the ranges below (uniformly), ``num_rooms`` of them per run."""
    prob: float = 0.0  # probability that an utterance is reverberated
    rir_list: Optional[str] = None  # a list of impulse responses; relative to the working directory of asrkit train
    num_rooms: int = 200  # simulated impulse responses in the bank (drawn once per run from train.seed)
    room_length: Tuple[float, float] = (3.0, 10.0)  # metres
    room_width: Tuple[float, float] = (3.0, 10.0)  # metres
    room_height: Tuple[float, float] = (2.5, 4.0)  # metres
    absorption: Tuple[float, float] = (0.2, 0.8)  # energy absorption coefficient of every wall
    distance: Tuple[float, float] = (0.5, 3.0)  # source to microphone, metres
    max_order: int = 12  # image-source reflection order

    def __post_init__(self) -> None:
        _check_prob(self, "augment.reverb")
        _check_least(self, "augment.reverb", {"num_rooms": 1, "max_order": 0})
        for key in ("room_length", "room_width", "room_height"):
            _check_range(self, "augment.reverb", key, low=1.0)
        _check_range(self, "augment.reverb", "absorption", low=0.01, high=1.0)
        _check_range(self, "augment.reverb", "distance", low=0.1)


GENERATED_NOISES = ("white", "pink", "brown", "babble")  # the kinds of noise augment.noise.generated may name


@dataclass(frozen=True)
class NoiseConfig:
    """Additive noise at an SNR drawn from ``snr`` (dB, uniformly; asrkit.audio.noise). Each utterance picks one
    source, uniformly: a directory of ``dirs`` (audio files under it, e.g. MUSAN's noise, music and speech), or a
    kind of ``generated`` noise: white, pink, brown, or babble (``babble_utts`` other training utterances mixed)."""
    prob: float = 0.0  # probability that an utterance gets noise
    snr: Tuple[float, float] = (5.0, 20.0)  # dB, speech power over noise power across the utterance
    dirs: Tuple[str, ...] = ()  # noise directories, searched recursively; relative to the working directory
    generated: Tuple[str, ...] = ("white", "pink", "brown", "babble")  # generated kinds among the sources
    babble_utts: Tuple[int, int] = (3, 6)  # babble: this many other training utterances, drawn uniformly

    def __post_init__(self) -> None:
        _check_prob(self, "augment.noise")
        _check_range(self, "augment.noise", "snr")
        _check_range(self, "augment.noise", "babble_utts", low=1)
        for kind in self.generated:
            if kind not in GENERATED_NOISES:
                raise ConfigError(f"augment.noise.generated: {_quote(kind)} is unknown "
                                  f"(choose from: {', '.join(GENERATED_NOISES)})")
        if self.prob > 0 and not self.dirs and not self.generated:
            raise ConfigError(f"augment.noise.prob is {self.prob} but there is no noise source: set "
                              "augment.noise.dirs or augment.noise.generated")


@dataclass(frozen=True)
class VtlpConfig:
    """Vocal tract length perturbation (Jaitly & Hinton 2013; asrkit.audio.vtlp): the frontend's mel filters are
    placed on frequencies warped by a factor alpha drawn uniformly from ``alpha``, per utterance or per speaker
    (utt2spk) and epoch; training only."""
    prob: float = 0.0  # probability that an utterance (or a speaker, with per_speaker) is warped
    alpha: Tuple[float, float] = (0.9, 1.1)  # warp factors
    per_speaker: bool = False  # one draw per speaker and epoch (utt2spk) instead of per utterance
    boundary_hz: float = 4800.0  # F_hi of the piecewise-linear warp: frequencies above it bend back to Nyquist

    def __post_init__(self) -> None:
        _check_prob(self, "augment.vtlp")
        _check_range(self, "augment.vtlp", "alpha", low=0.5, high=2.0)
        if self.boundary_hz <= 0:
            raise ConfigError(f"augment.vtlp.boundary_hz must be positive, got {self.boundary_hz}")


@dataclass(frozen=True)
class BandConfig:
    """Telephone band (asrkit.audio.band): resampled down to ``rate`` and back up, then high-passed at ``low_hz``."""
    prob: float = 0.0  # probability that an utterance is band-limited
    rate: int = 8000  # Hz; the band ends at rate / 2
    low_hz: float = 300.0  # Hz, high-pass cut-off (biquad); 0: none

    def __post_init__(self) -> None:
        _check_prob(self, "augment.band")
        _check_least(self, "augment.band", {"rate": 1})
        if self.low_hz < 0:
            raise ConfigError(f"augment.band.low_hz must be >= 0, got {self.low_hz}")


@dataclass(frozen=True)
class GainConfig:
    """A gain drawn from ``db`` (uniformly); samples are then clipped to [-1, 1] as a recording would be."""
    prob: float = 0.0  # probability that an utterance's level is changed
    db: Tuple[float, float] = (-6.0, 6.0)  # dB

    def __post_init__(self) -> None:
        _check_prob(self, "augment.gain")
        _check_range(self, "augment.gain", "db")


@dataclass(frozen=True)
class AugmentConfig:
    """Waveform augmentation in the training loader's workers (asrkit.audio.waveaug), each kind with its probability,
    in this order: reverberation, noise, band, gain; VTLP's warp is applied by the frontend. Draws depend on
    train.seed, the epoch and the utterance id only, so a resumed run draws the same."""
    reverb: ReverbConfig = field(default_factory=ReverbConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    vtlp: VtlpConfig = field(default_factory=VtlpConfig)
    band: BandConfig = field(default_factory=BandConfig)
    gain: GainConfig = field(default_factory=GainConfig)


@dataclass(frozen=True)
class DataConfig:
    max_frames: int = 20000  # per batch, in 10 ms feature frames (sum over utterances incl. padding)
    max_batch_size: int = 64  # utterances per batch, at most
    min_duration: float = 0.1  # seconds; shorter utterances are dropped with a report
    max_duration: float = 30.0  # seconds; longer utterances are dropped with a report
    num_workers: int = 0  # DataLoader worker processes (0: the main process)
    bucket_width: float = 0.5  # not used by every sampler; seconds
    # SortaGrad: the first N training epochs take their batches shortest first (asrkit.data.sampler); 0 = off.
    # Kaldi data dirs only (a tar-shard stream has no global order).
    sortagrad_epochs: int = 0
    shard_buffer: int = 2000  # utterances in the bucketing buffer when training from tar shards (--train-shards)

    def __post_init__(self) -> None:
        _check_least(self, "data", {"max_frames": 1, "max_batch_size": 1, "num_workers": 0, "sortagrad_epochs": 0,
                                    "shard_buffer": 1})


@dataclass(frozen=True)
class TokenizerConfig:
    kind: str = "char"  # char | sentencepiece
    path: str = "tokenizer.json"  # relative paths resolve against the experiment dir


@dataclass(frozen=True)
class EncoderStreamingConfig:
    """Chunk-wise self-attention, so that one model serves live streams and whole recordings
    (``model.encoder.streaming``; WeNet U2's dynamic chunk training). Chunks count encoder frames (40 ms at x4).

    ``dynamic_chunk``: each training batch draws its chunk: full context with probability ``full_context_prob``,
    else uniform in 1..``max_chunk_frames`` (U2: 0.5 and 25); the left context is ``left_chunks`` chunks, or drawn
    uniform in 0..(frames - 1) // chunk with ``dynamic_left_chunks`` (U2's use_dynamic_left_chunk). Such a model
    encodes whole recordings with full context. Without it, ``chunk_frames`` > 0 trains and encodes with that fixed
    chunk (0: full context, no chunks). ``chunk_frames`` and ``left_chunks`` are also a stream's defaults.
    """
    dynamic_chunk: bool = False  # draw the chunk per training batch (above)
    chunk_frames: int = 0  # encoder frames per chunk: the fixed chunk without dynamic_chunk; a stream's default
    left_chunks: int = -1  # chunks of left context each chunk attends to; -1 = all (a stream's cache then grows)
    causal_conv: bool = False  # conformer: left-padded depthwise convolution (no look-ahead); needed to stream
    full_context_prob: float = 0.5  # dynamic_chunk: probability that a batch trains with full context
    max_chunk_frames: int = 25  # dynamic_chunk: chunks drawn uniform in 1..max_chunk_frames
    dynamic_left_chunks: bool = False  # dynamic_chunk: draw the left context per batch too

    def __post_init__(self) -> None:
        _check_least(self, "model.encoder.streaming", {"chunk_frames": 0, "left_chunks": -1, "max_chunk_frames": 1})
        if not 0.0 <= self.full_context_prob <= 1.0:
            raise ConfigError(f"model.encoder.streaming.full_context_prob must be in [0, 1], "
                              f"got {self.full_context_prob}")

    @property
    def chunked(self) -> bool:
        """Whether the encoder is ever trained or run with a chunk mask."""
        return self.dynamic_chunk or self.chunk_frames > 0


@dataclass(frozen=True)
class TransformerEncoderConfig:
    """Conv2d subsampling + Transformer encoder (``model.encoder.kind: transformer``)."""
    kind: str = "transformer"  # transformer | conformer | blstm: each kind has its own keys
    input_layer: str = "conv2d"  # conv2d (x4) | conv2d6 | conv2d8
    conv_channels: int = 0  # channels of the subsampling convolutions; 0 = d_model
    d_model: int = 256  # width of the layers
    num_heads: int = 4  # attention heads
    ffn_dim: int = 1024  # hidden units of the feed-forward blocks
    num_layers: int = 12  # encoder layers
    dropout: float = 0.1  # dropout on the layers' outputs (residual branches)
    attention_dropout: float = 0.0  # dropout on the attention weights
    normalize_before: bool = True  # pre-LN (default) or post-LN
    # Intermediate CTC: 1-based layer indices whose output gets an auxiliary CTC loss (InterCTC).
    interctc_layers: Tuple[int, ...] = ()
    self_condition: bool = False  # add projected intermediate CTC posteriors back into the residual stream
    # Deja-vu feature re-presentation after this 1-based layer (0 = off); aux CTC right before it.
    dejavu_layer: int = 0
    # Z0: stacked_fbank (the input features, frames stacked to the encoder rate: the paper's) | subsampled
    dejavu_input: str = "stacked_fbank"
    dejavu_dim: int = 0  # d_c of the paper; 0 = d_model
    dejavu_pos_dim: int = 0  # d_e (concatenated sinusoid); 0 = d_model // 4
    # Which of the Deja-vu layer's 2S outputs become Z_{k+1}: the paper's split a (queries Z0') or split b
    # (queries Zk'); extensions: sum of both, concat of both on the feature axis (before W3).
    dejavu_combine: str = "a"
    streaming: EncoderStreamingConfig = field(default_factory=EncoderStreamingConfig)  # chunk-wise attention


@dataclass(frozen=True)
class ConformerEncoderConfig(TransformerEncoderConfig):
    """Conv2d subsampling + Conformer encoder (``kind: conformer``): the Transformer encoder's keys (pre-LN
    only) plus the convolution module's kernel; positions are rotary, inside the attention."""
    kind: str = "conformer"  # transformer | conformer | blstm: each kind has its own keys
    conv_kernel: int = 15  # depthwise convolution width in encoder frames (15 x 40 ms = 0.6 s)


@dataclass(frozen=True)
class BLSTMEncoderConfig:
    """Bidirectional LSTM encoder (``kind: blstm``)."""
    kind: str = "blstm"  # transformer | conformer | blstm: each kind has its own keys
    input_layer: str = "conv2d"  # conv2d | conv2d6 | conv2d8 | none
    hidden_size: int = 320  # per direction
    num_layers: int = 4  # BLSTM layers
    dropout: float = 0.2  # dropout between layers
    pyramid_layers: Tuple[int, ...] = ()  # 1-based layers after which frames are halved (pyramidal BLSTM)


@dataclass(frozen=True)
class TransformerDecoderConfig:
    """Transformer attention decoder (``model.decoder.kind: transformer``)."""
    kind: str = "transformer"  # transformer | lstm_location | none: each kind has its own keys
    num_layers: int = 6  # decoder layers
    num_heads: int = 4  # attention heads
    ffn_dim: int = 2048  # hidden units of the feed-forward blocks
    dropout: float = 0.1  # dropout on the layers' outputs (residual branches)
    attention_dropout: float = 0.0  # dropout on the attention weights
    normalize_before: bool = True  # pre-LN (default) or post-LN
    tie_embeddings: bool = False  # share input embedding and output projection


@dataclass(frozen=True)
class LSTMLocationDecoderConfig:
    """LSTM decoder with location-aware attention, Chorowski et al. 2015 (``kind: lstm_location``)."""
    kind: str = "lstm_location"  # transformer | lstm_location | none: each kind has its own keys
    embed_dim: int = 128  # token embedding size
    hidden_size: int = 320  # LSTM units per layer
    num_layers: int = 1  # LSTM layers
    attention_dim: int = 320  # hidden size of the attention's scoring MLP
    conv_channels: int = 10  # location filters F (Chorowski et al. 2015)
    conv_kernel: int = 31  # odd width of the convolution over the previous alignment
    dropout: float = 0.2  # dropout on the LSTM outputs
    # Chorowski et al. sec. 2.3 (asrkit/nets/attention.py): alignment sharpening beta (1 = plain softmax),
    # sigmoid smoothing instead of softmax, and a window of +-window frames around the previous alignment's
    # median (0 = off; decoding can set one with decode.attention_window)
    sharpening: float = 1.0
    smoothing: bool = False  # sigmoid smoothing of the alignment instead of softmax
    window: int = 0  # attend within +-window frames of the previous alignment's median; 0 = off


@dataclass(frozen=True)
class NoDecoderConfig:
    """No attention decoder (``kind: none``): a pure CTC model, ``model.ctc_weight: 1.0``."""
    kind: str = "none"  # transformer | lstm_location | none: each kind has its own keys


EncoderConfig = Union[TransformerEncoderConfig, ConformerEncoderConfig, BLSTMEncoderConfig]
DecoderConfig = Union[TransformerDecoderConfig, LSTMLocationDecoderConfig, NoDecoderConfig]


@dataclass(frozen=True)
class ModelConfig:
    """One AsrModel of parts: ``encoder.kind`` and ``decoder.kind`` pick them (asrkit.models.registry).

    ``ctc_weight`` 1 builds no decoder (``decoder.kind: none``), 0 builds no CTC head; the loss is
    ``ctc_weight * ctc_term + (1 - ctc_weight) * attention``.
    """
    ctc_weight: float = 0.3  # CTC's share of the loss: 1 = pure CTC (no decoder), 0 = no CTC head
    interctc_weight: float = 0.0  # weight of the intermediate CTC terms inside ctc_term
    # How the intermediate layers' CTC losses enter ctc_term. interctc (ESPnet's InterCTC): the shared CTC
    # head on the final-LayerNorm'd layer output, (1 - w) * final + w * mean(intermediate). iterated (Tjandra
    # et al., Deja-vu): an MLP + softmax head of its own per intermediate layer, final + w * sum(intermediate).
    intermediate_loss: str = "interctc"
    lsm_weight: float = 0.1  # decoder label smoothing: KL to (1 - lsm) on the target, lsm / (V - 1) elsewhere
    lsm_normalize: str = "batch"  # the attention loss divided by the batch size (ESPnet) or the token count
    encoder: EncoderConfig = field(default_factory=TransformerEncoderConfig)
    decoder: DecoderConfig = field(default_factory=TransformerDecoderConfig)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10  # passes over the training data
    optimizer: str = "adamw"  # adam | adamw
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.0  # on weight matrices (not biases or norms); decoupled with adamw
    scheduler: str = "warmup_inverse_sqrt"  # warmup_inverse_sqrt (Noam shape) | warmup_cosine | constant
    warmup_steps: int = 1000  # updates of linear warm-up to lr
    grad_clip: float = 5.0  # max gradient norm, clipped on every update
    accum_grad: int = 1  # batches whose gradients make one update
    amp: str = "none"  # none | bf16 | fp16 (fp16 on CUDA only)
    seed: int = 1  # seeds initialisation, batch order and augmentation
    log_interval: int = 10  # updates between log lines
    save_every_steps: int = 0  # 0 = only at epoch ends
    keep_best: int = 5  # best checkpoints kept by best_metric
    best_metric: str = "valid_loss"  # valid_loss | valid_acc
    max_nonfinite_steps: int = 20  # stop after this many non-finite steps in a row
    plot_attention: int = 0  # attention images of this many validation utterances per epoch
    # Start from these weights (a model.pt or checkpoint of the same model) instead of a random init; a run
    # that resumes ignores it. Relative paths are relative to the working directory of asrkit train.
    init_from: Optional[str] = None
    # Minimum word error rate fine-tuning (asrkit.train.mwer): loss = (1 - w) * model loss + w * expected word
    # errors over the model's own N-best (mwer_nbest hypotheses; joint search with mwer_ctc_weight when the
    # model has a decoder and a CTC head). 0 = off.
    mwer_weight: float = 0.0
    mwer_nbest: int = 4  # at least 2: the expected errors need alternatives
    mwer_ctc_weight: float = 0.3  # the CTC weight of the joint search that makes the MWER N-best

    def __post_init__(self) -> None:
        _check_least(self, "train", {"epochs": 1, "warmup_steps": 0, "accum_grad": 1, "log_interval": 1,
                                     "save_every_steps": 0, "keep_best": 0, "max_nonfinite_steps": 1,
                                     "plot_attention": 0, "mwer_nbest": 2})
        for key in ("mwer_weight", "mwer_ctc_weight"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"train.{key} must be in [0, 1], got {getattr(self, key)}")


@dataclass(frozen=True)
class ExperimentConfig:
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    specaug: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    speed_perturb: SpeedPerturbConfig = field(default_factory=SpeedPerturbConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # waveform augmentation (training loader)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cmvn: Optional[str] = None  # global CMVN stats JSON (asrkit compute-cmvn); relative to the experiment dir


ENDPOINT_VADS = ("none", "energy", "silero")  # what decode.endpoint.vad may name


@dataclass(frozen=True)
class EndpointConfig:
    """When a live stream's utterance ends (``decode.endpoint``; asrkit.pipeline.endpoint): rules on the trailing
    non-speech of the utterance, i.e. the trailing blank frames of the CTC best path (and, with ``vad``, the
    VAD's trailing non-speech: both must hear none). Each rule fires when its length is reached; 0 turns
    a rule off. The defaults are the usual ones (sherpa-onnx: 2.4 s / 1.2 s / 20 s; WeNet's runtime: 1.0 s)."""
    silence_no_speech: float = 2.4  # seconds of non-speech with no speech in the utterance yet
    trailing_silence: float = 1.0  # seconds of non-speech after speech (the usual end of a sentence)
    max_utterance: float = 20.0  # seconds: an utterance this long ends wherever it is
    # none | energy (asrkit.audio.vad.EnergyStream, per 10 ms) | silero (the learned VAD's speech probability per
    # 32 ms: pip install -e '.[vad]')
    vad: str = "none"
    vad_threshold: float = 0.5  # silero: a chunk whose speech probability is above this is speech

    def __post_init__(self) -> None:
        for key in ("silence_no_speech", "trailing_silence", "max_utterance"):
            if getattr(self, key) < 0:
                raise ConfigError(f"decode.endpoint.{key} must be >= 0, got {getattr(self, key)}")
        if self.vad not in ENDPOINT_VADS:
            raise ConfigError(f"decode.endpoint.vad {_quote(self.vad)} is unknown "
                              f"(choose from: {', '.join(ENDPOINT_VADS)})")
        if not 0.0 < self.vad_threshold < 1.0:
            raise ConfigError(f"decode.endpoint.vad_threshold must be in (0, 1), got {self.vad_threshold}")


@dataclass(frozen=True)
class VtlnConfig:
    """Vocal tract length normalisation at decode time (``decode.vtln``; asrkit.pipeline.vtln): each speaker of the
    data dir (utt2spk; without it each utterance) is decoded with the warp factor of ``alphas`` under which the
    model is most confident on the speaker's utterances (the highest mean per-frame best CTC log-posterior). The
    warp is VTLP's (asrkit.audio.vtlp) with the model's ``augment.vtlp.boundary_hz``. ``asrkit decode`` of a data
    dir only; empty: off."""
    alphas: Tuple[float, ...] = ()  # candidate warp factors (1: none); one factor warps every utterance by it

    def __post_init__(self) -> None:
        if any(not 0.5 <= a <= 2.0 for a in self.alphas):
            raise ConfigError(f"decode.vtln.alphas must lie within [0.5, 2], got {list(self.alphas)}")
        if len(set(self.alphas)) != len(self.alphas):
            raise ConfigError(f"decode.vtln.alphas lists a factor twice: {list(self.alphas)}")


@dataclass(frozen=True)
class DecodeConfig:
    """How ``asrkit decode`` / ``asrkit transcribe`` search (``conf/decode_*.yaml``).

    ``mode``: ``greedy`` (best CTC path) | ``ctc_prefix`` (frame-synchronous CTC prefix beam search,
    optional LM fusion) | ``attention`` (label-synchronous beam search on the attention decoder,
    optional LM) | ``joint`` (the same with the CTC prefix score, weight ``ctc_weight``) |
    ``rescore`` (CTC prefix beam search N-best rescored by the attention decoder).
    """
    mode: str = "greedy"  # greedy | ctc_prefix | attention | joint | rescore (above)
    beam: int = 10  # hypotheses kept per utterance
    nbest: int = 1  # hypotheses written per utterance (OUT/nbest when > 1)
    # utterances per batch of `asrkit decode`; null: 16, or on CUDA as many as fill gpu_memory_fraction of the free
    # memory, by seconds of audio (asrkit.pipeline.autobatch; `transcribe` without --batch-seconds likewise)
    batch_size: Optional[int] = None
    # null batch_size (or batch_seconds) on CUDA: the share of the free GPU memory a batch may take, by the peak
    # memory one utterance's decoding was measured at; the rest is margin for the allocator's fragmentation
    gpu_memory_fraction: float = 0.6
    ctc_weight: float = 0.3  # joint: weight of the CTC prefix score; rescore: weight of the CTC score
    # LM shallow fusion: an ARPA file (.arpa or .arpa.gz) or a neural LM dir from 'asrkit train-lm'.
    # Relative: to the working directory; a decode.yaml that asrkit writes holds it absolute (save_config).
    lm: Optional[str] = None
    # ARPA only: word (a word LM, asrkit train-ngram's default) | token (the LM's words are the tokenizer's tokens)
    lm_units: str = "word"
    lm_lookahead: bool = True  # word ARPA only: unigram look-ahead for partial words
    lm_unk_offset: float = -10.0  # word ARPA only: ln score added to OOV words (measured: docs/language-models.md)
    lm_word_boundary: Optional[str] = None  # word ARPA only: the mark word-initial tokens start with (None: ▁, | or space)
    # A word list (one word a line, or a lexicon's first field): only listed words are output (closed vocabularies)
    lexicon: Optional[str] = None
    # Hotwords (contextual biasing, beam searches): a file of phrases, one a line, optionally a tab and a weight factor
    hotwords: Optional[str] = None
    hotword_weight: float = 1.5  # bonus per token of a hotword (a line's factor multiplies it); 0 = off
    # word ARPA only: a hotword word outside the LM scores ln P = this after any history, which it leaves as it was;
    # null: <unk>'s ln P plus lm_unk_offset. Such words join decode.lexicon for the searches with the list.
    # -9: measured on the demo (tools/bench/bench_hotwords.py, docs/decoding.md); null's <unk> - 10 output 7.5% of names
    hotword_class_score: Optional[float] = -9.0
    lm_weight: float = 0.5  # alpha
    length_bonus: float = 0.0  # beta, per emitted token (per word with a word LM)
    # CTC prefix search pruning (all null: exact search)
    token_topk: Optional[int] = 8  # non-blank tokens a frame may extend a prefix with
    token_min_logp: Optional[float] = -12.0  # tokens below this log-probability in a frame extend no prefix
    blank_skip_threshold: Optional[float] = 0.999  # frames whose blank probability exceeds it count as pure blank
    # Label-synchronous search (attention, joint)
    pre_beam: int = 0  # candidates per hypothesis scored by partial scorers; 0 = 1.5 x beam
    max_len_ratio: float = 1.0  # max output tokens = ratio x encoder frames (at most)
    # GNMT length penalty (Wu et al. 2016): finished hypotheses ranked by score / ((5 + |Y|) / 6) ** alpha;
    # 0 = off (the additive length_bonus is the other, independent way to counter short outputs)
    length_penalty: float = 0.0
    lm_full: bool = False  # the LM scores every token and joins the pre-beam selection (as ESPnet's LM does)
    # Live streams: when an utterance ends (asrkit.pipeline.endpoint)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    # lstm_location decoders only: attend within +-N frames of the previous alignment's median (long
    # utterances); 0 = the model's own setting (model.decoder.window)
    attention_window: int = 0
    # Streaming (transcribe/decode --streaming, load_model(...).stream()): milliseconds of audio per encoder chunk, a
    # multiple of the encoder frame (feature hop x subsampling: 40 ms for the demo models); null: the model's
    # model.encoder.streaming.chunk_frames, or 640 ms where that is 0
    chunk_ms: Optional[int] = None
    left_chunks: Optional[int] = None  # chunks of left context a stream keeps; null: the model's; -1: all
    vtln: VtlnConfig = field(default_factory=VtlnConfig)  # decode-time warp per speaker (asrkit decode only)


@dataclass(frozen=True)
class LMModelConfig:
    """Neural LM (``asrkit train-lm``) over the tokenizer's ids. ``name``: ``lstm`` | ``transformer``."""
    name: str = "lstm"  # lstm | transformer
    embed_dim: int = 256  # token embedding size; the Transformer's d_model
    hidden_size: int = 512  # lstm only: units per layer
    num_layers: int = 2  # LSTM or Transformer layers
    num_heads: int = 4  # transformer only
    ffn_dim: int = 1024  # transformer only
    dropout: float = 0.1  # dropout on the layers' outputs
    tie_embeddings: bool = False  # output projection shares the embedding matrix (lstm: hidden_size == embed_dim)


@dataclass(frozen=True)
class LMDataConfig:
    """Sentence batching for LM training; lengths count tokens plus one (<sos> or <eos>)."""
    max_tokens: int = 8000  # per batch: sentences x longest sentence (padding included)
    max_batch_size: int = 128  # sentences per batch, at most
    max_len: int = 256  # longer training sentences are dropped (counted in the log); dev sentences are kept
    bucket_width: int = 4  # tokens: sentences shuffled within buckets of similar length

    def __post_init__(self) -> None:
        _check_least(self, "data", {"max_tokens": 1, "max_batch_size": 1, "max_len": 1, "bucket_width": 1})


@dataclass(frozen=True)
class LMExperimentConfig:
    """An LM dir's ``config.yaml``. ``train`` is the ASR :class:`TrainConfig` (optimizer, schedule, clipping,
    seed, epochs, keep_best); ``train-lm`` refuses the keys it does not implement (see asrkit.train.lm_task)."""
    model: LMModelConfig = field(default_factory=LMModelConfig)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass(frozen=True)
class ServeConfig:
    """``asrkit serve`` (asrkit.serve): where it listens and the limits that keep one client from harming the others.
    The defaults suit one machine on loopback; serving beyond it, set ``token``."""
    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 serves every interface (then set a token)
    port: int = 8000
    # Every endpoint then needs "Authorization: Bearer <token>" (or ?token=, or the cookie GET / sets for the page)
    token: Optional[str] = field(default=None, repr=False)
    max_streams: int = 64  # live WebSocket streams at once; the next is refused (close 1013) until one ends
    max_message_bytes: int = 1 << 20  # one WebSocket message (1 MiB: 32 s of 16 kHz s16le); larger: close 1009
    max_stream_seconds: float = 3600.0  # a stream's longest audio, and longest wall time (close 1001)
    idle_timeout_s: float = 30.0  # a stream that sends nothing this long is closed (1001)
    max_upload_bytes: int = 64 << 20  # POST /v1/transcribe body; larger: HTTP 413
    # torch's intra-op threads in the server process: the loop's ops are small, and threads that wait on each other
    # lose to the other work of the machine (32 demo streams: 15x slower with 2 than with 1 on a loaded 2-core box)
    threads: int = 1

    def __post_init__(self) -> None:
        _check_least(self, "serve", {"port": 0, "max_streams": 1, "max_message_bytes": 1024, "max_upload_bytes": 1,
                                     "threads": 1})
        if self.port > 65535:
            raise ConfigError(f"serve.port must be at most 65535, got {self.port}")
        for key in ("max_stream_seconds", "idle_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"serve.{key} must be > 0, got {getattr(self, key)}")
        if self.token is not None and not self.token.strip():
            raise ConfigError("serve.token is empty: give a token, or none for no authentication")


# What a scalar field of each type takes, for the error of a Union field that none of its types takes.
_EXPECTED = {bool: "true/false", str: "a string", int: "an integer", float: "a number"}


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one YAML value against a field type; ``where`` names the key for errors."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for section, got {_quote(value)}")
        return from_dict(tp, value, where)
    if origin is typing.Union or origin is types.UnionType:  # Optional[X] / Union[X, Y] or X | Y
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1 and all(dataclasses.is_dataclass(a) for a in inner):
            return _convert_kind(value, inner, where)
        if len(inner) > 1:  # e.g. Union[bool, str]: the first type that takes the value
            for member in inner:
                try:
                    return _convert(value, member, where)
                except ConfigError:
                    pass
            raise ConfigError(f"{where}: expected {' or '.join(_EXPECTED[m] for m in inner)}, got {_quote(value)}")
        return _convert(value, inner[0], where)
    if origin in (tuple, Tuple, list, List, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_quote(value)}")
        item_tp = args[0] if args else Any
        items = [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin in (tuple, Tuple) else items
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {_quote(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {_quote(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_quote(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_quote(value)}")
        return value
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {_quote(value)}")
        return dict(value)
    return value


def _convert_kind(value: Any, choices: Sequence[Any], where: str) -> Any:
    """A section that is one of several dataclasses, chosen by its ``kind`` key (default: the first's)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping for section, got {_quote(value)}")
    kinds = {dataclasses.fields(c)[0].default: c for c in choices}  # each section's first field is kind
    kind = value.get("kind", next(iter(kinds)))
    if kind not in kinds:
        raise ConfigError(f"{where}.kind {_quote(kind)} is unknown (choose from: {', '.join(kinds)})")
    return from_dict(kinds[kind], value, where)


def from_dict(cls: Type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a mapping; unknown keys are an error naming the full key path."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            if path in FORMAT_1_KEYS:
                raise ConfigError(f"'{path}' is a key of config format 1 (asrkit before composed models, checkpoint "
                                  f"format 1): {FORMAT_1_KEYS[path]}")
            raise ConfigError(f"unknown config key {_quote(path)} (valid keys here: {', '.join(sorted(names))})")
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


def flatten_dict(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}`` (the ``--set`` key paths); lists stay values."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten_dict(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


_YAML_NULLS = ("", "~", "null", "Null", "NULL")


def _field_type(cls: Any, parts: Sequence[str]) -> Any:
    """The type of the field at key path ``parts`` of dataclass ``cls``; None if there is none (no ``cls``, or the
    kinds of a section of several kinds disagree on it)."""
    tp = cls
    for part in parts:
        sections = [a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)]
        found = {typing.get_type_hints(c).get(part) for c in sections}
        if len(found) != 1:
            return None
        tp = found.pop()
    return tp


def apply_overrides(data: Dict[str, Any], overrides: Sequence[str], cls: Optional[type] = None) -> Dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict, in place. The value is parsed as YAML, except for a
    string field of dataclass ``cls``: that takes the text as written (YAML would cut ``a #b`` at its comment,
    and read ``yes`` or ``1`` as other types); an optional string is unset by YAML's null (``null``, ``~`` or
    nothing), as in the YAML files."""
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
        tp = _field_type(cls, parts)
        if tp is str or set(typing.get_args(tp)) == {str, type(None)}:
            node[parts[-1]] = None if tp is not str and raw in _YAML_NULLS else raw
            continue
        try:
            node[parts[-1]] = yaml.load(raw, Loader=_StrictLoader)
        except (ConfigError, yaml.YAMLError) as exc:
            raise ConfigError(f"override '{item}': invalid value: {exc}") from None
    return data


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (PyYAML silently keeps the last one) and every alias
    (``*name``): nested aliases expand a file of a few KB to gigabytes (10 aliases a level, 7 levels: 10**7
    values), and asrkit's files have no use for them."""

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):  # refused as it is read, before anything is expanded
            event = self.peek_event()
            raise ConfigError(f"line {event.start_mark.line + 1}: a YAML alias (*{_clip(event.anchor)}) is "
                              f"not accepted: write the value out")
        return super().compose_node(parent, index)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    seen: Dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {_quote(key)} "
                              f"(first on line {seen[key]})")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# PyYAML follows YAML 1.1, where a float needs a dot: `lr: 1e-3` (and `--set train.lr=1e-3`) would be the string
# '1e-3' and be refused as not a number. YAML 1.2 reads exponent forms without a dot as floats, as users write them.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: the line and the problem, not PyYAML's excerpt of the file."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        return f"line {exc.problem_mark.line + 1}: {_clip(str(exc.problem))}"
    return _clip(str(exc))


def read_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file from a user: the one loader for every YAML asrkit reads (configs, decode configs, an
    experiment's config.yaml). Plain data only (safe), a duplicated key or an alias is an error, exponent floats
    read as YAML 1.2 reads them; every error is one :class:`ConfigError` line naming the file."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_StrictLoader)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML file (not UTF-8 text)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None


def load_yaml_as(cls: Type[T], path: str | os.PathLike, overrides: Sequence[str] = ()) -> T:
    """Load a YAML file (plus ``--set`` overrides) into the checked dataclass ``cls``."""
    path = os.fspath(path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys")
    apply_overrides(data, overrides, cls)
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
        return from_dict(DecodeConfig, apply_overrides({}, overrides, DecodeConfig))
    return load_yaml_as(DecodeConfig, path, overrides)


def load_lm_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> LMExperimentConfig:
    """Load a neural LM YAML (``conf/lm_*.yaml``, or an LM dir's config.yaml) plus ``--set`` overrides."""
    return load_yaml_as(LMExperimentConfig, path, overrides)

def save_config(cfg: Any, path: str | os.PathLike) -> None:
    """Write ``cfg`` as YAML. A DecodeConfig's ``lm`` is written absolute, so the file works from any
    directory (a relative path in a config is read relative to the working directory, as on the command line)."""
    if isinstance(cfg, DecodeConfig):
        cfg = dataclasses.replace(cfg, lm=None if cfg.lm is None else os.path.abspath(cfg.lm),
                                  lexicon=None if cfg.lexicon is None else os.path.abspath(cfg.lexicon),
                                  hotwords=None if cfg.hotwords is None else os.path.abspath(cfg.hotwords))
    with atomic_write(path) as fh:
        yaml.safe_dump(to_dict(cfg), fh, sort_keys=False)
