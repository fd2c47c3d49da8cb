"""The causal energy VAD for live streams (asrkit.audio.vad.EnergyStream): the offline rule over the past only."""
from __future__ import annotations

import numpy as np
import pytest

from asrkit.audio.vad import EnergyStream, VadConfig, energy_threshold, frame_energies

SR = 16000


def _scene(seed: int = 0) -> np.ndarray:
    """1 s of room tone (-70 dBFS), 1 s of a loud harmonic tone, 1 s of room tone."""
    rng = np.random.default_rng(seed)
    t = np.arange(SR) / SR
    tone = 0.2 * sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 5))
    quiet = 3e-4 * rng.standard_normal(SR)
    return np.concatenate([quiet, tone + 3e-4 * rng.standard_normal(SR), quiet]).astype(np.float32)


def test_all_at_once_equals_the_offline_rule_on_the_complete_frames():
    wav = _scene()
    cfg = VadConfig(noise_window=0.0)
    stream = EnergyStream(SR, cfg)
    speech = stream.accept(wav)
    energies = frame_energies(wav, SR, cfg)
    n = (len(wav) - 400) // 160 + 1  # the frames whose samples have all arrived
    assert len(speech) == n
    np.testing.assert_array_equal(speech, (energies > energy_threshold(energies, cfg))[:n])


def test_pieces_give_the_same_frames_and_speech_is_found_as_it_comes():
    wav = _scene(1)
    stream = EnergyStream(SR)
    out = [stream.accept(wav[a:a + 1234]) for a in range(0, len(wav), 1234)]
    assert sum(len(o) for o in out) == (len(wav) - 400) // 160 + 1
    speech = np.concatenate(out)
    assert not speech[:90].any()  # room tone before any loud frame: its own spread is under 12 dB
    assert speech[105:195].all()  # the tone
    assert not speech[215:290].any()  # room tone again, now under the tone's level by far
    assert stream.hop_seconds == pytest.approx(0.01)


def test_history_is_bounded_by_the_noise_window():
    stream = EnergyStream(SR, VadConfig(noise_window=1.0))
    stream.accept(np.zeros(5 * SR, np.float32))
    assert len(stream._history) == 100
