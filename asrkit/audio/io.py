"""Read audio named by a Kaldi ``wav.scp`` value: a file path, or a shell command ending in ``|``.

* Formats: whatever libsndfile reads (wav, flac, ogg/vorbis, ...), 8/16/24/32-bit
  integer or float samples, always returned as float32 in [-1, 1] for integer
  formats (float files pass through unscaled).
* Channels: multi-channel audio is mixed down by **averaging the channels**
  (a plain channel-0 pick would silently drop a speaker recorded on channel 1).
* Sample rate: audio at another rate is resampled with
  ``torchaudio.functional.resample`` (its default windowed-sinc filter).
* Paths: a relative path resolves against the current working directory, and a
  pipe command runs in it, as in Kaldi: run tools from the directory the data
  dir's paths were written for (recipes use paths relative to the recipe root).
  Kaldi's ``ark:offset`` extended filenames are not supported.
* Segments: ``start``/``end`` in seconds; for a plain file only those frames are
  read. A pipe is decoded completely and then cut.

Every failure raises :class:`AudioError` with the message
``utt <name>: <source>: <what is wrong>``.
"""
from __future__ import annotations

import io
import os
import subprocess
from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np
import soundfile as sf

if TYPE_CHECKING:
    import torch

# A segment may end a little after the end of its recording (rounding in the
# segments file); Kaldi's extract-segments tolerates 0.5 s by default, so do we.
MAX_END_OVERSHOOT = 0.5
_STDERR_TAIL = 400  # characters of a failing command's stderr kept in the message


class AudioError(RuntimeError):
    """Audio that cannot be read; the message names the utterance, the source and the problem."""


def is_pipe(source: str) -> bool:
    """True if a wav.scp value is a command whose stdout is the audio (``cmd ... |``)."""
    return source.rstrip().endswith("|")


def _fail(name: Optional[str], source: str, what: str) -> AudioError:
    return AudioError(f"utt {name if name is not None else '?'}: {source}: {what}")


def _run_pipe(source: str, name: Optional[str]) -> bytes:
    """Run a ``cmd |`` source through the shell and return its stdout bytes."""
    cmd = source.rstrip()[:-1].strip()
    if not cmd:
        raise _fail(name, source, "empty pipe command")
    proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", errors="replace").strip()[-_STDERR_TAIL:]
        raise _fail(name, source, f"command exited with status {proc.returncode}: {tail or '(no stderr)'}")
    if not proc.stdout:
        raise _fail(name, source, "command wrote no audio to stdout")
    return proc.stdout


def _open_target(source: Optional[str], name: Optional[str], pipe: bool = True):
    """What soundfile should open: a BytesIO with a pipe's output, or a checked path. With ``pipe=False``
    the source is a file name taken as it is (a trailing ``|`` or spaces are part of the name)."""
    if not source:  # e.g. Utterance.source of an utterance that is in text but not in wav.scp/segments
        raise AudioError(f"utt {name if name is not None else '?'}: no audio entry (not in wav.scp/segments)")
    if pipe and is_pipe(source):
        return io.BytesIO(_run_pipe(source, name))
    path = source.strip() if pipe else source
    if not os.path.exists(path):
        raise _fail(name, source, "file not found")
    if not os.path.isfile(path):
        raise _fail(name, source, "not a regular file")
    if os.path.getsize(path) == 0:
        raise _fail(name, source, "empty file (0 bytes)")
    return path


def _info(target, source: str, name: Optional[str]) -> Tuple[int, int]:
    """(sample_rate, num_frames) from the header."""
    try:
        info = sf.info(target)
    except (sf.SoundFileError, RuntimeError, ValueError) as exc:
        raise _fail(name, source, f"cannot read audio header: {_short(exc)}") from None
    if isinstance(target, io.BytesIO):
        target.seek(0)
    return int(info.samplerate), int(info.frames)


def _short(exc: BaseException) -> str:
    """libsndfile messages repeat the file name; keep only the reason after the last ': '."""
    text = str(exc).strip()
    return text.rsplit(": ", 1)[-1] if ": " in text else text


def audio_info(source: str, *, name: Optional[str] = None, pipe: bool = True) -> Tuple[int, int]:
    """``(sample_rate, num_frames)`` of a wav.scp source, from its header (a pipe is run to get it;
    ``pipe=False``: ``source`` is a file name, never a command)."""
    return _info(_open_target(source, name, pipe), source, name)


def audio_duration(source: str, *, name: Optional[str] = None) -> float:
    """Duration in seconds from the audio header (a pipe source has to be run to find out)."""
    rate, frames = audio_info(source, name=name)
    return frames / rate


def _frame_range(start: float, end: Optional[float], rate: int, frames: int,
                 source: str, name: Optional[str]) -> Tuple[int, int]:
    """Turn a [start, end) segment in seconds into checked frame indices."""
    if start < 0:
        raise _fail(name, source, f"segment start {start} < 0")
    if end is not None and end <= start:
        raise _fail(name, source, f"segment end {end} <= start {start}")
    first = int(round(start * rate))
    if first >= frames:
        raise _fail(name, source, f"segment starts at {start:.3f} s, after the end of the audio "
                                  f"({frames / rate:.3f} s)")
    if end is None:
        return first, frames
    if end - frames / rate > MAX_END_OVERSHOOT:
        raise _fail(name, source, f"segment ends at {end:.3f} s, more than {MAX_END_OVERSHOOT} s after "
                                  f"the end of the audio ({frames / rate:.3f} s)")
    return first, min(frames, int(round(end * rate)))


def resample(wav: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """Resample ``wav`` (..., T) with ``torchaudio.functional.resample``; a no-op when the rates match."""
    if orig_rate == new_rate:
        return wav
    import torchaudio.functional as AF  # slow to import and only needed when the rates differ

    return AF.resample(wav, orig_rate, new_rate)


class StreamResampler:
    """Resamples a signal that arrives in pieces as one signal (python-soxr's stream, high quality): each piece's
    output depends on the samples before it, and the filter's last few milliseconds come with the next piece or
    with :meth:`flush`. The concatenated output equals resampling the whole signal at once with soxr; resampling
    each piece alone would leave an edge error at every boundary. A no-op when the rates match."""

    def __init__(self, orig_rate: int, new_rate: int):
        self.orig_rate, self.new_rate = orig_rate, new_rate
        self._soxr = None
        if orig_rate != new_rate:
            import soxr  # only streams at another rate than the model's need it

            self._soxr = soxr.ResampleStream(orig_rate, new_rate, 1, dtype="float32", quality="HQ")

    def __call__(self, piece: torch.Tensor) -> torch.Tensor:
        """The next piece (S,) at ``orig_rate`` -> the samples (S',) at ``new_rate`` ready so far."""
        if self._soxr is None:
            return piece
        import torch

        return torch.from_numpy(self._soxr.resample_chunk(piece.detach().float().cpu().numpy()))

    def flush(self) -> torch.Tensor:
        """The samples the filter held back, at the signal's end."""
        import torch

        if self._soxr is None:
            return torch.zeros(0)
        return torch.from_numpy(self._soxr.resample_chunk(np.zeros(0, np.float32), last=True))


def load_audio(source: Optional[str], sample_rate: int, *, start: float = 0.0, end: Optional[float] = None,
               name: Optional[str] = None, pipe: bool = True) -> torch.Tensor:
    """Load one utterance as a mono float32 tensor of shape (T,) at ``sample_rate``.

    ``source`` is a wav.scp value (path or ``cmd |``); ``start``/``end`` are the
    segment bounds in seconds (``end=None``: to the end of the recording);
    ``name`` is the utterance id used in error messages. Raises
    :class:`AudioError` for a missing, empty, corrupt or non-finite file, or a
    ``None`` source (an utterance with no audio entry). ``pipe=False``: ``source``
    is a file name taken literally, never run (for paths a user hands to transcribe).
    """
    return _decode(_open_target(source, name, pipe), source, sample_rate, start, end, name)


def load_audio_bytes(data: bytes, sample_rate: int, *, name: str) -> torch.Tensor:
    """The bytes of a whole audio file (standard input, say) as :func:`load_audio` reads the file: a mono
    float32 tensor (T,) at ``sample_rate``, or an :class:`AudioError` naming ``name``."""
    return _decode(io.BytesIO(data), "audio bytes", sample_rate, 0.0, None, name)


def _decode(target, source: str, sample_rate: int, start: float, end: Optional[float],
            name: Optional[str]) -> torch.Tensor:
    """Decode ``target`` (a path or a BytesIO; ``source`` names it in errors) as :func:`load_audio` says."""
    rate, frames = _info(target, source, name)
    if frames == 0:
        raise _fail(name, source, "empty audio (0 samples)")
    first, last = _frame_range(start, end, rate, frames, source, name)
    try:
        data, _ = sf.read(target, start=first, stop=last, dtype="float32", always_2d=True)  # (T, C)
    except (sf.SoundFileError, RuntimeError, ValueError) as exc:
        raise _fail(name, source, f"cannot decode audio: {_short(exc)}") from None
    if data.shape[0] == 0:
        raise _fail(name, source, "empty audio (0 samples in the requested segment)")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if not np.isfinite(mono).all():
        raise _fail(name, source, "audio contains NaN or infinite samples")
    import torch  # here, not at the top: the data-dir tools only read headers and start faster without it

    wav = torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))  # (T,)
    return resample(wav, rate, sample_rate).contiguous()
