"""Learned voice activity: the Silero VAD model (``pip install -e '.[vad]'``) run by onnxruntime.

The ``silero-vad`` package (MIT licence, Silero Team) ships its ONNX model inside the wheel
(``silero_vad/data/silero_vad.onnx``, 2.3 MB), so nothing is downloaded, at run time or in tests. Only
that file is used: the package is located, never imported (its import sets torch's thread count to 1).

The model reads 16 kHz audio in chunks of :data:`CHUNK` = 512 samples (32 ms), each with the 64 samples
before it, and carries a recurrent state (2, B, 128) from chunk to chunk; per chunk it gives the probability
that it holds speech. :class:`SileroStream` runs it on a live stream (samples in pieces of any size; the
probabilities are those of the whole audio at once, the same calls in the same order), and
:func:`speech_probabilities` on a file or a waveform, read in blocks of about 10 s (a file is never loaded
whole). Audio at another rate is resampled to 16 kHz (a file block by block: 10-s block edges are
invisible to a 32 ms speech detector). The last partial chunk is padded with zeros, as Silero's own
``get_speech_timestamps`` does.

:func:`asrkit.audio.vad.plan_segments` with ``mode="silero"`` segments with these probabilities (the same
merging, padding and length bounding as the energy VAD), and the streaming endpointer
(:mod:`asrkit.pipeline.endpoint`, ``decode.endpoint.vad: silero``) reads a stream's probabilities.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Optional, Union

import numpy as np
import soundfile as sf
import torch

from asrkit.audio.io import AudioError, resample
from asrkit.extras import locate, require

__all__ = ["SAMPLE_RATE", "CHUNK", "HOP_SECONDS", "SileroStream", "speech_probabilities", "model_path",
           "check_installed", "session"]

SAMPLE_RATE = 16000  # the model's rate (it also reads 8 kHz, but one rate keeps one code path)
CHUNK = 512  # samples per probability at 16 kHz
CONTEXT = 64  # samples of the previous chunk the model reads with each chunk
HOP_SECONDS = CHUNK / SAMPLE_RATE  # 0.032 s per probability
_BLOCK_CHUNKS = 320  # chunks per block read from a file (10.24 s)


def model_path(purpose: str = "the Silero VAD") -> str:
    """The ONNX model file in the installed silero-vad package; MissingExtraError names the extra if absent."""
    path = os.path.join(locate("silero_vad", purpose), "data", "silero_vad.onnx")
    if not os.path.isfile(path):
        raise AudioError(f"{path}: the silero-vad package has no ONNX model here (need silero-vad >= 5.1)")
    return path


def check_installed(purpose: str = "the Silero VAD") -> str:
    """The model's path, once silero-vad and onnxruntime are known to be installed (else MissingExtraError, whose
    message names ``purpose`` and the extra); starts nothing, so it can run before loader workers fork."""
    path = model_path(purpose)
    require("onnxruntime", purpose)
    return path


def session(purpose: str = "the Silero VAD") -> Any:
    """The onnxruntime session on the model, one per process; ``purpose`` names what needs it in the error that
    names the extra to install."""
    return _session(check_installed(purpose))


@functools.lru_cache(maxsize=1)
def _session(path: str) -> Any:
    """One thread: segmenting runs in loader workers beside the model."""
    import onnxruntime as ort  # require() has checked that it is installed

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


class SileroStream:
    """Speech probabilities of one 16 kHz stream, a chunk (32 ms) at a time as its samples arrive."""

    def __init__(self, purpose: str = "the Silero VAD") -> None:
        self._session = session(purpose)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._rate = np.array(SAMPLE_RATE, dtype=np.int64)

    def accept(self, samples: Union[np.ndarray, torch.Tensor]) -> np.ndarray:
        """The next samples (S,) float in [-1, 1] at 16 kHz -> the probabilities (N,) of the chunks now complete."""
        x = samples.detach().cpu().numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples)
        if x.ndim != 1:
            raise ValueError(f"SileroStream: samples must be 1-D (S,), got shape {tuple(x.shape)}")
        buf = np.concatenate([self._pending, x.astype(np.float32, copy=False)])
        n = len(buf) // CHUNK
        out = np.empty(n, dtype=np.float32)
        for i in range(n):
            out[i] = self._run(buf[i * CHUNK:(i + 1) * CHUNK])
        self._pending = buf[n * CHUNK:]
        return out

    def flush(self) -> np.ndarray:
        """At the end of the audio: the probability of the last partial chunk, padded with zeros ((0,) if none)."""
        if len(self._pending) == 0:
            return np.zeros(0, dtype=np.float32)
        chunk = np.zeros(CHUNK, dtype=np.float32)
        chunk[:len(self._pending)] = self._pending
        self._pending = np.zeros(0, dtype=np.float32)
        return np.array([self._run(chunk)], dtype=np.float32)

    def _run(self, chunk: np.ndarray) -> float:
        x = np.concatenate([self._context, chunk])[None]  # (1, CONTEXT + CHUNK)
        out, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": self._rate})
        self._context = chunk[-CONTEXT:]
        return float(out[0, 0])


def _blocks(source: Union[str, "os.PathLike[str]", np.ndarray, torch.Tensor], sample_rate: Optional[int]):
    """Mono 16 kHz float32 blocks of about 10 s of a file path or a waveform (T,) / (C, T) at ``sample_rate``."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with sf.SoundFile(path) as f:
                step = int(round(_BLOCK_CHUNKS * CHUNK * f.samplerate / SAMPLE_RATE))
                for block in f.blocks(blocksize=step, dtype="float32", always_2d=True):
                    mono = torch.from_numpy(np.ascontiguousarray(block.mean(axis=1, dtype=np.float32)))
                    yield resample(mono, f.samplerate, SAMPLE_RATE).numpy()
        except (sf.SoundFileError, RuntimeError) as exc:
            raise AudioError(f"{path}: cannot decode audio: {exc}") from None
        return
    if sample_rate is None or sample_rate <= 0:
        raise ValueError("speech_probabilities: a waveform needs its sample_rate")
    wav = torch.as_tensor(source).float()
    if wav.dim() == 2:
        wav = wav.mean(dim=0)
    wav = resample(wav, sample_rate, SAMPLE_RATE).numpy()
    step = _BLOCK_CHUNKS * CHUNK
    for i in range(0, len(wav), step):
        yield wav[i:i + step]


def speech_probabilities(source: Union[str, "os.PathLike[str]", np.ndarray, torch.Tensor],
                         sample_rate: Optional[int] = None) -> np.ndarray:
    """Speech probability (float32) of each 32 ms chunk of a file or a waveform at ``sample_rate`` (resampled to
    16 kHz), mixed down to mono; ``ceil(T16k / 512)`` values, chunk ``i`` starting at ``i * 0.032`` s."""
    stream = SileroStream("the silero segmenter")
    parts = [stream.accept(block) for block in _blocks(source, sample_rate)]
    parts.append(stream.flush())
    probs = np.concatenate(parts)
    if not np.isfinite(probs).all():
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "waveform"
        raise AudioError(f"{name}: audio contains NaN or infinite samples")
    return probs
