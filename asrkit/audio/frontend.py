"""Feature extraction as batched ``nn.Module`` s that run on the model's device.

Two extractors share one interface, ``forward(wav (B, T), wav_lens (B,)) ->
(feats (B, F, D), feat_lens (B,))`` with ``D = .output_dim``:

* :class:`LogMel` -- power spectrum from ``torch.stft``, HTK-scale triangular
  mel filters without area normalisation (equal to
  ``librosa.filters.mel(htk=True, norm=None)``), natural log of
  ``max(mel_energy, log_floor)``.
* :class:`KaldiFbank` -- ``torchaudio.compliance.kaldi.fbank`` run once per
  utterance (that API is unbatched).

Waveforms are float in [-1, 1]. Both use Kaldi's ``snip_edges`` framing: frame
``i`` covers samples ``[i*hop, i*hop + win_length)`` and only frames that lie
completely inside the utterance exist, so an utterance of ``n`` samples gives
``max(0, (n - win_length) // hop + 1)`` frames (:meth:`num_frames`). A frame
therefore never reads a padding sample, which makes an utterance's features
independent of the padding that follows it in a batch. The batch output has
``num_frames(T)`` frames; frames at or past ``feat_lens[b]`` are exactly 0.

:class:`Frontend` composes speed perturbation, an extractor, SpecAugment and
global CMVN; the augmentations act only in training mode.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torchaudio.compliance.kaldi as kaldi
from torch import Tensor, nn

from asrkit.audio.augment import SpecAugment, SpeedPerturb
from asrkit.audio.cmvn import CMVNStats, GlobalCMVN
from asrkit.audio.utterance_cmn import CausalCMN, build_utterance_cmn
from asrkit.audio.vtlp import KALDI_VTLN_LOW, check_boundary, kaldi_vtln_options, warp_frequencies
from asrkit.config import ConfigError, FrontendConfig, SpecAugmentConfig, SpeedPerturbConfig, VtlpConfig

__all__ = ["LogMel", "KaldiFbank", "Frontend", "build_frontend", "mel_filterbank", "warped_mel_filterbank",
           "hz_to_mel", "mel_to_hz"]


def hz_to_mel(hz: Tensor) -> Tensor:
    """HTK mel scale: ``2595 * log10(1 + hz / 700)``."""
    return 2595.0 * torch.log10(1.0 + hz / 700.0)


def mel_to_hz(mel: Tensor) -> Tensor:
    """Inverse of :func:`hz_to_mel`."""
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> Tensor:
    """Triangular HTK-mel filters over the ``n_fft // 2 + 1`` rfft bins, shape (n_mels, n_fft // 2 + 1).

    Filter ``m`` rises linearly (in Hz) from mel edge ``m`` to ``m + 1`` and
    falls to edge ``m + 2``; the ``n_mels + 2`` edges are equally spaced in
    mel between ``fmin`` and ``fmax``. Peaks are 1 (no area normalisation).
    Computed in float64 and returned as float32.
    """
    return _triangles(_mel_edges(sample_rate, n_mels, fmin, fmax), sample_rate, n_fft).float()


def warped_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float, alpha: Tensor,
                          boundary_hz: float) -> Tensor:
    """:func:`mel_filterbank` with its edge frequencies warped by VTLP (:func:`~asrkit.audio.vtlp.warp_frequencies`),
    one filterbank per warp factor of ``alpha`` (B,): shape (B, n_mels, n_fft // 2 + 1), float32."""
    edges = _mel_edges(sample_rate, n_mels, fmin, fmax)  # (M+2,)
    warped = warp_frequencies(edges[None, :], alpha.double()[:, None], boundary_hz, sample_rate / 2)  # (B, M+2)
    return _triangles(warped, sample_rate, n_fft).float()


def _mel_edges(sample_rate: int, n_mels: int, fmin: float, fmax: float) -> Tensor:
    """The ``n_mels + 2`` filter edges (Hz, float64), equally spaced in mel between ``fmin`` and ``fmax``."""
    if not 0.0 <= fmin < fmax <= sample_rate / 2:
        raise ConfigError(f"frontend: need 0 <= fmin < fmax <= sample_rate/2, got fmin={fmin}, fmax={fmax}, "
                          f"sample_rate={sample_rate}")
    lo, hi = hz_to_mel(torch.tensor(fmin, dtype=torch.float64)), hz_to_mel(torch.tensor(fmax, dtype=torch.float64))
    return mel_to_hz(torch.linspace(float(lo), float(hi), n_mels + 2, dtype=torch.float64))


def _triangles(edges: Tensor, sample_rate: int, n_fft: int) -> Tensor:
    """Triangular filters on edges (..., M+2) in Hz over the rfft bins: (..., M, K), float64."""
    bin_hz = torch.linspace(0.0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)  # (K,)
    width = edges[..., 1:] - edges[..., :-1]  # (..., M+1)
    rise = (bin_hz - edges[..., :-2, None]) / width[..., :-1, None]  # (..., M, K)
    fall = (edges[..., 2:, None] - bin_hz) / width[..., 1:, None]  # (..., M, K)
    return torch.clamp(torch.minimum(rise, fall), min=0.0)


def _frame_count(n: Tensor, win_length: int, hop_length: int) -> Tensor:
    """Snip-edges frame count for sample counts ``n`` (any shape, integer)."""
    return torch.clamp(torch.div(n - win_length, hop_length, rounding_mode="floor") + 1, min=0)


def _zero_padding(feats: Tensor, feat_lens: Tensor) -> Tensor:
    """Set frames at or past each utterance's length to exactly 0. feats (B, F, D), feat_lens (B,)."""
    valid = torch.arange(feats.size(1), device=feats.device)[None, :] < feat_lens[:, None]  # (B, F)
    return feats.masked_fill(~valid[:, :, None], 0.0)


def _check_input(wav: Tensor, wav_lens: Tensor) -> None:
    if wav.dim() != 2:
        raise ValueError(f"frontend expects wav of shape (B, T), got {tuple(wav.shape)}")
    if wav_lens.shape != (wav.size(0),):
        raise ValueError(f"frontend expects wav_lens of shape ({wav.size(0)},), got {tuple(wav_lens.shape)}")


class _Framed(nn.Module):
    """Shared by the extractors: Kaldi "snip edges" framing from ``win_length`` and ``hop_length``."""

    win_length: int
    hop_length: int

    def num_frames(self, num_samples: Tensor) -> Tensor:
        """Number of feature frames for utterances of ``num_samples`` samples."""
        return _frame_count(num_samples, self.win_length, self.hop_length)


class LogMel(_Framed):
    """Batched log-mel filterbank from ``torch.stft`` (see module docstring for framing and scale)."""

    WINDOWS = {"hann": torch.hann_window, "hamming": torch.hamming_window}

    def __init__(self, cfg: FrontendConfig, vtlp: Optional[VtlpConfig] = None) -> None:
        super().__init__()
        if cfg.window not in self.WINDOWS:
            raise ConfigError(f"frontend.window '{cfg.window}' is not supported by kind 'logmel' "
                              f"(choose from: {', '.join(self.WINDOWS)})")
        if not 0 < cfg.win_length <= cfg.n_fft:
            raise ConfigError(f"frontend: need 0 < win_length <= n_fft, got win_length={cfg.win_length}, "
                              f"n_fft={cfg.n_fft}")
        if cfg.hop_length <= 0 or cfg.n_mels <= 0 or cfg.log_floor <= 0:
            raise ConfigError("frontend: hop_length, n_mels and log_floor must be positive")
        self.n_fft, self.win_length, self.hop_length = cfg.n_fft, cfg.win_length, cfg.hop_length
        self.log_floor = cfg.log_floor
        self.output_dim = cfg.n_mels
        fmax = cfg.sample_rate / 2 if cfg.fmax is None else cfg.fmax
        self.mel_args = (cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, fmax)  # for VTLP's warped filterbanks
        self.vtlp_boundary_hz = _vtlp_boundary(cfg, vtlp)
        # Derived from the config, so not persistent: checkpoints carry the config, not these tensors.
        self.register_buffer("window", self.WINDOWS[cfg.window](cfg.win_length, periodic=True), persistent=False)
        self.register_buffer("mel_fb", mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, fmax).T,
                             persistent=False)  # (K, M)

    def forward(self, wav: Tensor, wav_lens: Tensor, warp: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """wav (B, T) float, wav_lens (B,) -> feats (B, F, n_mels), feat_lens (B,). ``warp`` (B,): VTLP warp factors
        (1: none), each utterance through its own filterbank (:func:`warped_mel_filterbank`)."""
        _check_input(wav, wav_lens)
        feat_lens = self.num_frames(wav_lens.long())
        # Plain int arithmetic on the size (not a tensor round trip), so that export (torch.export, jit.trace)
        # keeps the frame count symbolic in the input length instead of baking in the example's.
        n_frames = (wav.size(1) - self.win_length) // self.hop_length + 1
        if n_frames <= 0:
            return wav.new_zeros(wav.size(0), 0, self.output_dim, dtype=torch.float32), feat_lens
        # Spectra in float32 even under autocast: log of small half-precision powers is unstable.
        with torch.autocast(device_type=wav.device.type, enabled=False):
            x = wav.float()
            # torch.stft centres a win_length window inside each n_fft frame; padding the signal by that offset
            # makes frame i's window cover exactly samples [i*hop, i*hop + win_length) (snip-edges framing).
            left = (self.n_fft - self.win_length) // 2
            x = nn.functional.pad(x, (left, self.n_fft - self.win_length - left))
            spec = torch.stft(x, self.n_fft, self.hop_length, self.win_length, self.window,
                              center=False, return_complex=True)  # (B, K, F)
            power = spec.real.square() + spec.imag.square()
            if _warps(warp):
                fb = warped_mel_filterbank(*self.mel_args, warp.cpu(), self.vtlp_boundary_hz).to(power.device)
                mel = torch.bmm(power.transpose(1, 2), fb.transpose(1, 2))  # (B, F, K) @ (B, K, M)
            else:
                mel = torch.matmul(power.transpose(1, 2), self.mel_fb)  # (B, F, M)
            feats = torch.log(torch.clamp(mel, min=self.log_floor))
        return _zero_padding(feats[:, :n_frames], feat_lens), feat_lens


class KaldiFbank(_Framed):
    """Kaldi ``compute-fbank`` features via ``torchaudio.compliance.kaldi.fbank``, one utterance at a time.

    Samples are multiplied by 32768 before the call: Kaldi reads int16 PCM
    as raw integers, so this scaling reproduces Kaldi's feature values for a
    16-bit file that was loaded as float in [-1, 1]. Kaldi options not in the
    config keep Kaldi's defaults (pre-emphasis 0.97, DC removal, power
    spectrum, float-epsilon log floor -- ``log_floor`` is not used); so do
    ``window`` (povey) and ``dither`` (1.0) when the config leaves them unset
    (:class:`~asrkit.config.FrontendConfig`). The config's own keys keep
    asrkit's defaults (80 mel bins where Kaldi has 23, 20 Hz low cut as Kaldi).

    Dither (``cfg.dither``, Gaussian, in int16 units like Kaldi's
    ``--dither``) is added in training mode only. Kaldi dithers whenever it
    computes features, decoding included; here ``.eval()`` (decoding,
    validation, ``compute-cmvn``, export) never dithers, so the same audio
    always gives the same features and transcript, equal to Kaldi's at
    ``--dither=0``. ``n_fft`` must equal ``win_length`` rounded up to a
    power of two, which is what Kaldi uses.
    """

    INT16_SCALE = 32768.0
    WINDOWS = {"povey": "povey", "hamming": "hamming", "hann": "hanning", "hanning": "hanning",
               "rectangular": "rectangular", "blackman": "blackman"}

    def __init__(self, cfg: FrontendConfig, vtlp: Optional[VtlpConfig] = None) -> None:
        super().__init__()
        if cfg.window not in self.WINDOWS:
            raise ConfigError(f"frontend.window '{cfg.window}' is not supported by kind 'kaldi_fbank' "
                              f"(choose from: {', '.join(self.WINDOWS)})")
        if cfg.win_length <= 0 or cfg.hop_length <= 0 or cfg.n_mels <= 0:
            raise ConfigError("frontend: win_length, hop_length and n_mels must be positive")
        padded = 1 << (cfg.win_length - 1).bit_length()
        if cfg.n_fft != padded:
            raise ConfigError(f"frontend.n_fft={cfg.n_fft}, but kind 'kaldi_fbank' uses win_length={cfg.win_length} "
                              f"rounded up to a power of two: set frontend.n_fft to {padded}")
        if cfg.dither < 0:
            raise ConfigError(f"frontend.dither must be >= 0, got {cfg.dither}")
        self.win_length, self.hop_length = cfg.win_length, cfg.hop_length
        self.output_dim = cfg.n_mels
        self.dither = cfg.dither
        # Kaldi takes milliseconds and truncates sr * ms / 1000 to int; the +0.5 sample keeps
        # float rounding from truncating to one sample less than configured.
        self.options = dict(
            frame_length=(cfg.win_length + 0.5) * 1000.0 / cfg.sample_rate,
            frame_shift=(cfg.hop_length + 0.5) * 1000.0 / cfg.sample_rate,
            sample_frequency=float(cfg.sample_rate), num_mel_bins=cfg.n_mels, low_freq=cfg.fmin,
            high_freq=0.0 if cfg.fmax is None else cfg.fmax, window_type=self.WINDOWS[cfg.window],
            snip_edges=True)
        self.vtlp_boundary_hz = _vtlp_boundary(cfg, vtlp)
        if vtlp is not None and vtlp.prob > 0:
            # Kaldi's warp needs its cut-offs inside the filters' range: low above fmin, high below the top edge.
            top = cfg.sample_rate / 2 if cfg.fmax is None else cfg.fmax
            if self.vtlp_boundary_hz >= top or cfg.fmin >= KALDI_VTLN_LOW:
                raise ConfigError(f"augment.vtlp with kind 'kaldi_fbank' needs boundary_hz below the highest filter "
                                  f"edge {top:g} Hz and frontend.fmin below {KALDI_VTLN_LOW:g} Hz; got boundary_hz "
                                  f"{self.vtlp_boundary_hz:g}, fmin {cfg.fmin:g}")

    def forward(self, wav: Tensor, wav_lens: Tensor, warp: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """wav (B, T) float in [-1, 1], wav_lens (B,) -> feats (B, F, n_mels), feat_lens (B,). ``warp`` (B,): VTLP warp
        factors (1: none), through Kaldi's VTLN warp (:func:`~asrkit.audio.vtlp.kaldi_vtln_options`)."""
        _check_input(wav, wav_lens)
        feat_lens = self.num_frames(wav_lens.long())
        n_frames = int(self.num_frames(torch.tensor(wav.size(1))))
        feats = wav.new_zeros(wav.size(0), n_frames, self.output_dim, dtype=torch.float32)
        dither = self.dither if self.training else 0.0
        alphas = warp.tolist() if _warps(warp) else [1.0] * wav.size(0)
        with torch.autocast(device_type=wav.device.type, enabled=False):
            # One host sync per batch for the lengths; the compliance API needs Python ints anyway.
            for b, (n, f, alpha) in enumerate(zip(wav_lens.tolist(), feat_lens.tolist(), alphas)):
                if f == 0:
                    continue  # shorter than one window: Kaldi emits no frames
                x = wav[b, :n].float() * self.INT16_SCALE
                vtln = kaldi_vtln_options(alpha, self.vtlp_boundary_hz) if alpha != 1.0 else {}
                feats[b, :f] = kaldi.fbank(x[None], dither=dither, **self.options, **vtln)
        return feats, feat_lens


def _warps(warp: Optional[Tensor]) -> bool:
    """Whether VTLP factors ``warp`` (B,) warp any utterance (one host sync per training batch)."""
    return warp is not None and bool((warp != 1.0).any())


def _vtlp_boundary(cfg: FrontendConfig, vtlp: Optional[VtlpConfig]) -> float:
    """VTLP's F_hi for a frontend; checked against the Nyquist frequency when VTLP is on."""
    vtlp = vtlp or VtlpConfig()
    if vtlp.prob > 0:
        check_boundary(vtlp.boundary_hz, cfg.sample_rate)
    return vtlp.boundary_hz


def build_frontend(cfg: FrontendConfig, vtlp: Optional[VtlpConfig] = None) -> nn.Module:
    """The feature extractor named by ``cfg.kind`` (``logmel`` or ``kaldi_fbank``; the config checks the kind);
    ``vtlp``: the warp that training batches' ``vtlp_alpha`` factors use (default: off, with the paper's F_hi)."""
    if cfg.sample_rate <= 0:
        raise ConfigError(f"frontend.sample_rate must be positive, got {cfg.sample_rate}")
    return LogMel(cfg, vtlp) if cfg.kind == "logmel" else KaldiFbank(cfg, vtlp)


def _check_stats_frontend(stats: CMVNStats, frontend: FrontendConfig) -> None:
    """Stats from ``asrkit compute-cmvn`` record its frontend: they must match on whether the whole utterance's
    mean was removed before them (``utterance_cmn: true``), which shifts every feature's mean to 0 (global stats
    of the other kind would mis-normalise every frame). ``false`` and ``causal`` both take the extractor's own
    features (the running mean comes after global CMVN)."""
    recorded = stats.meta.get("frontend")
    if not isinstance(recorded, dict):
        return  # stats from elsewhere: nothing recorded to check
    theirs = recorded.get("utterance_cmn", False)
    if (theirs is True) != (frontend.utterance_cmn is True):
        raise ConfigError(f"the CMVN stats were computed with frontend.utterance_cmn={theirs}, but the frontend "
                          f"has utterance_cmn={frontend.utterance_cmn}: recompute them with "
                          f"'asrkit compute-cmvn --config' on this config")


class Frontend(nn.Module):
    """Waveform -> model input: speed perturbation -> features (-> utterance CMN) -> SpecAugment -> global CMVN;
    with ``utterance_cmn: causal``: speed perturbation -> features -> global CMVN -> causal CMN -> SpecAugment.

    Speed perturbation and SpecAugment act only in training mode (and only
    when enabled in their configs); ``.eval()`` leaves the deterministic
    features plus CMVN. ``cmvn`` may be ``None`` (no normalisation), a
    :class:`~asrkit.audio.cmvn.CMVNStats`, or a ``(mean, istd)`` pair; the
    resulting buffers are part of the state dict. When CMVN is present,
    SpecAugment fills masks with the CMVN mean so masked cells become exactly
    0 after normalisation (the mean value, as in the SpecAugment paper); after causal CMN they fill with 0.
    ``vtlp``: the warp of the filterbank that training batches' VTLP factors (``forward``'s ``warp``) use.
    """

    def __init__(self, frontend: FrontendConfig, specaug: Optional[SpecAugmentConfig] = None,
                 speed_perturb: Optional[SpeedPerturbConfig] = None,
                 cmvn: Optional[CMVNStats | Tuple[Tensor, Tensor]] = None, vtlp: Optional[VtlpConfig] = None) -> None:
        super().__init__()
        self.sample_rate = frontend.sample_rate
        specaug = specaug or SpecAugmentConfig()
        speed_perturb = speed_perturb or SpeedPerturbConfig()
        self.speed_perturb = SpeedPerturb(speed_perturb, frontend.sample_rate) if speed_perturb.enabled else None
        self.extractor = build_frontend(frontend, vtlp)
        self.output_dim: int = self.extractor.output_dim
        cmn = build_utterance_cmn(frontend)
        # the whole utterance's mean goes before global CMVN, the running mean after it (asrkit.audio.utterance_cmn)
        self.causal_cmn: Optional[CausalCMN] = cmn if isinstance(cmn, CausalCMN) else None
        self.utterance_cmn = None if self.causal_cmn is not None else cmn
        self.specaug = SpecAugment(specaug) if specaug.enabled else None
        if isinstance(cmvn, CMVNStats):
            _check_stats_frontend(cmvn, frontend)
        if cmvn is None:
            self.cmvn: Optional[GlobalCMVN] = None
        else:
            self.cmvn = GlobalCMVN.from_stats(cmvn) if isinstance(cmvn, CMVNStats) else GlobalCMVN(*cmvn)
            if self.cmvn.mean.numel() != self.output_dim:
                raise ConfigError(f"CMVN stats have dimension {self.cmvn.mean.numel()}, but the frontend "
                                  f"produces {self.output_dim} features (frontend.n_mels)")
        if self.causal_cmn is not None and self.causal_cmn.prior_frames > 0 and self.cmvn is None:
            raise ConfigError(f"frontend.utterance_cmn_prior_frames={frontend.utterance_cmn_prior_frames} needs "
                              f"global CMVN stats (the prior is their mean): set cmvn, or "
                              f"utterance_cmn_prior_frames: 0")

    def num_frames(self, num_samples: Tensor) -> Tensor:
        """Frames produced for ``num_samples`` samples without speed perturbation (e.g. for batching)."""
        return self.extractor.num_frames(num_samples)

    def forward(self, wav: Tensor, wav_lens: Tensor, warp: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """wav (B, T) float in [-1, 1], wav_lens (B,) -> feats (B, F, output_dim), feat_lens (B,). ``warp`` (B,):
        VTLP warp factors from the training loader (``batch["vtlp_alpha"]``), applied in training mode only."""
        if self.training and self.speed_perturb is not None:
            wav, wav_lens = self.speed_perturb(wav, wav_lens)
        feats, feat_lens = self.extractor(wav, wav_lens, warp if self.training else None)
        if not (self.training and self.specaug is not None):
            return self.normalize(feats, feat_lens)
        if self.causal_cmn is not None:  # its output's mean is 0: the masks' fill
            return self.specaug(*self.normalize(feats, feat_lens))
        if self.utterance_cmn is not None:
            feats, feat_lens = self.utterance_cmn(feats, feat_lens)
        fill = self.cmvn.mean if self.cmvn is not None else None
        feats, feat_lens = self.specaug(feats, feat_lens, fill=fill)
        if self.cmvn is not None:
            feats, feat_lens = self.cmvn(feats, feat_lens)
        return feats, feat_lens

    def warped(self, wav: Tensor, wav_lens: Tensor, warp: Tensor) -> Tuple[Tensor, Tensor]:
        """Evaluation features (no speed perturbation, no SpecAugment, whatever the mode) from filterbanks warped by
        ``warp`` (B,), one factor per utterance (1: none): vocal tract length normalisation at decode time."""
        return self.normalize(*self.extractor(wav, wav_lens, warp))

    def normalize(self, feats: Tensor, feat_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Extractor output -> model input without augmentation: utterance CMN (if on), global CMVN (if any), causal
        CMN (if on)."""
        if self.utterance_cmn is not None:
            feats, feat_lens = self.utterance_cmn(feats, feat_lens)
        if self.cmvn is not None:
            feats, feat_lens = self.cmvn(feats, feat_lens)
        if self.causal_cmn is not None:
            feats, feat_lens = self.causal_cmn(feats, feat_lens)
        return feats, feat_lens

    @property
    def frame_shift_seconds(self) -> float:
        """Seconds between feature frames (for timestamps)."""
        return self.extractor.hop_length / self.sample_rate

