"""What can be transcribed, and how command-line arguments become inputs.

An :class:`AudioInput` is one of

* a **file path**, read as a file whatever characters its name holds (``|``, ``;``, spaces): a path
  given to ``asrkit transcribe`` or ``Transcriber.transcribe`` is never run as a command;
* a **wav.scp entry** (``recording-id source``, from :func:`read_scp`): the one place where a source ending
  in ``|`` is a shell command, as in Kaldi. A wav.scp is trusted as recipe data only when it is named as one
  (``asrkit transcribe --scp FILE``): a ``*.scp`` among the INPUT arguments (a glob over someone else's
  folder) is a file like any other, read as audio, and nothing in it runs;
* a **waveform** (a mono float tensor or numpy array, at the model's sample rate unless its rate is given);
* the **bytes of an audio file** (what ``-`` reads when standard input holds audio).

``expand_arguments`` maps the CLI's INPUT arguments: audio files, directories (searched recursively for
:data:`AUDIO_EXTENSIONS` that the audio backend reads), and ``-`` (standard input: the bytes of one audio
file when they start like one, else one path per line).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import soundfile as sf
import torch

from asrkit.data.table import read_table

# Extensions searched in directories, each kept only if libsndfile reads it (mp3 needs libsndfile >= 1.1).
_CANDIDATES = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG", ".mp3": "MP3"}
AUDIO_EXTENSIONS: Tuple[str, ...] = tuple(ext for ext, fmt in _CANDIDATES.items() if fmt in sf.available_formats())


@dataclass(frozen=True)
class AudioInput:
    """One thing to transcribe; exactly one of ``path``, ``scp_source``, ``waveform`` and ``data`` is set."""

    name: str
    path: Optional[str] = None
    scp_source: Optional[str] = None  # a trusted wav.scp value: a path or "cmd |"
    waveform: Optional[torch.Tensor] = None  # (S,) float samples
    sample_rate: Optional[int] = None  # the waveform's rate; None: the model's
    data: Optional[bytes] = None  # the bytes of an audio file (standard input)

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.path, self.scp_source, self.waveform, self.data)) != 1:
            raise ValueError(f"input {self.name}: give exactly one of path, scp_source, waveform and data")
        if self.waveform is not None and self.waveform.dim() != 1:
            raise ValueError(f"input {self.name}: a waveform must be 1-D (samples,), got shape "
                             f"{tuple(self.waveform.shape)}")
        if self.waveform is not None and not self.waveform.is_floating_point():
            raise ValueError(f"input {self.name}: a waveform must hold float samples in [-1, 1], got "
                             f"{self.waveform.dtype} (divide integer PCM by its full scale, e.g. 32768)")
        if self.sample_rate is not None and (self.waveform is None or self.sample_rate <= 0):
            raise ValueError(f"input {self.name}: sample_rate is the rate of a waveform, a positive number of "
                             f"samples per second; got {self.sample_rate}")


Waveform = Union[torch.Tensor, np.ndarray]
Inputlike = Union[str, os.PathLike, Waveform, AudioInput]
_ONE = (str, os.PathLike, torch.Tensor, np.ndarray, AudioInput, bytes)  # never iterated as several inputs


def is_one_input(inputs: object) -> bool:
    """True for a single input (a path or a waveform: a string and an array are sequences too), False for
    a collection of inputs."""
    return isinstance(inputs, _ONE)


def as_inputs(items: Iterable[Inputlike], sample_rate: Optional[int] = None) -> List[AudioInput]:
    """Paths (str or PathLike, read as files), waveforms (tensors or numpy arrays, named ``waveform-<i>``, at
    ``sample_rate`` or the model's) or AudioInputs."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, AudioInput):
            out.append(item)
        elif isinstance(item, (torch.Tensor, np.ndarray)):
            if isinstance(item, np.ndarray):  # torch shares writable C-ordered memory; others are copied
                shareable = item.flags.writeable and item.flags.c_contiguous
                item = torch.from_numpy(item if shareable else np.array(item, order="C"))
            out.append(AudioInput(f"waveform-{i}", waveform=item, sample_rate=sample_rate))
        elif isinstance(item, (str, os.PathLike)):
            out.append(AudioInput(os.fspath(item), path=os.fspath(item)))
        else:
            raise TypeError(f"input {i}: expected a path, a waveform (tensor or numpy array) or an AudioInput, "
                            f"got {type(item).__name__}")
    return out


def find_audio(directory: str) -> List[str]:
    """Audio files under ``directory`` (recursively, sorted), by extension."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if os.path.splitext(f)[1].lower() in AUDIO_EXTENSIONS]
    return found


def read_scp(path: str) -> List[AudioInput]:
    """The entries of a wav.scp (``id source``; sources may be ``cmd |``, which will run: call this only for a
    file its user named as a trusted list)."""
    return [AudioInput(key, scp_source=value) for key, value in read_table(path, allow_empty_value=False).items()]


def starts_like_audio(head: bytes) -> bool:
    """Whether the first 20 bytes begin an audio file: RIFF/RF64 WAVE, FLAC, Ogg, MP3 (an ID3 tag or an MPEG
    frame sync). Each signature holds a byte that UTF-8 text never has (NUL, 0x80 or 0xFF), so a list of paths
    never looks like audio."""
    return ((head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"
             and head[19:20] == b"\x00")  # the first chunk's size (fmt, ds64, LIST, JUNK) is under 16 MB
            or (head[:4] == b"fLaC" and head[4:5] in (b"\x00", b"\x80"))  # the STREAMINFO block comes first
            or head[:5] == b"OggS\x00"  # stream structure version 0
            or (head[:3] == b"ID3" and head[3:4] in (b"\x02", b"\x03", b"\x04") and head[4:5] == b"\x00")
            or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0))  # MPEG frame sync


def read_stdin(stdin: BinaryIO) -> List[AudioInput]:
    """What ``-`` stands for: the bytes of one audio file (named ``stdin``) when they start like audio,
    else a list of paths, one per line (UTF-8); anything else is a ValueError in one line."""
    raw = stdin.read()
    if starts_like_audio(raw[:20]):
        return [AudioInput("stdin", data=raw)]
    try:
        text: Optional[str] = raw.decode("utf-8-sig")  # a byte-order mark is no part of the first path
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:  # paths hold neither
        raise ValueError("standard input is neither audio (WAV, FLAC, Ogg, MP3) nor text: '-' reads a list of "
                         "paths, one per line, or the bytes of one audio file")
    return [AudioInput(line, path=line) for line in text.splitlines() if line.strip()]


def expand_arguments(args: Sequence[str], stdin: Optional[BinaryIO] = None) -> List[AudioInput]:
    """CLI INPUT arguments -> inputs, in order. A name that exists nowhere, or a file that is no audio (a
    ``*.scp`` too), is kept as a file input, so that transcription reports it (with the others still
    transcribed). ``stdin``: binary, for ``-``."""
    out: List[AudioInput] = []
    for arg in args:
        if arg == "-":
            if stdin is None:
                raise ValueError("'-' needs a list of paths or audio bytes on standard input")
            out += read_stdin(stdin)
        elif os.path.isdir(arg):
            files = find_audio(arg)
            if not files:
                raise ValueError(f"{arg}: no audio files ({', '.join(AUDIO_EXTENSIONS)}) in this directory")
            out += [AudioInput(f, path=f) for f in files]
        else:
            out.append(AudioInput(arg, path=arg))
    return out
