"""Endpointing rules (asrkit.pipeline.endpoint) at their boundaries, each fired rule named; the VAD's trailing
non-speech as a second opinion; decode.endpoint keys."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from asrkit.config import ConfigError, DecodeConfig, EndpointConfig, load_decode_config
from asrkit.extras import MissingExtraError
from asrkit.pipeline.endpoint import Endpointer, TrailingNonSpeech

SHIFT = 0.04  # encoder frames of 40 ms (x4 subsampling of 10 ms features)
needs_extra = pytest.mark.skipif(
    importlib.util.find_spec("silero_vad") is None or importlib.util.find_spec("onnxruntime") is None,
    reason="the vad extra (silero-vad, onnxruntime) is not installed: pip install -e '.[vad]' (make install does)")


def test_defaults_are_the_usual_rules():
    cfg = EndpointConfig()
    assert (cfg.silence_no_speech, cfg.trailing_silence, cfg.max_utterance, cfg.vad) == (2.4, 1.0, 20.0, "none")


def test_silence_with_no_speech_fires_at_its_length():
    ep = Endpointer(EndpointConfig(), SHIFT)
    assert ep.update(59, 0, 59) is None  # 2.36 s of nothing
    assert ep.update(60, 0, 60) == "silence_no_speech"  # 2.4 s
    assert ep.update(61, 0, 61) == "silence_no_speech"


def test_trailing_silence_after_speech_fires_at_its_length():
    ep = Endpointer(EndpointConfig(), SHIFT)
    assert ep.update(24, 10, 34) is None  # 0.96 s after speech
    assert ep.update(25, 10, 35) == "trailing_silence"  # 1.0 s
    assert ep.update(70, 1, 71) == "trailing_silence"  # after speech the shorter rule is the one that fires
    assert ep.update(25, 0, 25) is None  # without speech the long rule applies


def test_max_utterance_length_fires_whatever_the_silence():
    ep = Endpointer(EndpointConfig(), SHIFT)
    assert ep.update(0, 499, 499) is None  # 19.96 s of speech
    assert ep.update(0, 500, 500) == "max_utterance"  # 20 s
    assert ep.update(0, 0, 500) == "max_utterance"


def test_max_length_is_checked_first_when_two_rules_fire():
    ep = Endpointer(EndpointConfig(trailing_silence=1.0, max_utterance=2.0), SHIFT)
    assert ep.update(25, 25, 50) == "max_utterance"


@pytest.mark.parametrize("key", ["silence_no_speech", "trailing_silence", "max_utterance"])
def test_a_rule_set_to_zero_is_off(key):
    ep = Endpointer(EndpointConfig(**{key: 0.0}), SHIFT)
    frames = 10_000
    fired = {ep.update(frames, 0, frames), ep.update(frames, 5, frames + 5), ep.update(0, frames, frames)}
    assert key not in fired


def test_thresholds_in_frames_round_up_at_other_frame_shifts():
    # 1.0 s at 30 ms frames is 33.33 frames: 33 frames (0.99 s) are not enough, 34 are
    ep = Endpointer(EndpointConfig(trailing_silence=1.0), 0.03)
    assert ep.update(33, 5, 38) is None and ep.update(34, 5, 39) == "trailing_silence"
    # float noise does not push an exact multiple up: 1.2 s at 40 ms frames is 30 frames, not 31
    assert Endpointer(EndpointConfig(trailing_silence=1.2), 0.04).update(30, 5, 35) == "trailing_silence"


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="frame_shift_seconds must be > 0, got 0"):
        Endpointer(EndpointConfig(), 0.0)
    ep = Endpointer(EndpointConfig(), SHIFT)
    with pytest.raises(ValueError, match="need 0 <= blank_run_frames <= utt_frames and 0 <= speech_frames_in_utt"):
        ep.update(5, 0, 4)


@needs_extra
def test_vad_speech_holds_back_the_silence_rules():
    ep = Endpointer(EndpointConfig(vad="silero"), SHIFT)
    ep.vad_update(np.array([0.9] * 10 + [0.1] * 15), 0.032)  # 0.48 s of VAD non-speech at the end
    assert ep.update(40, 10, 50) is None  # 1.6 s of blanks, but the VAD heard speech 0.48 s ago
    ep.vad_update(np.array([0.2] * 16), 0.032)  # 0.992 s
    assert ep.update(45, 10, 55) is None
    ep.vad_update(np.array([0.2]), 0.032)  # 1.024 s
    assert ep.update(46, 10, 56) == "trailing_silence"
    ep.reset()  # a new utterance: the VAD's count starts again
    assert ep.update(30, 0, 30) is None and ep.vad_silence_seconds == 0.0


def test_vad_needs_the_option_and_is_off_by_default():
    ep = Endpointer(EndpointConfig(), SHIFT)
    with pytest.raises(ValueError, match="takes the Silero VAD's probabilities, but decode.endpoint.vad is none"):
        ep.vad_update(np.array([0.1]), 0.032)
    assert ep.update(25, 1, 26) == "trailing_silence"
    with pytest.raises(ValueError, match="decode.endpoint.vad is energy"):
        Endpointer(EndpointConfig(vad="energy"), SHIFT).vad_update(np.array([0.1]), 0.032)


def test_a_vad_that_is_never_fed_is_an_error_not_a_rule_that_never_fires():
    ep = Endpointer(EndpointConfig(vad="energy"), SHIFT)
    with pytest.raises(ValueError, match=r"decode.endpoint.vad is energy, but no audio reached the endpointer's "
                                         r"VAD: give it the stream's samples \(Endpointer.accept_audio\)"):
        ep.update(30, 0, 30)
    assert ep.update(0, 0, 500) == "max_utterance"  # the length rule needs no VAD


def test_energy_vad_follows_the_stream():
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    tone = (0.2 * np.sin(2 * np.pi * 200 * t) + 3e-4 * rng.standard_normal(16000)).astype(np.float32)
    quiet = (3e-4 * rng.standard_normal(16000)).astype(np.float32)
    ep = Endpointer(EndpointConfig(vad="energy"), SHIFT)
    ep.accept_audio(tone)
    assert ep.vad_silence_seconds == 0.0
    ep.accept_audio(quiet)  # 1 s of room tone after it: the frames that reach into the tone are speech
    assert ep.vad_silence_seconds == pytest.approx(0.97, abs=0.02)
    assert ep.update(50, 10, 60) is None  # 2 s of blanks, but the VAD heard the tone 0.97 s ago
    ep.accept_audio(quiet[:800])
    assert ep.update(50, 10, 60) == "trailing_silence"


@needs_extra
def test_accept_audio_runs_the_vad_on_the_stream():
    ep = Endpointer(EndpointConfig(vad="silero"), SHIFT)
    ep.accept_audio(np.zeros(16000 + 100, np.float32))  # 31 whole chunks of silence, 100 samples kept
    assert ep.vad_silence_seconds == pytest.approx(31 * 0.032)
    Endpointer(EndpointConfig(), SHIFT).accept_audio(np.zeros(10, np.float32))  # no VAD: nothing to do
    ep8k = Endpointer(EndpointConfig(vad="silero"), SHIFT, sample_rate=8000)
    ep8k.accept_audio(np.zeros(8000, np.float32))  # resampled to 16 kHz for the model, less the resampler's
    assert ep8k.vad_silence_seconds == pytest.approx(29 * 0.032)  # filter delay (66 ms held back)
    in_pieces = Endpointer(EndpointConfig(vad="silero"), SHIFT, sample_rate=8000)
    for i in range(0, 8000, 100):  # one signal: pieces hear what the whole heard
        in_pieces.accept_audio(np.zeros(100, np.float32))
    assert in_pieces.vad_silence_seconds == pytest.approx(29 * 0.032)


def test_without_the_extra_a_vad_endpointer_names_it(not_installed):
    not_installed("silero_vad")
    with pytest.raises(MissingExtraError, match=r"decode.endpoint.vad: silero needs silero_vad.*\[vad\]"):
        Endpointer(EndpointConfig(vad="silero"), SHIFT)


def test_trailing_non_speech_counts_from_the_last_speech_chunk():
    t = TrailingNonSpeech()
    t.update(np.array([False, False]), 0.032)
    assert t.seconds == pytest.approx(0.064)
    t.update(np.array([False, True, False, False]), 0.032)  # the count restarts after the speech frame
    assert t.seconds == pytest.approx(0.064)
    t.update(np.zeros(0, bool), 0.032)
    assert t.seconds == pytest.approx(0.064)
    t.update(np.array([True]), 0.032)
    assert t.seconds == 0.0


@needs_extra
def test_silero_probabilities_above_the_threshold_are_speech():
    ep = Endpointer(EndpointConfig(vad="silero", vad_threshold=0.5), SHIFT)
    ep.vad_update(np.array([0.4, 0.51, 0.5, 0.49]), 0.032)
    assert ep.vad_silence_seconds == pytest.approx(0.064)


def test_config_keys_and_checks(tmp_path):
    conf = tmp_path / "d.yaml"
    conf.write_text("mode: ctc_prefix\nendpoint:\n  trailing_silence: 0.8\n  vad: silero\n")
    cfg = load_decode_config(conf, ["endpoint.max_utterance=15"])
    assert cfg.endpoint == EndpointConfig(trailing_silence=0.8, max_utterance=15.0, vad="silero")
    assert DecodeConfig().endpoint == EndpointConfig()
    with pytest.raises(ConfigError, match="decode.endpoint.trailing_silence must be >= 0, got -1"):
        EndpointConfig(trailing_silence=-1)
    with pytest.raises(ConfigError, match=r"decode.endpoint.vad 'webrtc' is unknown \(choose from: none, energy, "
                                          r"silero\)"):
        EndpointConfig(vad="webrtc")
    with pytest.raises(ConfigError, match=r"decode.endpoint.vad_threshold must be in \(0, 1\), got 1.0"):
        EndpointConfig(vad_threshold=1.0)
    with pytest.raises(ConfigError, match="unknown config key 'endpoint.trailing'"):
        load_decode_config(conf, ["endpoint.trailing=1"])
