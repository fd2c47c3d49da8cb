"""Live recognition: audio in pieces of any size -> partial results after every chunk, a final result at each
endpoint; many streams advanced as one batch.

``model = asrkit.load_model(dir); s = model.stream(); s.accept_waveform(samples); s.partial; s.pop_finals();
s.finish()``. A :class:`StreamingRecognizer` owns the model's parts; each :class:`Stream` owns its state:

1. **Frontend**: :class:`~asrkit.audio.feature_stream.FeatureStream` turns each piece of audio into the feature
   frames it completes (the same frames as the offline frontend on the whole audio; leftover samples kept).
2. **Encoder**: when a stream holds the feature frames of its next chunk (``decode.chunk_ms`` of audio;
   ``cache.input_frames_needed()`` frames), :meth:`StreamingRecognizer.step` stacks the caches of every ready
   stream (``EncoderCache.stack``), runs the encoder's chunk step once for the batch, and unstacks them: each
   stream gets ``chunk_frames`` encoder frames, attending ``decode.left_chunks`` chunks back.
3. **Search**: the CTC head's log-probabilities of the batch advance every stream's resumable search state in
   one call (:mod:`asrkit.pipeline.streaming_search`); each stream's best prefix is its :attr:`Stream.partial`.
4. **Endpoint**: :class:`~asrkit.pipeline.endpoint.Endpointer` reads the trailing blank frames of the best path
   (``decode.endpoint.*`` rules; with ``decode.endpoint.vad: energy | silero`` also a VAD's trailing non-speech,
   the VAD hearing each piece of audio as it arrives). When a rule fires, or the input ends, the utterance's
   final N-best is taken (end-of-sentence LM scores added), rescored by the attention decoder in ``rescore``
   mode (U2's two-pass), and its best hypothesis aligned to the utterance's CTC frames for word times and confidences
   (:mod:`asrkit.pipeline.words`): a :class:`~asrkit.pipeline.results.Segment`, as ``transcribe`` gives.

**At an endpoint** the stream starts a new utterance: a new search state, a new endpointer count, and a new
encoder cache (WeNet's policy: each utterance is encoded as if it began there, so positions stay within what
training saw and no state grows with the stream; the encoder's unfinished input frames - less than one
subsampling window, in the silence that fired the rule - are dropped). The frontend goes on
(``FeatureStream.reset_utterance`` restarts its running normalisation). Memory is bounded by one utterance's
frames (``decode.endpoint``'s maximum length) plus the left context: flat over a stream of any length.

Times are seconds from the start of the stream: an utterance starts at the first feature frame it encoded,
encoder frame k of it at ``start + k * frame_shift``. Word times are the CTC alignment's token spans (not
widened to the voice activity as offline transcription widens them). An utterance with no words gives no
final.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from asrkit.audio.feature_stream import FeatureStream
from asrkit.audio.io import StreamResampler
from asrkit.audio.vad import VadConfig, energy_threshold, frame_energies, frame_geometry
from asrkit.config import ConfigError, DecodeConfig, EncoderStreamingConfig
from asrkit.models.asr import AsrModel
from asrkit.nets.stream_cache import EncoderCache
from asrkit.pipeline.endpoint import Endpointer
from asrkit.pipeline.results import Alternative, Result, Segment, Word
from asrkit.pipeline.searcher import Searcher
from asrkit.pipeline.stream_hotwords import StreamHotwords, unshared_reason
from asrkit.pipeline.streaming_search import build_stream_search, second_pass
from asrkit.pipeline.words import align_tokens, group_words, snap_to_speech
from asrkit.search import Hypothesis
from asrkit.search.hotwords import HOTWORDS, PhraseSpec
from asrkit.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class Partial:
    """The best hypothesis of a stream's current utterance so far."""

    text: str
    tokens: List[int] = field(default_factory=list)
    token_times: List[float] = field(default_factory=list)  # seconds in the stream: each token's emitting frame
    start: float = 0.0  # where the utterance began (seconds in the stream)
    end: float = 0.0  # how much of the stream's audio it heard: the end of the last feature frame encoded (seconds)


@dataclass
class StreamingStats:
    """Where a recognizer's time went (seconds) and how much it did."""

    chunks: int = 0  # stream chunks encoded (a batch of B streams counts B)
    ticks: int = 0  # batched encoder calls
    finals: int = 0
    encoder: float = 0.0  # encoder chunk steps and the CTC head
    search: float = 0.0  # search advances and partials
    final: float = 0.0  # end-of-utterance work: final N-best, rescoring, alignment


STREAM_KEYS = ("chunk_ms", "left_chunks", "endpoint")  # DecodeConfig keys of the streams, not of the search
DEFAULT_CHUNK_MS = 640  # a stream's chunk where neither the decode config nor the model's training names one


def chunk_frames(chunk_ms: int, frame_shift: float) -> int:
    """Encoder frames per chunk of ``chunk_ms`` milliseconds; ConfigError unless a whole positive number."""
    frame_ms = frame_shift * 1000.0
    frames = chunk_ms / frame_ms
    if chunk_ms <= 0 or abs(frames - round(frames)) > 1e-6:
        raise ConfigError(f"decode.chunk_ms must be a positive multiple of the encoder frame ({frame_ms:g} ms: the "
                          f"feature hop x the subsampling), got {chunk_ms}")
    return int(round(frames))


class StreamingRecognizer:
    """Advances many :class:`Stream` s as one batch per chunk; see the module docstring.

    ``featurizer``: a CPU copy of the model's frontend (eval mode), which each stream's FeatureStream runs;
    ``searcher``: the decode config's search (its LM and other scorers are shared by every stream);
    ``trained``: the model's ``model.encoder.streaming`` keys, whose chunk and left context a stream takes where
    ``decode.chunk_ms`` / ``decode.left_chunks`` are null (a model trained with full context only: 640 ms, all);
    ``cfg``: the decode config whose streaming keys (:data:`STREAM_KEYS`) the streams take (default: the
    searcher's; its search keys must be the searcher's)."""

    def __init__(self, model: AsrModel, tokenizer: Tokenizer, searcher: Searcher, device: torch.device,
                 featurizer: nn.Module, trained: Optional[EncoderStreamingConfig] = None,
                 cfg: Optional[DecodeConfig] = None):
        if model.ctc is None:
            raise ConfigError("streaming needs a CTC head (the first pass is a CTC search); this model has none")
        self.model, self.tokenizer, self.device, self.featurizer = model, tokenizer, torch.device(device), featurizer
        self.searcher = searcher
        self.cfg: DecodeConfig = cfg or searcher.cfg
        self.hop = model.frontend.frame_shift_seconds
        self.frame_shift = self.hop * model.subsampling_factor  # seconds per encoder frame
        self.sample_rate: int = model.frontend.sample_rate
        trained = trained or EncoderStreamingConfig()
        chunk_ms = self.cfg.chunk_ms
        if chunk_ms is None:  # the model's training chunk, else the default
            chunk_ms = round(trained.chunk_frames * self.frame_shift * 1000) or DEFAULT_CHUNK_MS
        self.chunk_frames = chunk_frames(chunk_ms, self.frame_shift)
        self.left_chunks = trained.left_chunks if self.cfg.left_chunks is None else self.cfg.left_chunks
        if self.left_chunks < -1:
            raise ConfigError(f"decode.left_chunks must be >= 0, or -1 for all, got {self.left_chunks}")
        # streams with their own hotword lists share this search (None: they cannot, see unshared_reason)
        self.hotword_lists = StreamHotwords(searcher) if unshared_reason(searcher) is None else None
        self._streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()  # the live streams, whose lists are in use
        # the union joins the search with the server's list, else with the first stream's own list (add_scorer)
        fusion = searcher.fusion if self.hotword_lists is None or searcher.hotwords is None \
            else self.hotword_lists.fusion
        self.search = build_stream_search(self.cfg, fusion, self.device)
        self.vad = VadConfig()  # the voice activity that word times are widened to (as offline)
        self.vad_hop = frame_geometry(self.sample_rate, self.vad)[1] / self.sample_rate
        self.new_cache()  # an encoder that cannot stream raises its ValueError now, before any audio
        self.stats = StreamingStats()

    # -- streams ----------------------------------------------------------------------------------------------
    def create_stream(self, name: str = "stream", auto_decode: bool = False,
                      hotwords: Optional[Sequence[PhraseSpec]] = None) -> "Stream":
        """A new stream. ``auto_decode``: each :meth:`Stream.accept_waveform` decodes what it completes (one
        stream alone); else the caller advances its streams with :meth:`decode_streams` / :meth:`step`.
        ``hotwords``: the stream's own phrases (or (phrase, weight factor) pairs) beside ``decode.hotwords``'s,
        in place of the recognizer's list; streams of different lists share this recognizer and its batches
        (:mod:`asrkit.pipeline.stream_hotwords`). ConfigError where the search cannot (a greedy search, a word
        LM or lexicon: a recognizer of its own, ``streaming_recognizer(hotwords=...)``) or where the model's
        units spell none of the phrases."""
        index = None
        if hotwords is not None:
            if self.hotword_lists is None:
                raise ConfigError(f"stream {name}: own hotwords: {unshared_reason(self.searcher)}")
            index = self._compact_hotwords(self.hotword_lists.list_of(hotwords))
            if HOTWORDS not in self.search.scorers:  # the first list: streams without one score 0 in list 0
                self.search.add_scorer(HOTWORDS, self.hotword_lists.union.scorer, self.cfg.hotword_weight,
                                       [s._state for s in self._streams if not s.done], self.hotword_lists.union.view(0))
        stream = Stream(self, name, auto_decode, index)
        self._streams.add(stream)
        return stream

    def _compact_hotwords(self, joined: int) -> int:
        """After list ``joined`` joined: the union compacted to it and the lists of the live streams when the
        others are most of it (:meth:`StreamHotwords.compact_if_sparse`), the live torch-loop states moved with
        it; returns the joined list's index after."""
        assert self.hotword_lists is not None
        live = [s for s in self._streams if not s.done]
        lists = self.hotword_lists
        done = lists.compact_if_sparse({joined} | {s._hotword_list for s in live if s._hotword_list is not None})
        if done is None:
            return joined
        moved, state_map = done
        for s in live:
            if s._hotword_list is not None:
                s._hotword_list = moved[s._hotword_list]
        self.search.map_scorer_state([s._state for s in live], HOTWORDS,
                                     lambda state: lists.union.move_rows(state, state_map))
        return moved[joined]

    def new_cache(self) -> EncoderCache:
        return self.model.encoder.init_stream(1, self.device, self.chunk_frames, self.left_chunks)

    def is_ready(self, stream: "Stream") -> bool:
        """Whether ``stream`` holds the frames of its next chunk (or its input ended and is not flushed)."""
        return stream._next_chunk() is not None

    @torch.inference_mode()
    def decode_streams(self, streams: Sequence["Stream"]) -> None:
        """Step until none of ``streams`` is ready: every chunk their audio completes is decoded."""
        while self.step(streams):
            pass

    @torch.inference_mode()
    def step(self, streams: Sequence["Stream"]) -> int:
        """One chunk of every ready stream, as one batch per chunk shape (a stream's first chunk needs more
        feature frames than the next ones; a final chunk takes what is left); returns the streams advanced.
        Streams batch when their chunks take the same frames and their caches hold the same leftover input (final
        chunks of equal length can differ there: a stream fresh after an endpoint holds none)."""
        groups: Dict[Tuple[int, bool, int], List[Stream]] = {}
        for s in streams:
            key = s._next_chunk()
            if key is not None:
                groups.setdefault((*key, s._cache.input_frames_needed()), []).append(s)
        for (frames, final, _), group in groups.items():
            self._advance(group, frames, final)
        return sum(len(g) for g in groups.values())

    def _advance(self, streams: List["Stream"], frames: int, final: bool) -> None:
        t0 = time.perf_counter()
        if final and frames == 0:  # a stream whose encoder got nothing since its last endpoint has nothing to end
            for s in streams:
                s._flushed = s._flushed or s._fresh
            streams = [s for s in streams if not s._fresh]
            if not streams:
                return
        feats = torch.stack([s._take(frames) for s in streams]).to(self.device)  # (B, t, F)
        caches = [s._cache for s in streams]
        cache = caches[0] if len(caches) == 1 else EncoderCache.stack(caches)
        enc, cache = self.model.encoder.forward_chunk(feats, cache, ctc_head=self.model.ctc, final=final)
        for s, c in zip(streams, [cache] if len(streams) == 1 else cache.unstack()):
            s._cache, s._fresh = c, False
        log_probs = self.model.ctc_log_probs(enc)  # (B, n, V)
        t1 = time.perf_counter()
        n = enc.shape[1]
        states = [s._state for s in streams]
        if n:
            self.search.advance(states, log_probs, torch.full((len(streams),), n, dtype=torch.long))
            lp = log_probs.float().cpu()
            for b, s in enumerate(streams):
                s._log_probs.append(lp[b])
                if self.cfg.mode == "rescore":
                    s._encodings.append(enc[b])
                s._utt_frames += n
        for s, hyp in zip(streams, self.search.partial(states)):
            s._set_partial(hyp)
        ended = [s for s, run in zip(streams, self.search.blank_run(states)) if final or s._endpoint(run)]
        t2 = time.perf_counter()
        if ended:
            self._finish_utterances(ended, final)
        if final:
            for s in streams:
                s._flushed = True
        self.stats.ticks += 1
        self.stats.chunks += len(streams)
        self.stats.encoder += t1 - t0
        self.stats.search += t2 - t1
        self.stats.final += time.perf_counter() - t2

    def _finish_utterances(self, streams: List["Stream"], final: bool) -> None:
        """The final N-best of each stream's utterance (rescored in two-pass mode) -> its final Segment; then
        each stream begins a new utterance (``final``: the streams' input ended)."""
        nbest = self.search.finish([s._state for s in streams])
        score_tokens = self.model.score_tokens if self.model.decoder is not None else None
        if self.cfg.mode == "rescore":
            empty = torch.zeros(0, self.model.encoder.output_dim, device=self.device)
            nbest = second_pass(self.cfg, nbest, [torch.cat(s._encodings) if s._encodings else empty
                                                  for s in streams], score_tokens)
        for s, hyps in zip(streams, nbest.to_lists()):
            s._close_utterance(hyps, final)
        self.stats.finals += len(streams)

    # -- results ----------------------------------------------------------------------------------------------
    def segment(self, hyps: List[Hypothesis], log_probs: torch.Tensor, start: float, end: float,
                audio: torch.Tensor) -> Segment:
        """An utterance's Segment: its N-best ``hyps`` (best first), words aligned to its CTC ``log_probs``
        (T, V) from ``start`` seconds and widened to the voice activity of its ``audio`` (samples from
        ``start``), as offline transcription widens them."""
        alternatives = [Alternative(self.tokenizer.decode(h.tokens), h.score, h.ctc_score) for h in hyps]
        words: List[Word] = []
        if hyps and hyps[0].tokens:
            try:
                tokens = align_tokens(log_probs, hyps[0].tokens, self.frame_shift, offset=start)
            except ValueError:  # a rescored hypothesis longer than the CTC frames allow: no word times
                tokens = []
            words = group_words(tokens, self.tokenizer.token_list, self.tokenizer.decode)
            if words and audio.numel():
                energies = frame_energies(audio, self.sample_rate, self.vad)
                words = snap_to_speech(words, energies > energy_threshold(energies, self.vad), self.vad_hop,
                                       offset=start)
        return Segment(round(start, 3), round(end, 3), alternatives[0].text if alternatives else "", words,
                       alternatives)


class Stream:
    """One live audio stream (see the module docstring); made by :meth:`StreamingRecognizer.create_stream` or
    ``Transcriber.stream``."""

    def __init__(self, recognizer: StreamingRecognizer, name: str, auto_decode: bool,
                 hotword_list: Optional[int] = None):
        self.recognizer, self.name, self.auto_decode = recognizer, name, auto_decode
        self._hotword_list = hotword_list  # its own list in the recognizer's union (None: the recognizer's)
        self._features = FeatureStream(recognizer.featurizer)
        self._rate: Optional[int] = None
        # another rate than the model's goes through one resampler for the whole stream: resampling each piece
        # alone puts an edge error at every piece boundary (a 44.1 kHz sine in 10 ms pieces: 31 dB SNR, not 132)
        self._resampler: Optional[StreamResampler] = None
        self._samples = 0  # samples accepted (at the model's rate)
        self._pending: List[torch.Tensor] = []  # feature frames not yet encoded, (t_i, F) each
        self._pending_frames = 0
        self._fed = 0  # feature frames given to the encoder since the stream began
        self._audio: List[torch.Tensor] = []  # the samples from the current utterance's start (for word times)
        self._audio_start = 0  # the sample those begin at
        self._input_done = self._flushed = False
        self._finals: List[Segment] = []
        self._popped = 0
        self._endpointer = Endpointer(recognizer.cfg.endpoint, recognizer.frame_shift, recognizer.sample_rate)
        self._begin_utterance()

    def _begin_utterance(self) -> None:
        rec = self.recognizer
        self._cache: EncoderCache = rec.new_cache()
        self._fresh = True  # no frame fed to this cache yet
        lists = rec.hotword_lists
        if lists is None or HOTWORDS not in rec.search.scorers:
            self._state: Any = rec.search.new_state()
        else:
            own = lists.default if self._hotword_list is None else self._hotword_list
            self._state = rec.search.new_state({HOTWORDS: lists.union.view(own)})
        self._endpointer.reset()
        self._utt_start = self._fed * rec.hop  # seconds: the first feature frame this utterance encodes
        first = int(round(self._utt_start * rec.sample_rate))
        if first > self._audio_start:  # the samples of earlier utterances are no longer needed
            audio = torch.cat(self._audio) if self._audio else torch.zeros(0)
            self._audio = [audio[first - self._audio_start:]]
            self._audio_start = first
        self._utt_frames = 0
        self._log_probs: List[torch.Tensor] = []  # (n, V) per chunk, on the CPU: for word times
        self._encodings: List[torch.Tensor] = []  # (n, D) per chunk (rescore mode): the decoder's memory
        self._partial = Partial("", start=round(self._utt_start, 3), end=self._heard())

    # -- input ------------------------------------------------------------------------------------------------
    def accept_waveform(self, samples: torch.Tensor | np.ndarray, sample_rate: Optional[int] = None) -> None:
        """Append mono float samples in [-1, 1] (a 1-D tensor or numpy array) at ``sample_rate`` (default: the
        model's; a stream keeps the rate of its first piece, and another rate is resampled as one signal, the
        resampler holding back the few milliseconds its filter needs until the next piece or the input's end).
        With ``auto_decode`` every chunk they complete is decoded now."""
        if self._input_done:
            raise ValueError(f"stream {self.name}: accept_waveform after input_finished()/finish()")
        x = torch.from_numpy(np.ascontiguousarray(samples)) if isinstance(samples, np.ndarray) else samples
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"stream {self.name}: samples must be a 1-D float tensor or numpy array, got "
                             f"{type(samples).__name__}")
        if x.dim() != 1 or not x.is_floating_point():
            raise ValueError(f"stream {self.name}: samples must be a 1-D float array in [-1, 1], got {x.dtype} of "
                             f"shape {tuple(x.shape)} (divide integer PCM by its full scale, e.g. 32768)")
        rate = sample_rate or self.recognizer.sample_rate
        if rate <= 0:
            raise ValueError(f"stream {self.name}: sample_rate must be > 0, got {rate}")
        if self._rate is not None and rate != self._rate:
            raise ValueError(f"stream {self.name}: sample_rate {rate} differs from the stream's {self._rate}")
        self._rate = rate
        x = x.detach().float().cpu()
        if rate != self.recognizer.sample_rate:
            if self._resampler is None:
                self._resampler = StreamResampler(rate, self.recognizer.sample_rate)
            x = self._resampler(x)
        self._accept_resampled(x)
        if self.auto_decode:
            self.recognizer.decode_streams([self])

    def _accept_resampled(self, x: torch.Tensor) -> None:
        """Samples at the model's rate into the stream: kept for word times, heard by the VAD, featurized."""
        self._samples += x.numel()
        self._audio.append(x.clone())  # x may be a view of the caller's buffer, which it may fill again
        self._endpointer.accept_audio(x)  # the VAD of decode.endpoint.vad hears the audio as it arrives
        feats = self._features.accept(x)
        if feats.shape[0]:
            self._pending.append(feats)
            self._pending_frames += feats.shape[0]

    def input_finished(self) -> None:
        """No more audio: the next decode encodes what is left and ends the last utterance."""
        if not self._input_done and self._resampler is not None:  # the samples the resampler held back
            self._accept_resampled(self._resampler.flush())
        self._input_done = True

    def finish(self) -> Result:
        """End the input, decode what is left, and return the stream's :class:`Result`."""
        self.input_finished()
        self.recognizer.decode_streams([self])
        return self.result()

    # -- output -----------------------------------------------------------------------------------------------
    @property
    def partial(self) -> str:
        """The text of the current utterance so far (empty right after an endpoint)."""
        return self._partial.text

    @property
    def partial_result(self) -> Partial:
        return self._partial

    @property
    def finals(self) -> List[Segment]:
        """Every final so far, one Segment per utterance, in time order."""
        return list(self._finals)

    def pop_finals(self) -> List[Segment]:
        """The finals that came since the last call."""
        out = self._finals[self._popped:]
        self._popped = len(self._finals)
        return out

    @property
    def duration(self) -> float:
        """Seconds of audio accepted."""
        return self._samples / self.recognizer.sample_rate

    @property
    def done(self) -> bool:
        """The input ended and everything was decoded."""
        return self._flushed

    def result(self) -> Result:
        """The finals so far as one :class:`Result` (as ``transcribe`` returns for a recording)."""
        segments = self.finals
        words = [w for s in segments for w in s.words]
        text = " ".join(s.text for s in segments if s.text)
        firsts = [s.nbest[0] for s in segments if s.nbest]  # several utterances: the joined 1-best, as transcribe
        nbest = segments[0].nbest if len(segments) == 1 else [
            Alternative(text, sum((a.score for a in firsts), 0.0), sum((a.ctc_score for a in firsts), 0.0))]
        return Result(self.name, text, words, segments, nbest, round(self.duration, 3))

    # -- the recognizer's side ----------------------------------------------------------------------------------
    def _next_chunk(self) -> Optional[Tuple[int, bool]]:
        """(feature frames, final) of the next chunk, or None when the stream must wait for audio."""
        if self._flushed:
            return None
        need = self._cache.input_frames_needed()
        if self._pending_frames >= need:
            return need, False
        return (self._pending_frames, True) if self._input_done else None

    def _take(self, frames: int) -> torch.Tensor:
        """The next ``frames`` pending feature frames, (frames, F)."""
        if not self._pending:  # a final flush right after a chunk that took every frame
            return torch.zeros(0, self.recognizer.featurizer.output_dim)
        pending = torch.cat(self._pending) if len(self._pending) != 1 else self._pending[0]
        out, rest = pending[:frames], pending[frames:]
        self._pending = [rest] if rest.shape[0] else []
        self._pending_frames -= frames
        self._fed += frames
        return out

    def _set_partial(self, hyp: Hypothesis) -> None:
        rec = self.recognizer
        times = [round(self._utt_start + f * rec.frame_shift, 3) for f in hyp.token_frames if f >= 0]
        self._partial = Partial(rec.tokenizer.decode(hyp.tokens), list(hyp.tokens), times, round(self._utt_start, 3),
                                self._heard())

    def _heard(self) -> float:
        """Seconds of audio the encoder's input frames span (frame i covers samples [i*hop, i*hop + win)): a
        partial needs exactly this much of the stream (a server's latency is measured from its last sample)."""
        if not self._fed:
            return 0.0
        extractor = self.recognizer.featurizer.extractor
        return ((self._fed - 1) * extractor.hop_length + extractor.win_length) / self.recognizer.sample_rate

    def _endpoint(self, blank_run: int) -> bool:
        """Whether an endpoint rule fires after this chunk (``blank_run``: trailing blank frames of the best
        path)."""
        return self._endpointer.update(blank_run, self._utt_frames - blank_run, self._utt_frames) is not None

    def _close_utterance(self, hyps: List[Hypothesis], final: bool) -> None:
        """The utterance's final (if it has words): it ends where its encoder frames end, or with the input."""
        rec = self.recognizer
        end = self.duration if final else min(self._utt_start + self._utt_frames * rec.frame_shift, self.duration)
        if hyps and hyps[0].tokens:
            log_probs = torch.cat(self._log_probs)
            audio = torch.cat(self._audio)[: max(0, int(round(end * rec.sample_rate)) - self._audio_start)]
            self._finals.append(rec.segment(hyps, log_probs, self._utt_start, end, audio))
        self._features.reset_utterance()
        self._begin_utterance()
