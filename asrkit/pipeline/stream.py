"""Inputs -> segments -> features, in data-loader workers, so that reading audio and computing features
overlap the model; and batching of the segments by total seconds.

Each worker takes every ``num_workers``-th input, plans its segments (:mod:`asrkit.audio.vad`: voice
activity, bounded length, overlapping windows where no pause is found), reads one segment at a time (a
file is never loaded whole when it can be read in blocks) and computes its features with a CPU copy of the
model's frontend. It yields a :class:`SegmentItem` per segment and then an :class:`InputDone` for the
input (with the error, if reading failed: the other inputs go on).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from asrkit.audio import silero
from asrkit.audio.io import AudioError, audio_info, load_audio, load_audio_bytes, resample
from asrkit.audio.vad import VadConfig, Window, energy_threshold, frame_energies, frame_geometry, plan_segments
from asrkit.pipeline.autobatch import BatchLimit
from asrkit.pipeline.inputs import AudioInput

# energy and silero split at pauses (asrkit.audio.vad.plan_segments; "vad" is energy's old name), fixed into
# overlapping windows, none not at all
SEGMENTERS = ("energy", "silero", "fixed", "none", "vad")


@dataclass
class SegmentItem:
    index: int  # the input's position
    number: int  # the segment's position within its input
    window: Window  # seconds in the input
    data: torch.Tensor  # (T, F) features, or (S,) samples when the model computes its own features
    speech: np.ndarray  # (N,) bool: voice activity per ``hop`` seconds of the window (for word boundaries)
    hop: float
    load_seconds: float
    feature_seconds: float

    @property
    def length(self) -> int:
        return self.data.shape[0]


@dataclass
class InputDone:
    index: int
    num_segments: int
    duration: float  # seconds of audio
    error: Optional[str] = None
    load_seconds: float = 0.0  # reading headers and planning segments


Item = Union[SegmentItem, InputDone]


def _whole(duration: float) -> List[Window]:
    return [Window(0.0, duration, 0.0, duration)]


class SegmentDataset(IterableDataset):
    """Yields the segments of ``inputs`` (as :data:`Item`); see the module docstring."""

    def __init__(self, inputs: Sequence[AudioInput], sample_rate: int, featurizer: Optional[nn.Module],
                 segmenter: str = "vad", vad: Optional[VadConfig] = None):
        if segmenter not in SEGMENTERS:
            raise ValueError(f"segmenter must be one of {', '.join(SEGMENTERS)}, got '{segmenter}'")
        if segmenter == "silero":  # here, before the loader's workers: one error naming the extra, not one per input
            silero.check_installed("--segmenter silero")
        self.inputs, self.sample_rate, self.featurizer = list(inputs), sample_rate, featurizer
        self.segmenter, self.vad = segmenter, vad or VadConfig()

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        if info is not None:
            torch.set_num_threads(1)  # workers run beside the model: one thread each
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(start, len(self.inputs), step):
            yield from self._segments(index, self.inputs[index])

    def _plan(self, inp: AudioInput) -> tuple:
        """(windows, duration, waveform or None, where to read segments from)."""
        if inp.waveform is not None:
            wav = resample(inp.waveform.float(), inp.sample_rate or self.sample_rate, self.sample_rate)
            duration = wav.numel() / self.sample_rate
            source: Union[str, torch.Tensor] = wav
        elif inp.path is not None:
            rate, frames = audio_info(inp.path, name=inp.name, pipe=False)
            duration, source, wav = frames / rate, inp.path, None
        else:  # a wav.scp entry (a command has to run anyway) or bytes: read it once
            wav = (load_audio_bytes(inp.data, self.sample_rate, name=inp.name) if inp.data is not None
                   else load_audio(inp.scp_source, self.sample_rate, name=inp.name))
            duration, source = wav.numel() / self.sample_rate, wav
        if self.segmenter == "none":
            return _whole(duration), duration, wav
        windows = plan_segments(source, self.sample_rate, self.vad, mode=self.segmenter)
        return windows, duration, wav

    def _read(self, inp: AudioInput, wav: Optional[torch.Tensor], w: Window) -> torch.Tensor:
        if wav is not None:
            first = int(round(w.start * self.sample_rate))
            return wav[first: max(first + 1, int(round(w.end * self.sample_rate)))]
        return load_audio(inp.path, self.sample_rate, start=w.start, end=w.end, name=inp.name, pipe=False)

    @torch.inference_mode()
    def _segments(self, index: int, inp: AudioInput) -> Iterator[Item]:
        t0 = time.perf_counter()
        try:
            windows, duration, wav = self._plan(inp)
        except (AudioError, RuntimeError, ValueError) as exc:
            yield InputDone(index, 0, 0.0, _message(inp, exc), time.perf_counter() - t0)
            return
        plan_seconds = time.perf_counter() - t0
        for number, w in enumerate(windows):
            t0 = time.perf_counter()
            try:
                samples = self._read(inp, wav, w)
            except (AudioError, RuntimeError, ValueError) as exc:
                yield InputDone(index, 0, duration, _message(inp, exc), plan_seconds)
                return
            t1 = time.perf_counter()
            data = samples
            if self.featurizer is not None:
                feats, _ = self.featurizer(samples[None], torch.tensor([samples.numel()]))
                data = feats[0]  # (T, F)
            energies = frame_energies(samples, self.sample_rate, self.vad)
            speech = energies > energy_threshold(energies, self.vad)
            hop = frame_geometry(self.sample_rate, self.vad)[1] / self.sample_rate
            yield SegmentItem(index, number, w, data, speech, hop, t1 - t0, time.perf_counter() - t1)
        yield InputDone(index, len(windows), duration, None, plan_seconds)


def header_seconds(inp: AudioInput, sample_rate: int) -> float:
    """Seconds of audio in ``inp`` from a waveform's length or a file's header; 0 where that is not known
    without reading the input (a wav.scp entry, a file whose header cannot be read)."""
    if inp.waveform is not None:
        return inp.waveform.numel() / (inp.sample_rate or sample_rate)
    if inp.path is None:
        return 0.0
    try:
        rate, frames = audio_info(inp.path, name=inp.name, pipe=False)
    except AudioError:
        return 0.0
    return frames / rate


def _message(inp: AudioInput, exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text if inp.name in text else f"{inp.name}: {text}"


def _items(batch: Item) -> Item:
    return batch


def segment_loader(dataset: SegmentDataset, num_workers: int) -> DataLoader:
    """Items one by one (no collation), ``num_workers`` processes reading ahead."""
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_items,
                      prefetch_factor=16 if num_workers > 0 else None, persistent_workers=False)


def seconds_batches(items: List[SegmentItem], frames_per_second: float, limit: BatchLimit
                    ) -> Iterator[List[SegmentItem]]:
    """Longest first; each batch's padded size (count x longest) stays within ``limit`` (seconds of audio,
    and GPU memory where it is sized from that); a single longer segment is a batch of its own."""
    items = sorted(items, key=lambda it: -it.length)
    i = 0
    while i < len(items):
        count = limit.count(items[i].length / frames_per_second)
        yield items[i: i + count]
        i += count
