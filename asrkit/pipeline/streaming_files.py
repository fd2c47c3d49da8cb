"""Files decoded through the live path (``asrkit transcribe --streaming``, ``asrkit decode --streaming``): each
input is a stream whose audio is fed one chunk at a time, as if it arrived live, up to ``max_streams`` inputs
advanced as one batch; the outputs are those of offline decoding (Results, a data dir's text and N-best).

An input's audio is read whole (by the loader that offline transcription uses, errors named the same way) and
then fed chunk by chunk; so this measures the streaming recognizer's accuracy and speed on files, not live I/O.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

from asrkit.config import save_config
from asrkit.data.datadir import read_data_dir
from asrkit.pipeline.autobatch import CPU_BATCH_SIZE
from asrkit.pipeline.decode_dir import nbest_lines, write_outputs
from asrkit.pipeline.inputs import AudioInput
from asrkit.pipeline.results import Alternative, Result
from asrkit.pipeline.stream import InputDone, SegmentDataset, segment_loader
from asrkit.pipeline.streaming import Partial, Stream, StreamingRecognizer
from asrkit.pipeline.transcriber import Transcriber, TranscribeStats

log = logging.getLogger("asrkit.pipeline")

PartialCallback = Callable[[str, Partial], None]


@dataclass
class _Live:
    """An input being streamed: its stream, its audio and how much of it was fed."""

    stream: Stream
    audio: torch.Tensor
    fed: int = 0
    last_partial: str = ""


def stream_inputs(recognizer: StreamingRecognizer, inputs: Sequence[AudioInput], *, max_streams: int = 16,
                  num_workers: int = 0, on_partial: Optional[PartialCallback] = None,
                  stats: Optional[TranscribeStats] = None) -> Iterator[Result]:
    """Each input as a live stream (see the module docstring); yields each Result in input order as soon as it
    and those before it are done. An input that cannot be read gets a Result with ``error`` set.
    ``on_partial(name, partial)``: called whenever an input's partial text changes to a non-empty one. ``stats``: filled in."""
    if max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")
    stats = stats if stats is not None else TranscribeStats()
    stats.inputs += len(inputs)
    start = time.perf_counter()
    piece = int(round(recognizer.chunk_frames * recognizer.frame_shift * recognizer.sample_rate))
    dataset = SegmentDataset(list(inputs), recognizer.sample_rate, None, segmenter="none")
    live: Dict[int, _Live] = {}
    done: Dict[int, Result] = {}
    next_out = 0

    def tick() -> None:
        """One chunk of audio more for every live input, decoded as one batch."""
        for item in live.values():
            if item.fed < item.audio.numel():
                item.stream.accept_waveform(item.audio[item.fed: item.fed + piece])
                item.fed += piece
            else:
                item.stream.input_finished()
        recognizer.decode_streams([item.stream for item in live.values()])
        for index, item in list(live.items()):
            if item.stream.partial != item.last_partial:
                item.last_partial = item.stream.partial
                if on_partial is not None and item.last_partial:  # not the empty one a new utterance begins with
                    on_partial(item.stream.name, item.stream.partial_result)
            if item.stream.done:
                done[index] = item.stream.result()
                stats.segments += len(done[index].segments)
                del live[index]

    def finished() -> Iterator[Result]:
        nonlocal next_out
        while next_out in done:
            result = done.pop(next_out)
            stats.failed += not result.ok
            next_out += 1
            yield result

    for item in segment_loader(dataset, num_workers):
        if isinstance(item, InputDone):
            stats.audio += item.duration
            if item.error is not None:
                log.info("%s", item.error)
                live.pop(item.index, None)
                done[item.index] = Result(inputs[item.index].name, "", duration=item.duration, error=item.error)
        else:
            stream = recognizer.create_stream(inputs[item.index].name)
            # out of a loader worker's shared memory (as transcribe does): its descriptor stays open while it lives
            live[item.index] = _Live(stream, item.data.clone() if num_workers else item.data)
        while len(live) >= max_streams:
            tick()
        yield from finished()
    while live:
        tick()
        yield from finished()
    yield from finished()
    rec = recognizer.stats
    stats.encoder, stats.search = rec.encoder, rec.search + rec.final
    stats.wall += time.perf_counter() - start


def transcribe_streaming(transcriber: Transcriber, inputs: Sequence[AudioInput], *, num_workers: int = 0,
                         on_partial: Optional[PartialCallback] = None, **options: object) -> Iterator[Result]:
    """:func:`stream_inputs` with a recognizer of ``transcriber`` (``options``: DecodeConfig keys), up to
    ``decode.batch_size`` inputs at once (null: 16); ``transcriber.stats`` says where the time went."""
    recognizer = transcriber.streaming_recognizer(**options)
    transcriber.stats = TranscribeStats()
    return stream_inputs(recognizer, inputs, max_streams=recognizer.cfg.batch_size or CPU_BATCH_SIZE,
                         num_workers=num_workers, on_partial=on_partial, stats=transcriber.stats)


def decode_data_dir_streaming(transcriber: Transcriber, data_dir: str, out_dir: str,
                              batch_size: Optional[int] = None) -> Dict[str, int]:
    """``asrkit decode --streaming``: every utterance of ``data_dir`` decoded as a live stream, into the outputs
    :func:`asrkit.pipeline.decode_dir.decode_data_dir` writes (``decode.yaml`` with the chunk and left context
    the streams used, ``text``, ``nbest.jsonl``, ``failed``); an utterance split by endpoints into several finals has their joined text, and as N-best the
    joined 1-best. Returns ``{"decoded": n, "failed": m}``."""
    read_data_dir(data_dir)  # a data dir that cannot be read fails here, before anything is written
    recognizer = transcriber.streaming_recognizer()
    # the settings the streams run with: the chunk and left context resolved (null in a config: the model's)
    used = replace(recognizer.cfg, chunk_ms=round(recognizer.chunk_frames * recognizer.frame_shift * 1000),
                   left_chunks=recognizer.left_chunks)
    save_config(used, os.path.join(out_dir, "decode.yaml"))
    nbest: Dict[str, List[Alternative]] = {}
    failed: Dict[str, str] = {}
    # the streams' memory is not what the offline probe measures (asrkit.pipeline.autobatch): 16 unless set
    batch_size = batch_size or transcriber.decode_cfg.batch_size or CPU_BATCH_SIZE
    for names, wavs in transcriber.data_dir_batches(data_dir, batch_size, failed):
        _decode_streams(recognizer, [AudioInput(name, waveform=wav) for name, wav in zip(names, wavs)], nbest, failed)
    write_outputs(out_dir, {u: alts[0].text for u, alts in nbest.items()}, failed,
                  nbest_lines(nbest) if transcriber.decode_cfg.nbest > 1 else [])
    log.info("decoded %d utterances into %s as streams (%d failed)", len(nbest), os.path.join(out_dir, "text"),
             len(failed))
    return {"decoded": len(nbest), "failed": len(failed)}


def _decode_streams(recognizer: StreamingRecognizer, inputs: List[AudioInput], out: Dict[str, List[Alternative]],
                    failed: Dict[str, str]) -> None:
    """The inputs as concurrent streams; if that raises, each alone, so that only the one that raises fails
    (as offline decoding isolates a bad utterance)."""
    try:
        results = list(stream_inputs(recognizer, inputs, max_streams=max(1, len(inputs))))
    except Exception as exc:  # noqa: BLE001 - whatever one utterance raises must not end the decode
        if len(inputs) > 1:
            for inp in inputs:
                _decode_streams(recognizer, [inp], out, failed)
            return
        reason = f"utt {inputs[0].name}: cannot be decoded: {type(exc).__name__}: {exc}"
        results = [Result(inputs[0].name, "", error=reason)]
    for result in results:
        if result.ok:
            out[result.name] = result.nbest or [Alternative(result.text, 0.0)]
        else:
            failed[result.name] = " ".join(str(result.error).split())
            log.warning("skipping %s", failed[result.name])
