"""Endpointing of a live stream: when has the speaker finished an utterance?

The rules (``decode.endpoint``, :class:`~asrkit.config.EndpointConfig`; in the manner of Kaldi's online
endpointing and sherpa-onnx's) look at the utterance's *trailing non-speech*: the trailing blank frames of the
CTC best path, which the streaming search reports after each chunk. In order:

1. ``max_utterance``: the utterance has lasted that long, whatever it holds (bounds latency and memory);
2. ``silence_no_speech``: no speech in the utterance yet, and that much non-speech (a long quiet start is cut
   off, so that an idle stream's utterance does not grow);
3. ``trailing_silence``: speech, then that much non-speech (the end of a sentence).

The first that holds is named (``"max_utterance"``, ``"silence_no_speech"``, ``"trailing_silence"``); 0 turns
a rule off. Lengths are seconds, compared in whole frames: a rule of ``s`` seconds fires after
``ceil(s / frame_shift)`` frames (float noise aside: 1.2 s at 40 ms frames is 30 frames).

With ``vad: energy`` or ``vad: silero`` a voice-activity detector gives a second opinion: the caller gives
the endpointer the stream's audio (:meth:`Endpointer.accept_audio`, which runs the VAD: the causal energy VAD
:class:`asrkit.audio.vad.EnergyStream` per 10 ms, or the Silero model of :mod:`asrkit.audio.silero` per
32 ms), or Silero's probabilities from a stream of its own (:meth:`Endpointer.vad_update`), and the trailing
non-speech is the shorter of the two. So a silence rule fires only when the model emits blanks *and* the VAD
hears no speech (a slow speaker's long vowel, or a hesitation that the model reads as blank, does not end the
utterance). Whether the utterance holds speech is the CTC's call (a token on the best path), as in
sherpa-onnx. A VAD that is configured but never fed is an error, not a rule that can never fire.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np
import torch

from asrkit.audio import silero
from asrkit.audio.io import StreamResampler
from asrkit.audio.vad import EnergyStream
from asrkit.config import EndpointConfig

__all__ = ["Endpointer", "TrailingNonSpeech", "RULES"]

RULES = ("max_utterance", "silence_no_speech", "trailing_silence")


class TrailingNonSpeech:
    """Seconds of non-speech since the last VAD frame that was speech."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def update(self, speech: np.ndarray, hop_seconds: float) -> None:
        """Whether each of the next VAD frames (N,) is speech, each covering ``hop_seconds``."""
        found = np.flatnonzero(speech)
        if len(found):
            self.seconds = (len(speech) - 1 - int(found[-1])) * hop_seconds
        else:
            self.seconds += len(speech) * hop_seconds

    def reset(self) -> None:
        self.seconds = 0.0


class Endpointer:
    """One stream's endpoint rules (see the module docstring); ``frame_shift_seconds``: the frames the search
    counts (encoder frames, e.g. 0.04 s); ``sample_rate``: the audio's, for :meth:`accept_audio`."""

    def __init__(self, cfg: EndpointConfig, frame_shift_seconds: float, sample_rate: int = silero.SAMPLE_RATE
                 ) -> None:
        if frame_shift_seconds <= 0:
            raise ValueError(f"Endpointer: frame_shift_seconds must be > 0, got {frame_shift_seconds}")
        self.cfg, self.frame_shift, self.sample_rate = cfg, frame_shift_seconds, sample_rate
        seconds = {"max_utterance": cfg.max_utterance, "silence_no_speech": cfg.silence_no_speech,
                   "trailing_silence": cfg.trailing_silence}
        self._frames = {rule: self._to_frames(seconds[rule]) for rule in RULES}
        self._vad = TrailingNonSpeech() if cfg.vad != "none" else None
        self._vad_fed = False
        self._energy = EnergyStream(sample_rate) if cfg.vad == "energy" else None
        self._silero: Optional[silero.SileroStream] = None  # made when audio first comes (a caller may feed
        if cfg.vad == "silero":                              # probabilities of its own instead)
            silero.check_installed("decode.endpoint.vad: silero")  # the missing extra named now
        # the audio as one signal at Silero's rate; the few ms its filter holds at the input's end never decide
        # an endpoint
        self._to_silero = StreamResampler(sample_rate, silero.SAMPLE_RATE)

    def _to_frames(self, seconds: float) -> Optional[int]:
        """Frames a rule of ``seconds`` needs (None: the rule is off); rounded up, less float noise."""
        return None if seconds <= 0 else max(1, math.ceil(seconds / self.frame_shift - 1e-6))

    @property
    def vad_silence_seconds(self) -> Optional[float]:
        """The VAD's trailing non-speech in this utterance (None without a VAD)."""
        return None if self._vad is None else self._vad.seconds

    def accept_audio(self, samples: Union[np.ndarray, torch.Tensor]) -> None:
        """The stream's next samples (S,) at ``sample_rate``: the VAD's input (ignored with ``vad: none``)."""
        if self._energy is not None:
            self._feed(self._energy.accept(samples), self._energy.hop_seconds)
        elif self.cfg.vad == "silero":
            if self._silero is None:
                self._silero = silero.SileroStream("decode.endpoint.vad: silero")
            x = self._to_silero(torch.as_tensor(samples).float())
            self.vad_update(self._silero.accept(x), silero.HOP_SECONDS)

    def vad_update(self, probs: np.ndarray, hop_seconds: float) -> None:
        """Silero's speech probabilities (N,) of the audio that arrived, ``hop_seconds`` each (0.032); a chunk
        above ``decode.endpoint.vad_threshold`` is speech."""
        if self.cfg.vad != "silero":
            raise ValueError(f"Endpointer.vad_update takes the Silero VAD's probabilities, but decode.endpoint.vad "
                             f"is {self.cfg.vad}")
        self._feed(np.asarray(probs) > self.cfg.vad_threshold, hop_seconds)

    def _feed(self, speech: np.ndarray, hop_seconds: float) -> None:
        self._vad_fed = True
        self._vad.update(speech, hop_seconds)

    def update(self, blank_run_frames: int, speech_frames_in_utt: int, utt_frames: int) -> Optional[str]:
        """After a chunk: the trailing blank frames of the best path, the utterance's frames before them that
        hold speech (0: no token yet) and its length in frames -> the rule that fires, or None."""
        if not 0 <= blank_run_frames <= utt_frames or speech_frames_in_utt < 0:
            raise ValueError(f"Endpointer.update: need 0 <= blank_run_frames <= utt_frames and 0 <= "
                             f"speech_frames_in_utt, got {blank_run_frames}, {speech_frames_in_utt}, {utt_frames}")
        limit = self._frames["max_utterance"]
        if limit is not None and utt_frames >= limit:
            return "max_utterance"
        silence = blank_run_frames
        if self._vad is not None:  # both must hear no speech
            if not self._vad_fed:
                raise ValueError(f"decode.endpoint.vad is {self.cfg.vad}, but no audio reached the endpointer's "
                                 f"VAD: give it the stream's samples (Endpointer.accept_audio)")
            silence = min(silence, int(self._vad.seconds / self.frame_shift + 1e-6))
        rule = "trailing_silence" if speech_frames_in_utt > 0 else "silence_no_speech"
        limit = self._frames[rule]
        return rule if limit is not None and silence >= limit else None

    def reset(self) -> None:
        """A new utterance (after an endpoint): the VAD's count of trailing non-speech starts again (the VAD
        itself goes on: its state and noise level belong to the audio, not to the utterance)."""
        if self._vad is not None:
            self._vad.reset()
