"""Segmentation of long audio: energy-based speech segments of bounded length, or fixed overlapping windows.

A long recording is never pushed through the encoder whole (self-attention cost grows with the square of
the length, and positions far beyond the training lengths were never seen). :func:`plan_segments` turns a
file or a waveform into a list of :class:`Window` s, each decoded on its own (read with
``asrkit.audio.io.load_audio(path, sr, start=w.start, end=w.end)``) and put back together by the
transcriber (overlapping windows: each owns the tokens between its seams, see
``asrkit.pipeline.transcriber.Transcriber._stitch``).

How it works, and why it stays within bounded memory whatever the length:

1. :func:`frame_energies` reads the file in blocks of ``block_hops`` hops (about 10 s) and returns one
   energy in dB per 10 ms hop (float32: 1.4 MB per hour), never the samples of the whole file.
2. The threshold (:func:`energy_threshold`) is ``threshold_db`` above the noise floor, a low percentile of
   the recording's own frame energies (so it adapts to the recording level and background), but no closer
   than ``threshold_db`` to its loud frames (a recording with no silence is all speech), and never below
   ``abs_floor_db`` (silence-only audio gives no segments).
3. :func:`speech_segments` marks frames above the threshold, merges speech across pauses shorter than
   ``min_silence``, drops bursts shorter than ``min_speech``, pads by ``padding`` and bounds the length:
   a region longer than ``max_segment`` is cut at its quietest short pause; where there is no pause at
   all (continuous speech or music) it is covered by fixed overlapping windows (``Window.fixed``).

Limits (energy cannot tell speech from other sound): a recording whose speech is quieter than
``abs_floor_db`` gives no segments; steady noise above it with no silence (loud room tone, music) is
taken as speech and decoded in windows; a recording with hardly any silence (under ``noise_percentile``
per cent of its frames) gets a threshold inside the speech, and is cut at its quietest pauses.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple, Union

import numpy as np
import soundfile as sf

from asrkit.audio import silero
from asrkit.audio.io import AudioError

if TYPE_CHECKING:
    import torch

_EPS = 1e-10  # power floor: digital silence is -100 dB, not -inf
SEGMENT_MODES = ("vad", "energy", "silero", "fixed")  # plan_segments' modes ("vad": the old name of "energy")


@dataclass(frozen=True)
class VadConfig:
    """Voice-activity segmentation settings; all durations in seconds."""

    frame: float = 0.025  # analysis frame: 25 ms, the usual speech frame (a few pitch periods)
    hop: float = 0.010  # one energy per 10 ms, the feature frame rate: boundaries to +-10 ms
    noise_percentile: float = 5.0  # noise floor = this percentile of the frame energies: low enough to
    # fall in the pauses of a recording that is mostly speech (5 % silence suffices)
    threshold_db: float = 12.0  # speech is >= 12 dB above the noise floor: above the noise's own
    # frame-to-frame spread (a few dB), below the level of the weak consonants of normal speech. The
    # threshold is also kept 12 dB below the loud frames (99th percentile): in a recording with no silence
    # at all the "noise floor" is speech, and the whole recording must count as speech, not as noise
    abs_floor_db: float = -50.0  # ... and never below -50 dBFS: with digital silence the floor is -100 dB,
    # and room tone, dither or hum (-60 dB and less) must not count as speech; speech is -35..-15 dBFS
    min_speech: float = 0.15  # a burst shorter than this (a click, a cough's tail) is dropped
    min_silence: float = 0.3  # pauses shorter than this stay inside a segment: stop closures and
    # pauses between words are shorter; pauses between sentences are longer
    padding: float = 0.2  # kept around speech so that soft onsets/endings and the model's context
    # survive (two paddings meet in the middle of a shorter gap)
    max_segment: float = 20.0  # no decoded span is longer: the demo model trains on 2-8 s utterances and
    # longer spans cost quadratic attention; most segments end at pauses well before this
    min_segment: float = 1.0  # a cut of a long region leaves no piece shorter than this (no slivers)
    split_pause: float = 0.1  # a long region is cut only in a stretch this long that is all below the
    # threshold: a single quiet frame may be a stop closure inside a word
    overlap: float = 2.0  # overlap of fixed windows: each word near a seam has >= 1 s of context in the
    # window that owns it (ownership changes in the middle of the overlap)
    noise_window: float = 30.0  # seconds: a long recording's floor is tracked per block this long (0: global)
    block_hops: int = 1024  # hops read per block when streaming a file (10.24 s)
    silero_threshold: float = 0.5  # mode "silero": a 32 ms chunk whose speech probability is above this is speech

    def __post_init__(self) -> None:
        checks = [
            (0 < self.hop <= self.frame, f"need 0 < hop ({self.hop}) <= frame ({self.frame})"),
            (0 <= self.noise_percentile <= 100, f"noise_percentile {self.noise_percentile} not in [0, 100]"),
            (self.min_speech >= 0 and self.min_silence >= 0 and self.padding >= 0,
             "min_speech, min_silence and padding must be >= 0"),
            (self.min_segment > 0 and self.max_segment >= 2 * self.min_segment,
             f"need 0 < 2 * min_segment ({self.min_segment}) <= max_segment ({self.max_segment})"),
            (self.split_pause > 0, f"split_pause {self.split_pause} must be > 0"),
            (0 <= self.overlap < self.max_segment, f"need 0 <= overlap ({self.overlap}) < max_segment"),
            (self.block_hops >= 1, f"block_hops {self.block_hops} must be >= 1"),
            (self.noise_window >= 0, f"noise_window {self.noise_window} must be >= 0"),
            (0 < self.silero_threshold < 1, f"silero_threshold {self.silero_threshold} not in (0, 1)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"VadConfig: {message}")


@dataclass(frozen=True)
class Window:
    """A span to decode, ``[start, end)`` seconds, and the part of it that owns the words found in it.

    For a voice-activity segment ``keep_* == start/end``; for a fixed overlapping window (``fixed``) the
    ownership changes in the middle of each overlap, so the ``keep`` intervals of consecutive windows meet
    exactly (no gap, no overlap).
    """

    start: float
    end: float
    keep_start: float
    keep_end: float
    fixed: bool = False

    def __post_init__(self) -> None:
        if not (self.start <= self.keep_start < self.keep_end <= self.end):
            raise ValueError(f"Window: need start <= keep_start < keep_end <= end, got {self}")

    @property
    def duration(self) -> float:
        return self.end - self.start


def frame_geometry(sample_rate: int, cfg: Optional[VadConfig] = None) -> Tuple[int, int]:
    """``(frame_length, hop_length)`` in samples at ``sample_rate``; hop seconds are ``hop_length / sample_rate``
    (not ``cfg.hop``: at 22.05 kHz a 10 ms hop is 220 samples, and the difference adds up over hours)."""
    cfg = cfg or VadConfig()
    hop = max(1, int(round(cfg.hop * sample_rate)))
    return max(hop, int(round(cfg.frame * sample_rate))), hop


def _block_energies(buf: np.ndarray, frame_len: int, hop: int, n: int) -> np.ndarray:
    """dB energies of the ``n`` frames starting at ``0, hop, 2*hop, ...`` of ``buf`` (needs (n-1)*hop+frame_len
    samples). The frame mean is removed first, so a DC offset does not read as speech."""
    if n <= 0:
        return np.zeros(0, dtype=np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(buf[:(n - 1) * hop + frame_len], frame_len)[::hop]
    frames = frames.astype(np.float64)  # (n, frame_len): a copy of one block's frames only
    power = frames.var(axis=1)  # (n,)
    return 10.0 * np.log10(power + _EPS)


def _mono(data: np.ndarray) -> np.ndarray:
    """(T, C) -> (T,) by averaging the channels, as asrkit.audio.io.load_audio does."""
    return data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]


def _stream_energies(blocks, total: int, frame_len: int, hop: int) -> np.ndarray:
    """Energies of ``ceil(total / hop)`` frames from an iterator of mono float32 blocks (any sizes).

    Frame ``i`` covers samples ``[i*hop, i*hop + frame_len)``; the last frames are padded with zeros past
    the end, so every sample is in a frame. Only the samples a frame still needs are carried over.
    """
    n_total = -(-total // hop)  # ceil
    out = np.empty(n_total, dtype=np.float32)
    done = 0  # frames computed
    carry = np.zeros(0, dtype=np.float32)  # samples from done*hop on
    for block in blocks:
        buf = np.concatenate([carry, block]) if len(carry) else block
        n = 0 if len(buf) < frame_len else min(n_total - done, (len(buf) - frame_len) // hop + 1)
        out[done:done + n] = _block_energies(buf, frame_len, hop, n)
        done += n
        carry = buf[n * hop:]
    if done < n_total:  # the tail: frames that run past the end of the audio
        need = (n_total - done - 1) * hop + frame_len
        buf = np.concatenate([carry, np.zeros(max(0, need - len(carry)), dtype=np.float32)])
        out[done:] = _block_energies(buf, frame_len, hop, n_total - done)
    return out


def _to_numpy(waveform) -> np.ndarray:
    """A 1-D (T,) or 2-D (C, T) numpy array or torch tensor -> mono float32 numpy (T,)."""
    if not isinstance(waveform, np.ndarray):  # a torch tensor
        waveform = waveform.detach().to("cpu").float().numpy()
    if waveform.ndim == 2:
        return _mono(np.ascontiguousarray(waveform.T, dtype=np.float32))
    if waveform.ndim != 1:
        raise ValueError(f"waveform must be (T,) or (C, T), got shape {tuple(waveform.shape)}")
    return np.ascontiguousarray(waveform, dtype=np.float32)


def _check_path(path: str) -> str:
    """A file name taken literally (a ``|`` in it is part of the name, never a command)."""
    if not os.path.exists(path):
        raise AudioError(f"{path}: file not found")
    if not os.path.isfile(path):
        raise AudioError(f"{path}: not a regular file")
    return path


def audio_file_info(path: Union[str, os.PathLike]) -> Tuple[int, int]:
    """``(sample_rate, num_frames)`` of an audio file from its header; :class:`AudioError` names the file."""
    path = _check_path(os.fspath(path))
    try:
        info = sf.info(path)
    except (sf.SoundFileError, RuntimeError, ValueError) as exc:
        raise AudioError(f"{path}: cannot read audio header: {exc}") from None
    return int(info.samplerate), int(info.frames)


Source = Union[str, "os.PathLike[str]", np.ndarray, "torch.Tensor"]


def frame_energies(source: Source, sample_rate: Optional[int] = None, cfg: Optional[VadConfig] = None) -> np.ndarray:
    """Energy in dB (float32, one per hop) of a file or a waveform, mixed down to mono.

    ``source``: a file path (read in blocks of ``cfg.block_hops`` hops at the file's own rate;
    ``sample_rate`` is ignored), or a waveform (T,) / (C, T) at ``sample_rate`` (required).
    Frame ``i`` starts at ``i * hop_length`` samples (:func:`frame_geometry`); ``ceil(T / hop_length)`` frames.
    """
    cfg = cfg or VadConfig()
    if isinstance(source, (str, os.PathLike)):
        path = _check_path(os.fspath(source))
        try:
            with sf.SoundFile(path) as f:
                frame_len, hop = frame_geometry(f.samplerate, cfg)
                blocks = (_mono(b) for b in f.blocks(blocksize=cfg.block_hops * hop, dtype="float32",
                                                      always_2d=True))
                energies = _stream_energies(blocks, f.frames, frame_len, hop)
        except (sf.SoundFileError, RuntimeError) as exc:
            raise AudioError(f"{path}: cannot decode audio: {exc}") from None
    else:
        if sample_rate is None or sample_rate <= 0:
            raise ValueError("frame_energies: a waveform needs its sample_rate")
        mono = _to_numpy(source)
        frame_len, hop = frame_geometry(sample_rate, cfg)
        step = cfg.block_hops * hop  # framed block by block, as a file is: never a copy of every frame at once
        energies = _stream_energies((mono[i:i + step] for i in range(0, len(mono), step)), len(mono), frame_len, hop)
    if not np.isfinite(energies).all():
        raise AudioError(f"{source if isinstance(source, (str, os.PathLike)) else 'waveform'}: "
                         "audio contains NaN or infinite samples")
    return energies


def energy_threshold(energies: np.ndarray, cfg: Optional[VadConfig] = None,
                     hop_seconds: Optional[float] = None) -> Union[float, np.ndarray]:
    """The speech threshold in dB: ``max(abs_floor_db, min(floor + threshold_db, loud - threshold_db))`` with
    ``floor`` the ``noise_percentile``-th and ``loud`` the 99th percentile of the frame energies.

    With ``hop_seconds`` and a recording longer than ``cfg.noise_window``, the percentiles are taken per block
    of ``noise_window`` seconds and the threshold is an array, one value per frame: the level of a long
    recording drifts (speakers, gain, background), and one global floor would count a loud stretch's
    background as speech or a quiet stretch's speech as silence."""
    cfg = cfg or VadConfig()
    if len(energies) == 0:
        return cfg.abs_floor_db

    def level(e: np.ndarray) -> float:
        floor, loud = np.percentile(e, [cfg.noise_percentile, 99.0])
        return max(cfg.abs_floor_db, min(float(floor) + cfg.threshold_db, float(loud) - cfg.threshold_db))

    block = int(round(cfg.noise_window / hop_seconds)) if hop_seconds and cfg.noise_window else 0
    if block == 0 or len(energies) <= block:
        return level(energies)
    out = np.empty(len(energies), dtype=np.float64)
    for first in range(0, len(energies), block):
        # a short last block takes its floor from a full window ending with it
        out[first: first + block] = level(energies[max(0, min(first, len(energies) - block)): first + block])
    return out


class EnergyStream:
    """The energy VAD of a live stream: speech per hop (10 ms) as its samples arrive, by the offline rule
    (:func:`energy_threshold`) over the energies of the last ``cfg.noise_window`` seconds heard so far (all of
    them when it is 0), never the future. A frame is decided once all its samples are in; the samples after the
    last decided frame's hop are kept for the next call. Fed the whole audio at once with ``noise_window`` 0,
    it equals the offline rule on the frames that lie inside the audio."""

    def __init__(self, sample_rate: int, cfg: Optional[VadConfig] = None) -> None:
        self.cfg = cfg or VadConfig()
        self.frame_len, self.hop = frame_geometry(sample_rate, self.cfg)
        self.hop_seconds = self.hop / sample_rate
        self._keep = int(round(self.cfg.noise_window / self.hop_seconds)) if self.cfg.noise_window else None
        self._carry = np.zeros(0, dtype=np.float32)
        self._history = np.zeros(0, dtype=np.float32)  # dB energies the threshold is taken from

    def accept(self, samples: Union[np.ndarray, "torch.Tensor"]) -> np.ndarray:
        """The next samples (S,) -> whether each frame now complete is speech, (N,) bool."""
        buf = np.concatenate([self._carry, _to_numpy(samples)])
        n = 0 if len(buf) < self.frame_len else (len(buf) - self.frame_len) // self.hop + 1
        energies = _block_energies(buf, self.frame_len, self.hop, n).astype(np.float32)
        self._carry = buf[n * self.hop:]
        if n == 0:
            return np.zeros(0, dtype=bool)
        history = np.concatenate([self._history, energies])
        self._history = history if self._keep is None else history[-self._keep:]
        return energies > energy_threshold(self._history, self.cfg)


def _runs(mask: np.ndarray) -> List[Tuple[int, int]]:
    """``[first, last)`` frame ranges where ``mask`` is True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def speech_regions(energies: np.ndarray, hop_seconds: float, cfg: Optional[VadConfig] = None, *,
                   duration: Optional[float] = None,
                   threshold: Union[None, float, np.ndarray] = None) -> List[Tuple[float, float]]:
    """Speech regions ``(start, end)`` in seconds, merged across pauses < ``min_silence``, bursts <
    ``min_speech`` dropped, padded by ``padding`` (meeting in the middle of shorter gaps); not length-bounded.

    Frame ``i`` spans ``[i * hop_seconds, i * hop_seconds + cfg.frame)``; a region runs from the start of its
    first frame above the threshold to the end of its last. ``duration`` clips the end (default: frames * hop).
    ``energies`` may be any per-frame speech score with its ``threshold`` (Silero's probabilities); None: the
    energy threshold (:func:`energy_threshold`).
    """
    cfg = cfg or VadConfig()
    duration = len(energies) * hop_seconds if duration is None else duration
    threshold = energy_threshold(energies, cfg, hop_seconds) if threshold is None else threshold
    runs = _runs(energies > threshold)
    merged: List[List[float]] = []
    for first, last in runs:
        start, end = first * hop_seconds, min(duration, (last - 1) * hop_seconds + cfg.frame)
        if merged and start - merged[-1][1] < cfg.min_silence:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    regions = [(s, e) for s, e in merged if e - s >= cfg.min_speech]
    padded = []
    for i, (s, e) in enumerate(regions):
        lo = max(0.0, s - cfg.padding)
        hi = min(duration, e + cfg.padding)
        if i > 0:
            lo = max(lo, (regions[i - 1][1] + s) / 2)
        if i + 1 < len(regions):
            hi = min(hi, (e + regions[i + 1][0]) / 2)
        padded.append((lo, hi))
    return padded


class _Pauses:
    """Candidate cut points: centres of ``split_pause`` stretches whose frames are all below the threshold,
    with the stretch's mean energy (lower is a better cut)."""

    def __init__(self, energies: np.ndarray, first: int, hop_seconds: float, threshold: Union[float, np.ndarray],
                 cfg: VadConfig):
        """``energies``: the frames of one region, the first being frame ``first`` of the recording."""
        k = max(1, int(round(cfg.split_pause / hop_seconds)))
        n = len(energies) - k + 1
        if n <= 0:
            self.times = self.means = np.zeros(0)
            return
        csum = np.concatenate([[0.0], np.cumsum(energies, dtype=np.float64)])
        loud = np.concatenate([[0], np.cumsum(energies >= threshold)])
        quiet = np.flatnonzero(loud[k:k + n] - loud[:n] == 0)  # stretches [i, i+k) all below
        self.means = (csum[quiet + k] - csum[quiet]) / k
        # the centre of the stretch, in seconds of the recording
        self.times = (first + quiet) * hop_seconds + ((k - 1) * hop_seconds + cfg.frame) / 2

    def best(self, lo: float, hi: float) -> Optional[float]:
        """The quietest cut point in ``[lo, hi]`` (the latest among equals: fewer, longer pieces)."""
        a, b = np.searchsorted(self.times, lo, "left"), np.searchsorted(self.times, hi, "right")
        if a >= b:
            return None
        means = self.means[a:b]
        i = b - 1 - int(np.argmin(means[::-1]))
        return float(self.times[i])

    def first_after(self, lo: float, hi: float) -> Optional[float]:
        """The first cut point in ``(lo, hi]``."""
        a = np.searchsorted(self.times, lo, "right")
        return float(self.times[a]) if a < len(self.times) and self.times[a] <= hi else None


def _cover(start: float, end: float, window: float, overlap: float) -> List[Window]:
    """Fixed windows of length ``window`` over ``[start, end]``, evenly spaced so that consecutive ones
    overlap by at least ``overlap``; ownership changes in the middle of each overlap."""
    length = end - start
    if length <= window:
        return [Window(start, end, start, end, fixed=True)]
    n = math.ceil((length - overlap) / (window - overlap))
    step = (length - window) / (n - 1)  # <= window - overlap
    starts = [start + i * step for i in range(n)]
    ends = [s + window for s in starts[:-1]] + [end]
    cuts = [start] + [(starts[i + 1] + ends[i]) / 2 for i in range(n - 1)] + [end]
    return [Window(starts[i], ends[i], cuts[i], cuts[i + 1], fixed=True) for i in range(n)]


def fixed_windows(duration: float, window: float, overlap: float) -> List[Window]:
    """Windows of ``window`` seconds over ``[0, duration]`` overlapping by at least ``overlap``; their
    ``keep`` intervals tile ``[0, duration]`` exactly. Empty for ``duration <= 0``."""
    if not 0 <= overlap < window:
        raise ValueError(f"fixed_windows: need 0 <= overlap ({overlap}) < window ({window})")
    return _cover(0.0, float(duration), window, overlap) if duration > 0 else []


def _bound(start: float, end: float, energies: np.ndarray, hop_seconds: float, threshold: Union[float, np.ndarray],
           cfg: VadConfig) -> List[Window]:
    """Split one region into pieces of at most ``max_segment``: at its quietest pause, or, where no pause
    is within reach, with fixed overlapping windows up to the next pause (or the region's end)."""
    if end - start <= cfg.max_segment:
        return [Window(start, end, start, end)]
    first, last = int(start / hop_seconds), int(math.ceil(end / hop_seconds))
    if isinstance(threshold, np.ndarray):
        threshold = threshold[first:last]
    pauses = _Pauses(energies[first:last], first, hop_seconds, threshold, cfg)  # this region's frames only
    out: List[Window] = []
    cur = start
    while end - cur > cfg.max_segment:
        cut = pauses.best(cur + cfg.min_segment, min(cur + cfg.max_segment, end - cfg.min_segment))
        if cut is not None:
            out.append(Window(cur, cut, cur, cut))
            cur = cut
            continue
        nxt = pauses.first_after(cur + cfg.max_segment, end - cfg.min_segment)
        nxt = end if nxt is None else nxt
        out.extend(_cover(cur, nxt, cfg.max_segment, cfg.overlap))
        cur = nxt
    if end > cur:
        out.append(Window(cur, end, cur, end))
    return out


def speech_segments(energies: np.ndarray, hop_seconds: float, cfg: Optional[VadConfig] = None, *,
                    duration: Optional[float] = None,
                    threshold: Union[None, float, np.ndarray] = None) -> List[Window]:
    """Speech segments of at most ``cfg.max_segment`` seconds as :class:`Window` s (see :func:`speech_regions`
    for the regions, the scores and ``threshold``; a longer region is cut at its quietest pause, or covered by
    fixed windows where it has none). Windows are in time order; a voice-activity segment has
    ``keep_* == start/end``."""
    cfg = cfg or VadConfig()
    threshold = energy_threshold(energies, cfg, hop_seconds) if threshold is None else threshold
    out: List[Window] = []
    for start, end in speech_regions(energies, hop_seconds, cfg, duration=duration, threshold=threshold):
        out.extend(_bound(start, end, energies, hop_seconds, threshold, cfg))
    return out


def plan_segments(source: Source, sample_rate: Optional[int] = None, cfg: Optional[VadConfig] = None,
                  mode: str = "vad") -> List[Window]:
    """The windows to decode for a file path or a waveform (T,)/(C, T) at ``sample_rate``.

    ``mode="energy"`` (or its old name ``"vad"``): :func:`speech_segments` of the frame energies;
    ``mode="silero"``: :func:`speech_segments` of the Silero VAD's speech probabilities per 32 ms
    (:mod:`asrkit.audio.silero`, the ``vad`` extra) above ``cfg.silero_threshold``, with the same merging,
    padding and bounding; ``mode="fixed"``: :func:`fixed_windows` of ``cfg.max_segment`` seconds overlapping
    by ``cfg.overlap``. Either way, empty or silence-only audio (no frame above the threshold) gives ``[]``.
    Times are seconds from the start of the input. A file is read in blocks, never whole; each window can
    then be read with ``load_audio(path, sr, start=w.start, end=w.end)``.
    """
    if mode not in SEGMENT_MODES:
        raise ValueError(f"plan_segments: mode must be one of {', '.join(SEGMENT_MODES)}, got {mode!r}")
    cfg = cfg or VadConfig()
    if isinstance(source, (str, os.PathLike)):
        sample_rate, frames = audio_file_info(source)
    else:
        if sample_rate is None or sample_rate <= 0:
            raise ValueError("plan_segments: a waveform needs its sample_rate")
        frames = int(source.shape[-1])
    if frames == 0:
        return []
    if mode == "silero":
        probs = silero.speech_probabilities(source, sample_rate)
        if not (probs > cfg.silero_threshold).any():
            return []
        geometry = dataclasses.replace(cfg, frame=silero.HOP_SECONDS, hop=silero.HOP_SECONDS)  # 32 ms chunks
        return speech_segments(probs, silero.HOP_SECONDS, geometry, duration=frames / sample_rate,
                               threshold=cfg.silero_threshold)
    energies = frame_energies(source, sample_rate, cfg)
    duration = frames / sample_rate
    hop_seconds = frame_geometry(sample_rate, cfg)[1] / sample_rate
    if not (energies > energy_threshold(energies, cfg, hop_seconds)).any():
        return []
    if mode == "fixed":
        return fixed_windows(duration, cfg.max_segment, cfg.overlap)
    return speech_segments(energies, frame_geometry(sample_rate, cfg)[1] / sample_rate, cfg, duration=duration)

