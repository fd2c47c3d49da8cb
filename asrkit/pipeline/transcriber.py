"""Transcriber: experiment dir -> frontend -> encoder -> search -> transcripts with timestamps."""
from __future__ import annotations

import copy
import logging
import math
import os
import time
from dataclasses import dataclass, field, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, overload

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from asrkit.audio.io import AudioError, load_audio
from asrkit.audio.vad import VadConfig, Window
from asrkit.config import ConfigError, DecodeConfig, ExperimentConfig, from_dict, to_dict
from asrkit.data.datadir import Utterance, read_data_dir
from asrkit.models.asr import AsrModel
from asrkit.pipeline.autobatch import CPU_BATCH_SECONDS, CPU_BATCH_SIZE, AutoBatch, BatchLimit
from asrkit.pipeline.inputs import AudioInput, Inputlike, as_inputs, is_one_input
from asrkit.pipeline.model_dir import load_from_dir
from asrkit.pipeline.results import Alternative, Result, Segment, Word
from asrkit.pipeline.searcher import Searcher
from asrkit.pipeline.stream import (SEGMENTERS, InputDone, SegmentDataset, SegmentItem, header_seconds, seconds_batches,
                                    segment_loader)
from asrkit.pipeline.words import TokenTime, align_tokens, group_words, snap_to_speech
from asrkit.search import Hypothesis
from asrkit.search.greedy import greedy_search
from asrkit.search.hotwords import PhraseSpec
from asrkit.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from asrkit.pipeline.export import ExportedModel
    from asrkit.pipeline.streaming import Stream, StreamingRecognizer

log = logging.getLogger("asrkit.pipeline")


@dataclass
class Transcript:
    text: str
    tokens: List[int]
    # start time (seconds) of each token: the encoder frame that emitted it (for attention/joint search, from a
    # CTC forced alignment; empty when the model has no CTC head)
    token_times: List[float] = field(default_factory=list)
    score: float = 0.0  # the search's total score (log domain)
    ctc_score: float = 0.0  # log P_ctc of the tokens (summed over alignments; the best path for greedy)


def pad_waveforms(wavs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """List of (T_i,) -> (B, T_max) zero-padded, (B,) lengths."""
    lens = torch.tensor([w.numel() for w in wavs], dtype=torch.long)
    out = torch.zeros(len(wavs), int(lens.max()) if len(wavs) else 0)
    for i, w in enumerate(wavs):
        out[i, : w.numel()] = w
    return out, lens


class _EagerAcoustic:
    """A trained AsrModel: features in the loader's workers (a CPU copy of the frontend), encoder and CTC
    head on the device."""

    def __init__(self, model: AsrModel, device: torch.device):
        self.model, self.device = model, device
        self.featurizer: Optional[nn.Module] = copy.deepcopy(model.frontend).cpu().eval()
        self.frames_per_second = 1.0 / model.frontend.frame_shift_seconds
        self.frame_shift = model.frontend.frame_shift_seconds * model.subsampling_factor

    def __call__(self, data: torch.Tensor, lens: torch.Tensor
                 ) -> Tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]:
        """(B, T, F) features -> encodings (B, T', D), lengths, CTC log-probs (B, T', V) or None."""
        enc, enc_lens = self.model.encode_features(data.to(self.device), lens.to(self.device))
        return enc, enc_lens, (self.model.ctc_log_probs(enc) if self.model.ctc is not None else None)


class _ExportedAcoustic:
    """An exported frontend + encoder + CTC head (``asrkit export``): waveforms in, log-probs out."""

    def __init__(self, exported: "ExportedModel"):
        self.exported = exported
        self.featurizer: Optional[nn.Module] = None
        self.frames_per_second = float(exported.sample_rate)
        self.frame_shift = exported.frame_shift

    def __call__(self, data: torch.Tensor, lens: torch.Tensor
                 ) -> Tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]:
        log_probs, out_lens = self.exported.log_probs(data, lens)
        return None, out_lens, log_probs


@dataclass
class TranscribeStats:
    """Where the time of :meth:`Transcriber.transcribe` went (seconds). ``load`` and ``features`` are summed
    over the loader's workers, which run beside the model: they overlap ``encoder`` and ``search``."""

    inputs: int = 0
    failed: int = 0
    segments: int = 0
    audio: float = 0.0
    wall: float = 0.0
    load: float = 0.0
    features: float = 0.0
    encoder: float = 0.0
    search: float = 0.0  # the search and the word alignment

    @property
    def rtf(self) -> float:
        return self.wall / self.audio if self.audio else 0.0

    def summary(self) -> str:
        return (f"{self.inputs} inputs ({self.failed} failed), {self.segments} segments, {self.audio:.1f} s of audio "
                f"in {self.wall:.2f} s: RTF {self.rtf:.4f}; load {self.load:.2f} s, features {self.features:.2f} s "
                f"(in loader workers), encoder {self.encoder:.2f} s, search {self.search:.2f} s")


class _AudioProgress:
    """A progress bar in seconds of audio: an input advances as its segments are decoded (to the end of the
    latest) and to its whole length when its Result is out, so a long file moves while it is decoded. The
    total comes from waveform lengths and file headers, read up front only when the bar is shown; an input
    whose length is not known before it is read (a wav.scp entry) adds its length when it is done."""

    def __init__(self, items: Sequence[AudioInput], sample_rate: int, enabled: bool):
        self.expected = [header_seconds(it, sample_rate) if enabled else 0.0 for it in items]
        self.at = [0.0] * len(items)
        self.bar = tqdm(total=sum(self.expected), desc="transcribe", unit="s", disable=not enabled,
                        dynamic_ncols=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of "
                                                       "audio [{elapsed}<{remaining}, {rate_fmt}]")

    def _advance(self, index: int, seconds: float) -> None:
        if seconds > self.at[index]:
            self.bar.update(seconds - self.at[index])
            self.at[index] = seconds

    def decoded(self, items: Sequence[SegmentItem]) -> None:
        for it in items:
            self._advance(it.index, min(it.window.end, self.expected[it.index] or it.window.end))

    def done(self, index: int, duration: float) -> None:
        if not self.expected[index]:
            self.expected[index] = duration
            self.bar.total += duration
        self._advance(index, self.expected[index])

    def close(self) -> None:
        self.bar.close()


class Transcriber:
    """Transcription with a trained model; ``decode`` picks the search (default: greedy CTC).

    :meth:`transcribe` takes files, wav.scp entries and waveforms of any length (long ones are split by
    voice activity, see :mod:`asrkit.audio.vad`) and returns :class:`~asrkit.pipeline.results.Result` objects with
    words, times and confidences; :meth:`transcribe_nbest` decodes waveforms as single utterances.
    ``segmenter``: ``vad`` (default) | ``fixed`` (overlapping windows, stitched) | ``none`` (whole input).
    ``batch_seconds``: padded audio per batch of :meth:`transcribe`; None: 120 s, or on CUDA what fills
    ``decode.gpu_memory_fraction`` of the free memory (:mod:`asrkit.pipeline.autobatch`), as ``decode.batch_size``
    null does for :meth:`data_dir_batches`.
    """

    def __init__(self, model: Optional[AsrModel], cfg: Optional[ExperimentConfig], tokenizer: Tokenizer,
                 device: str | torch.device = "cpu", decode: Optional[DecodeConfig] = None, *,
                 exported: Optional["ExportedModel"] = None, segmenter: str = "vad",
                 vad: Optional[VadConfig] = None, batch_seconds: Optional[float] = None,
                 hotwords: Optional[Sequence[PhraseSpec]] = None):
        if (model is None) == (exported is None):
            raise ValueError("give a model or an exported model, not both")
        self.model, self.cfg, self.tokenizer = model, cfg, tokenizer
        self.device = torch.device(device)
        self.decode_cfg = decode or DecodeConfig()
        self.hotwords = None if hotwords is None else list(hotwords)
        if model is not None:
            model.eval()
            self.searcher = Searcher(self.decode_cfg, model, tokenizer, self.device, self.hotwords)
            self.acoustic: Any = _EagerAcoustic(model, self.device)
            self.sample_rate = model.frontend.sample_rate
        else:
            self.searcher = Searcher(self.decode_cfg, None, tokenizer, self.device, self.hotwords)
            self.acoustic = _ExportedAcoustic(exported)
            self.sample_rate = exported.sample_rate
        # seconds per encoder frame = feature hop x subsampling factor
        self.frame_shift = self.acoustic.frame_shift
        if segmenter not in SEGMENTERS:
            raise ValueError(f"segmenter must be one of {', '.join(SEGMENTERS)}, got '{segmenter}'")
        if batch_seconds is not None and batch_seconds <= 0:
            raise ValueError(f"batch_seconds must be > 0, got {batch_seconds}")
        self.segmenter, self.vad, self.batch_seconds = segmenter, vad or VadConfig(), batch_seconds
        # batches sized from GPU memory where the user set no size; an exported model's runtime (ONNX Runtime)
        # allocates outside torch, where the probe cannot see it, so it keeps the CPU's sizes
        self.auto_batch: Optional[AutoBatch] = None
        if self.device.type == "cuda" and model is not None:
            self.auto_batch = AutoBatch.on_device(self.device, self.decode_cfg.gpu_memory_fraction)
        self.stats = TranscribeStats()

    @classmethod
    def from_dir(cls, exp_dir: str, device: str = "cpu", checkpoint: Optional[str] = None,
                 decode: Optional[DecodeConfig] = None, **options: Any) -> "Transcriber":
        model, cfg, tokenizer = load_from_dir(exp_dir, checkpoint, device)
        return cls(model, cfg, tokenizer, device, decode, **options)

    @classmethod
    def from_exported(cls, path: str, device: str = "cpu", decode: Optional[DecodeConfig] = None, *,
                      trust_torchscript: bool = False, **options: Any) -> "Transcriber":
        """A model written by ``asrkit export`` (ONNX or TorchScript): CTC searches only (greedy, ctc_prefix).
        TorchScript runs code stored in the file: it loads only with ``trust_torchscript`` (see load_exported)."""
        from asrkit.pipeline.export import load_exported

        exported = load_exported(path, device=device, num_threads=torch.get_num_threads(),
                                 trust_torchscript=trust_torchscript)
        return cls(None, None, exported.tokenizer, device, decode, exported=exported, **options)

    # -- utterances -------------------------------------------------------------------------------------------
    def _transcript(self, hyp: Hypothesis) -> Transcript:
        return Transcript(self.tokenizer.decode(hyp.tokens), hyp.tokens,
                          [round(f * self.frame_shift, 3) for f in hyp.token_frames if f >= 0],
                          hyp.score, hyp.ctc_score)

    def _encode_waveforms(self, wavs: Sequence[torch.Tensor], warps: Optional[Sequence[float]] = None
                          ) -> Tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]:
        """Encodings, lengths and CTC log-probs of ``wavs``; ``warps``: a VTLN warp factor per waveform."""
        wav, wav_lens = pad_waveforms(wavs)
        if self.model is None:
            if warps is not None:
                raise ValueError("an exported model computes its own features: it cannot warp them (decode.vtln)")
            return self.acoustic(wav.to(self.device), wav_lens.to(self.device))
        wav, wav_lens = wav.to(self.device), wav_lens.to(self.device)
        if warps is None:
            feats, feat_lens = self.model.frontend(wav, wav_lens)
        else:
            feats, feat_lens = self.model.frontend.warped(wav, wav_lens, torch.tensor(warps, dtype=torch.float32))
        return self.acoustic(feats, feat_lens)

    @torch.inference_mode()
    def transcribe_nbest(self, wavs: Sequence[torch.Tensor], warps: Optional[Sequence[float]] = None
                         ) -> List[List[Transcript]]:
        """Up to ``decode.nbest`` transcripts per mono waveform (at the model's sample rate), each decoded as one
        utterance (no segmentation), best first. ``warps``: a VTLN warp factor per waveform (asrkit.pipeline.vtln).

        A batch that runs out of GPU memory (encoder or search) is split in half and retried.
        """
        def decode(index: List[int]) -> List[List[Transcript]]:
            batch = [wavs[i] for i in index]
            return self._nbest_batch(batch) if warps is None else self._nbest_batch(batch, [warps[i] for i in index])

        return self._split_on_oom(decode, list(range(len(wavs)))) if wavs else []

    @torch.inference_mode()
    def best_path_scores(self, wavs: Sequence[torch.Tensor], warp: float) -> torch.Tensor:
        """(B,): each waveform's CTC best-path log-posterior (the sum over its encoder frames of the best token's
        log-probability) with its filterbank warped by ``warp``: the criterion of decode.vtln."""
        _, lens, log_probs = self._encode_waveforms(wavs, [warp] * len(wavs))
        if log_probs is None:
            raise ConfigError("decode.vtln: the model has no CTC head, whose best path scores the warps")
        return greedy_search(log_probs.float(), lens).ctc_scores[:, 0].cpu()

    def _nbest_batch(self, wavs: List[torch.Tensor], warps: Optional[List[float]] = None) -> List[List[Transcript]]:
        enc, enc_lens, log_probs = self._encode_waveforms(wavs, warps)
        nbest = self.searcher.search(self.model, enc, enc_lens, log_probs)
        return [[self._transcript(h) for h in hyps] or [Transcript("", [])] for hyps in nbest.to_lists()]

    def _split_on_oom(self, decode: Callable[[list], list], items: list) -> list:
        """``decode(items)``; a batch that runs out of GPU memory is decoded in halves (one item re-raises)."""
        try:
            return decode(items)
        except torch.cuda.OutOfMemoryError:
            if len(items) <= 1:
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.auto_batch is not None:
                self.auto_batch.shrink()
            log.warning("out of memory on a batch of %d: decoding it in halves", len(items))
            half = len(items) // 2
            return self._split_on_oom(decode, items[:half]) + self._split_on_oom(decode, items[half:])

    def load(self, path: str) -> torch.Tensor:
        """Read an audio file as a mono waveform at the model's rate (a file name, never a command);
        raises AudioError."""
        return load_audio(path, self.sample_rate, name=path, pipe=False)

    # -- live streams -----------------------------------------------------------------------------------------
    def streaming_recognizer(self, **options: Any) -> "StreamingRecognizer":
        """A recognizer that advances many live streams as one batch (:mod:`asrkit.pipeline.streaming`);
        ``options``: DecodeConfig keys for its streams (``chunk_ms=320``, ``mode="ctc_prefix"``), checked as
        :meth:`transcribe` checks them."""
        from asrkit.config import TransformerEncoderConfig
        from asrkit.pipeline.streaming import STREAM_KEYS, StreamingRecognizer

        if self.model is None:
            raise ValueError("streaming needs an experiment dir: an exported model has no chunk-step graph with "
                             "encoder caches yet")
        enc = self.cfg.model.encoder if self.cfg is not None else None
        trained = enc.streaming if isinstance(enc, TransformerEncoderConfig) else None
        # the streams' own keys never rebuild the search (an LM is loaded once, not per stream)
        searcher = self._call_searcher({k: v for k, v in options.items() if k not in STREAM_KEYS})
        stream_options = {k: to_dict(v) if is_dataclass(v) else v for k, v in options.items() if k in STREAM_KEYS}
        cfg = from_dict(DecodeConfig, {**to_dict(searcher.cfg), **stream_options})
        return StreamingRecognizer(self.model, self.tokenizer, searcher, self.device, self.acoustic.featurizer,
                                   trained, cfg)

    def stream(self, name: str = "stream", **options: Any) -> "Stream":
        """One live stream that decodes as its audio arrives: ``s.accept_waveform(samples)``, ``s.partial``,
        ``s.pop_finals()``, ``s.finish() -> Result``; ``options`` as for :meth:`streaming_recognizer`."""
        return self.streaming_recognizer(**options).create_stream(name, auto_decode=True)

    # -- inputs of any length ---------------------------------------------------------------------------------
    @overload
    def transcribe(self, inputs: Inputlike, *, sample_rate: Optional[int] = None, num_workers: int = 0,
                   progress: bool = False, **options: Any) -> Result: ...

    @overload
    def transcribe(self, inputs: Iterable[Inputlike], *, sample_rate: Optional[int] = None, num_workers: int = 0,
                   progress: bool = False, **options: Any) -> List[Result]: ...

    def transcribe(self, inputs: Inputlike | Iterable[Inputlike], *, sample_rate: Optional[int] = None,
                   num_workers: int = 0, progress: bool = False, **options: Any) -> Result | List[Result]:
        """Transcribe one input, or a list (any iterable) of them.

        An input is a file path (str or PathLike; read as a file, never run), a mono float waveform (a 1-D
        tensor or numpy array, at ``sample_rate`` or else the model's rate) or an
        :class:`~asrkit.pipeline.inputs.AudioInput`. One input gives one :class:`Result`, a list gives a list
        of Results in input order (as whisper and NeMo do): ``model.transcribe("a.wav").text``.

        ``options``: decoding settings for this call only (keys of :class:`~asrkit.config.DecodeConfig`, e.g.
        ``mode="ctc_prefix", beam=8, lm_weight=0.3``), checked like a decode config: an unknown key or a bad
        value raises ConfigError naming it, before any audio is read. The next call decodes as before.

        An input that cannot be read gets a Result with ``error`` set and empty text; the others are
        transcribed. ``self.stats`` says where the time went."""
        if is_one_input(inputs):
            return self.transcribe([inputs], sample_rate=sample_rate, num_workers=num_workers, progress=progress,
                                   **options)[0]
        return list(self.transcribe_iter(inputs, sample_rate=sample_rate, num_workers=num_workers,
                                         progress=progress, **options))

    def transcribe_files(self, paths: Sequence[str], **kw: Any) -> List[Result]:
        return self.transcribe(list(paths), **kw)

    def _call_searcher(self, options: Dict[str, Any]) -> Searcher:
        """The search for one call: the model's, or a new one with ``options`` (DecodeConfig keys) over the
        model's decode config (a per-call LM is loaded for that call). ``hotwords``: a file (the DecodeConfig
        key) or a list of phrases, which replaces the list given to load_model for that call."""
        if self.decode_cfg.vtln.alphas or "vtln" in options:
            # its warp is chosen per speaker of a data dir; inputs and streams have none, and must not go unwarped
            raise ConfigError("decode.vtln warps the speakers of a data dir: asrkit decode only (not transcribe, "
                              "serve or streams); leave decode.vtln.alphas empty here")
        if not options:
            return self.searcher
        hotwords = self.hotwords
        if "hotwords" in options and not isinstance(options["hotwords"], (str, os.PathLike, type(None))):
            options = dict(options)
            hotwords = list(options.pop("hotwords"))
            if not options and hotwords == self.hotwords:
                return self.searcher
        if "attention_window" in options:  # it is set on the model's decoder and would outlive the call
            raise ConfigError("decode.attention_window changes the model: give it to load_model(decode=...), "
                              "not to one call")
        cfg = from_dict(DecodeConfig, {**to_dict(self.decode_cfg), **options})
        if cfg == self.decode_cfg:  # only the list differs: the loaded LM serves this call too
            return self.searcher if hotwords == self.hotwords else self.searcher.with_hotwords(hotwords)
        return Searcher(cfg, self.model, self.tokenizer, self.device, hotwords)

    @torch.inference_mode()
    def transcribe_iter(self, inputs: Iterable[Inputlike], *, sample_rate: Optional[int] = None,
                        num_workers: int = 0, progress: bool = False, **options: Any) -> Iterator[Result]:
        """:meth:`transcribe` of a list of inputs, yielding each Result (in input order) as soon as it and those
        before it are done."""
        searcher = self._call_searcher(options)
        items = as_inputs(inputs, sample_rate)
        self.stats = stats = TranscribeStats(inputs=len(items))
        start = time.perf_counter()
        dataset = SegmentDataset(items, self.sample_rate, self.acoustic.featurizer, self.segmenter, self.vad)
        done: Dict[int, InputDone] = {}
        segments: Dict[int, Dict[int, _Decoded]] = {}
        pending: List[SegmentItem] = []
        buffered, longest, next_out = 0.0, 0.0, 0
        auto = self.auto_batch if self.batch_seconds is None else None
        limit = BatchLimit(self.batch_seconds or CPU_BATCH_SECONDS)
        bar = _AudioProgress(items, self.sample_rate, progress)

        def finished() -> Iterator[Result]:
            nonlocal next_out
            while next_out < len(items) and next_out in done and \
                    len(segments.get(next_out, {})) >= done[next_out].num_segments:
                result = self._result(items[next_out], done.pop(next_out), segments.pop(next_out, {}))
                stats.failed += not result.ok
                bar.done(next_out, result.duration)
                next_out += 1
                yield result

        for item in segment_loader(dataset, num_workers):
            if isinstance(item, InputDone):
                done[item.index] = item
                stats.load += item.load_seconds
                stats.audio += item.duration
                if item.error is not None:
                    log.info("%s", item.error)  # the Result carries it; the CLI prints it
                    pending = [p for p in pending if p.index != item.index]  # its segments read before the error
            else:
                if num_workers:  # out of the worker's shared memory, whose descriptor stays open while the
                    item.data = item.data.clone()  # tensor lives: a buffer of small segments ran out of them
                pending.append(item)
                stats.load += item.load_seconds
                stats.features += item.feature_seconds
                buffered += item.window.end - item.window.start
                seconds = item.length / self.acoustic.frames_per_second
                longest = max(longest, seconds)
                if auto is not None:  # probed on the first segment and on any longer than those probed
                    limit = auto.limit(seconds, self._segment_probe(searcher, item), searcher) or limit
            if buffered >= 2 * limit.audio(longest) or (isinstance(item, InputDone) and not pending):
                self._decode_items(searcher, pending, segments, limit)
                bar.decoded(pending)
                pending, buffered, longest = [], 0.0, 0.0
            yield from finished()
        self._decode_items(searcher, pending, segments, limit)
        bar.decoded(pending)
        yield from finished()
        bar.close()
        stats.wall = time.perf_counter() - start

    def _segment_probe(self, searcher: Searcher, item: SegmentItem) -> Callable[[float], object]:
        """Decode the first ``seconds`` of ``item`` alone (for :class:`AutoBatch`'s memory probe)."""
        def decode_one(seconds: float) -> object:
            data = item.data[: max(1, round(seconds * self.acoustic.frames_per_second))]
            enc, enc_lens, log_probs = self.acoustic(data[None], torch.tensor([data.shape[0]]))
            return searcher.search(self.model, enc, enc_lens, log_probs)

        return decode_one

    def _decode_items(self, searcher: Searcher, items: List[SegmentItem], out: Dict[int, Dict[int, "_Decoded"]],
                      limit: BatchLimit) -> None:
        def decode(batch: List[SegmentItem]) -> List[_Decoded]:
            return self._decode_batch(searcher, batch)

        for batch in seconds_batches(items, self.acoustic.frames_per_second, limit):
            for item, decoded in zip(batch, self._split_on_oom(decode, batch)):
                out.setdefault(item.index, {})[item.number] = decoded
        self.stats.segments += len(items)

    def _decode_batch(self, searcher: Searcher, batch: List[SegmentItem]) -> List["_Decoded"]:
        t0 = time.perf_counter()
        data, lens = _pad([it.data for it in batch])
        enc, enc_lens, log_probs = self.acoustic(data, lens)
        if self.device.type == "cuda":  # once per batch, so that the split of the time is honest
            torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        nbest = searcher.search(self.model, enc, enc_lens, log_probs).to_lists()
        lp = log_probs.float().cpu() if log_probs is not None else None
        lengths = enc_lens.cpu().tolist()
        segments = [self._segment(item, hyps, None if lp is None else lp[b, : lengths[b]])
                    for b, (item, hyps) in enumerate(zip(batch, nbest))]
        t2 = time.perf_counter()
        self.stats.encoder += t1 - t0
        self.stats.search += t2 - t1
        return segments

    def _segment(self, item: SegmentItem, hyps: List[Hypothesis], log_probs: Optional[torch.Tensor]) -> "_Decoded":
        w = item.window
        alternatives = [Alternative(self.tokenizer.decode(h.tokens), h.score, h.ctc_score) for h in hyps]
        tokens: List[TokenTime] = []
        if hyps and log_probs is not None:
            try:
                tokens = align_tokens(log_probs, hyps[0].tokens, self.frame_shift, offset=w.start)
            except ValueError as exc:  # an attention hypothesis longer than the CTC frames allow
                log.warning("segment %.2f-%.2f s: no word times: %s", w.start, w.end, exc)
        words = snap_to_speech(group_words(tokens, self.tokenizer.token_list, self.tokenizer.decode),
                               item.speech, item.hop, offset=w.start)
        text = alternatives[0].text if alternatives else ""
        return _Decoded(w, Segment(w.start, w.end, text, words, alternatives), tokens, item.speech, item.hop)

    def _result(self, inp: AudioInput, done: InputDone, parts: Dict[int, "_Decoded"]) -> Result:
        if done.error is not None:
            return Result(inp.name, "", duration=done.duration, error=done.error)
        decoded = [parts[i] for i in sorted(parts)]
        ordered = [d.segment for d in decoded]
        if any(a.window.end > b.window.start for a, b in zip(decoded, decoded[1:])):
            ordered = self._stitch(decoded, done.duration)
        words = [x for s in ordered for x in s.words]
        text = " ".join(s.text for s in ordered if s.text)
        nbest = ordered[0].nbest if len(ordered) == 1 else [Alternative(text, sum(
            s.nbest[0].score for s in ordered if s.nbest), sum(s.nbest[0].ctc_score for s in ordered if s.nbest))]
        return Result(inp.name, text, words, ordered, nbest, done.duration)

    def _stitch(self, decoded: List["_Decoded"], duration: float) -> List[Segment]:
        """Overlapping windows: each window owns the tokens whose middle lies between its seams, and words
        are formed from the owned tokens of all windows in time order; so a word cut by one window's edge,
        or run into its neighbour there, is read from the window that heard it whole, and none is taken
        twice. A seam goes in the middle of the longest pause in the central half of the overlap (a word
        boundary then: windows may disagree on where the space token fell), or in the overlap's middle
        where there is no pause."""
        hop = decoded[0].hop
        seams = [0.0]
        pauses = [True]
        for a, b in zip(decoded, decoded[1:]):
            seam, pause = _pause_seam(a, b.window.start, a.window.end)
            seams.append(seam)
            pauses.append(pause)
        seams.append(duration + hop)
        words: List[Word] = []
        chunk: List[TokenTime] = []
        speech = np.zeros(int(math.ceil(duration / hop)) + 1, dtype=bool)  # the owning windows' voice activity
        for i, d in enumerate(decoded):
            if pauses[i]:
                words += group_words(chunk, self.tokenizer.token_list, self.tokenizer.decode)
                chunk = []
            chunk += [t for t in d.tokens if seams[i] <= (t.start + t.end) / 2 < seams[i + 1]]
            first, last, base = (int(round(x / hop)) for x in (seams[i], min(seams[i + 1], duration), d.window.start))
            part = d.speech[max(0, first - base): max(0, last - base)]
            speech[first: first + len(part)] = part
        words += group_words(chunk, self.tokenizer.token_list, self.tokenizer.decode)
        words = snap_to_speech(words, speech, hop)
        out = []
        for i, d in enumerate(decoded):
            mine = [x for x in words if seams[i] <= (x.start + x.end) / 2 < seams[i + 1]]
            out.append(Segment(d.window.start, d.window.end, " ".join(x.text for x in mine), mine, d.segment.nbest))
        return out

    def data_dir_batches(self, data_dir: str, batch_size: Optional[int], failed: Dict[str, str],
                         max_seconds: float = math.inf) -> Iterator[Tuple[List[str], List[torch.Tensor]]]:
        """(utterance ids, waveforms) of a Kaldi data dir, longest first (less padding, memory problems show
        early), with progress; unreadable utterances are logged and recorded in ``failed``, not raised.

        ``batch_size`` (else ``decode.batch_size``) utterances a batch; when both are None, 16, or on CUDA as
        many as fill the free memory (:mod:`asrkit.pipeline.autobatch`), where an utterance over
        ``max_seconds`` (one the caller segments) is a batch of its own and sizes none."""
        utts = sorted(read_data_dir(data_dir).utterances(), key=lambda u: -(u.duration or 0.0))
        batch_size = batch_size or self.decode_cfg.batch_size
        if batch_size is None and self.auto_batch is not None:
            yield from self._memory_batches(utts, failed, self.auto_batch, max_seconds)
            return
        for chunk in tqdm(list(_chunks(utts, batch_size or CPU_BATCH_SIZE)), desc="decode", dynamic_ncols=True):
            loaded = [(u.utt, self._load_utterance(u, failed)) for u in chunk]
            yield [name for name, wav in loaded if wav is not None], [wav for _, wav in loaded if wav is not None]

    def _memory_batches(self, utts: List[Utterance], failed: Dict[str, str], auto: AutoBatch, max_seconds: float
                        ) -> Iterator[Tuple[List[str], List[torch.Tensor]]]:
        """:meth:`data_dir_batches` sized by ``auto``: an utterance joins the batch while the batch, padded to its
        longest, stays within the limit (the memory probed on the first utterance and on any longer one)."""
        names: List[str] = []
        wavs: List[torch.Tensor] = []
        longest = 0.0
        for u in tqdm(utts, desc="decode", dynamic_ncols=True):
            wav = self._load_utterance(u, failed)
            if wav is None:
                continue
            seconds = wav.numel() / self.sample_rate
            if seconds > max_seconds:  # segmented by the caller
                yield [u.utt], [wav]
                continue
            limit = auto.limit(seconds, self._waveform_probe(wav), self.searcher)
            if limit is None:  # it runs out of memory alone
                yield [u.utt], [wav]
                continue
            if names and len(names) + 1 > limit.count(max(longest, seconds)):
                yield names, wavs
                names, wavs, longest = [], [], 0.0
            names.append(u.utt)
            wavs.append(wav)
            longest = max(longest, seconds)
        if names:
            yield names, wavs

    def _waveform_probe(self, wav: torch.Tensor) -> Callable[[float], object]:
        """Decode the first ``seconds`` of ``wav`` alone (for :class:`AutoBatch`'s memory probe)."""
        return lambda seconds: self.transcribe_nbest([wav[: max(1, round(seconds * self.sample_rate))]])

    def _load_utterance(self, u: Utterance, failed: Dict[str, str]) -> Optional[torch.Tensor]:
        """The utterance's waveform, or None when it cannot be read (logged and recorded in ``failed``)."""
        try:
            return load_audio(u.source, self.sample_rate, start=u.start, end=u.end, name=u.utt)
        except AudioError as exc:
            log.warning("skipping %s", exc)
            failed[u.utt] = str(exc).replace("\n", " ")
            return None


def _pause_seam(a: "_Decoded", lo: float, hi: float) -> Tuple[float, bool]:
    """Where window ``a`` hands over to the next one, which starts at ``lo`` (``hi``: a's end): the middle of
    the longest run of non-speech frames of ``a`` in the central half of the overlap, or the overlap's
    middle when there is none (then False)."""
    quarter = (hi - lo) / 4
    first = int(round((lo + quarter - a.window.start) / a.hop))
    last = int(round((hi - quarter - a.window.start) / a.hop))
    quiet = ~a.speech[max(0, first): max(0, last)]
    best, run_start, best_len = None, None, 0
    for k, q in enumerate(list(quiet) + [False]):
        if q and run_start is None:
            run_start = k
        elif not q and run_start is not None:
            if k - run_start > best_len:
                best, best_len = (run_start + k) / 2, k - run_start
            run_start = None
    if best is None or best_len < 3:  # no pause of 30 ms or more
        return (lo + hi) / 2, False
    return a.window.start + (max(0, first) + best) * a.hop, True


@dataclass
class _Decoded:
    """A decoded segment with what stitching needs: its window, token times and voice activity."""

    window: Window
    segment: Segment
    tokens: List[TokenTime]
    speech: np.ndarray
    hop: float


def _pad(rows: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(T_i, ...) tensors -> (B, T_max, ...) zero-padded, (B,) lengths."""
    lens = torch.tensor([r.shape[0] for r in rows], dtype=torch.long)
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True), lens


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i: i + n]
