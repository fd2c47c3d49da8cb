"""The learned VAD (asrkit.audio.silero, the vad extra): on espeak-ng speech against digital silence and white noise,
against the silero-vad package's own wrapper, a stream in pieces equal to the whole, segmentation through
plan_segments and transcribe --segmenter silero; the missing extra named."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio import silero
from asrkit.audio.vad import plan_segments
from asrkit.extras import MissingExtraError
from asrkit.pipeline.stream import SegmentDataset

SR = 16000
HAVE_EXTRA = importlib.util.find_spec("silero_vad") is not None and importlib.util.find_spec("onnxruntime") is not None
needs_extra = pytest.mark.skipif(not HAVE_EXTRA, reason="the vad extra (silero-vad, onnxruntime) is not installed: "
                                                        "pip install -e '.[vad]' (make install installs it)")


@pytest.fixture(scope="module")
def scene(tiny_corpus):
    """1 s silence, speech, 1.5 s white noise (-30 dBFS), 1 s silence, speech, 1 s silence; the speech spans."""
    utts = sorted((tiny_corpus / "test" / "wav").glob("*.flac"))
    speech = []
    for path in utts[:2]:
        wav, rate = sf.read(path, dtype="float32")
        assert rate == SR
        speech.append(wav)
    noise = 0.03 * np.random.default_rng(0).standard_normal(int(1.5 * SR)).astype(np.float32)
    parts = [np.zeros(SR, np.float32), speech[0], noise, np.zeros(SR, np.float32), speech[1], np.zeros(SR, np.float32)]
    starts = np.cumsum([0] + [len(p) for p in parts]) / SR
    spans = {"speech": [(starts[1], starts[2]), (starts[4], starts[5])], "noise": (starts[2], starts[3]),
             "silence": [(0.0, starts[1]), (starts[3], starts[4])]}
    return np.concatenate(parts), spans


def _chunks(span, margin: float = 0.2) -> slice:
    return slice(math.ceil((span[0] + margin) / silero.HOP_SECONDS), int((span[1] - margin) / silero.HOP_SECONDS))


@needs_extra
def test_speech_is_told_from_silence_and_white_noise(scene):
    wav, spans = scene
    probs = silero.speech_probabilities(wav, SR)
    assert len(probs) == math.ceil(len(wav) / silero.CHUNK)
    for span in spans["speech"]:
        p = probs[_chunks(span, 0.1)]
        assert (p > 0.5).mean() > 0.6 and p.max() > 0.9, p.round(2)
    assert (probs[_chunks(spans["noise"])] > 0.5).mean() < 0.1
    for span in spans["silence"]:
        assert probs[_chunks(span)].max() < 0.1


@needs_extra
def test_segments_hold_the_speech_and_leave_the_noise_out_where_energy_does_not(scene):
    wav, spans = scene
    windows = plan_segments(wav, SR, mode="silero")
    assert len(windows) == 2
    for w, (start, end) in zip(windows, spans["speech"]):
        assert w.start <= start + 0.3 and w.end >= end - 0.3  # espeak's own edges are quiet
        assert w.start >= start - 0.3 and w.end <= end + 0.5  # the model's state lags a little into the noise
    middle = sum(spans["noise"]) / 2
    assert not any(w.start < middle < w.end for w in windows)
    assert any(w.start < middle < w.end for w in plan_segments(wav, SR, mode="energy"))  # energy takes noise
    assert plan_segments(np.zeros(SR, np.float32), SR, mode="silero") == []


@needs_extra
def test_a_stream_in_pieces_equals_the_whole_and_silero_vads_own_wrapper(scene):
    wav = scene[0][: 3 * SR + 100]
    whole = silero.speech_probabilities(wav, SR)
    stream = silero.SileroStream()
    rng = np.random.default_rng(1)
    edges = np.cumsum(rng.choice([1, 100, 511, 512, 513, 4000], size=200))
    edges = np.concatenate([[0], edges[edges < len(wav)], [len(wav)]])
    parts = [stream.accept(torch.from_numpy(wav[a:b])) for a, b in zip(edges[:-1], edges[1:])]
    streamed = np.concatenate(parts + [stream.flush()])
    np.testing.assert_array_equal(streamed, whole)
    threads = torch.get_num_threads()
    try:
        from silero_vad.utils_vad import OnnxWrapper  # the package's import sets torch's thread count
    finally:
        torch.set_num_threads(threads)
    ref = OnnxWrapper(silero.model_path(), force_onnx_cpu=True).audio_forward(torch.from_numpy(wav), SR)
    np.testing.assert_allclose(whole, ref[0].numpy(), atol=1e-5)


@needs_extra
def test_a_file_is_read_in_blocks_and_other_rates_are_resampled(scene, tmp_path):
    wav = scene[0]
    sf.write(tmp_path / "a.wav", wav, SR, subtype="FLOAT")
    np.testing.assert_array_equal(silero.speech_probabilities(tmp_path / "a.wav"), silero.speech_probabilities(wav, SR))
    stereo = np.stack([wav, wav], axis=1)
    sf.write(tmp_path / "b8k.wav", stereo[::2], 8000, subtype="FLOAT")
    windows = plan_segments(tmp_path / "b8k.wav", mode="silero")
    assert [(round(w.start, 1), round(w.end, 1)) for w in windows] == \
        [(round(w.start, 1), round(w.end, 1)) for w in plan_segments(wav, SR, mode="silero")]


@needs_extra
def test_transcribe_segments_with_it(scene, tmp_path):
    import asrkit
    from tests.pipeline.tiny_exp import make_tiny_exp

    wav, _ = scene
    model = asrkit.load_model(str(make_tiny_exp(tmp_path / "exp")), segmenter="silero")
    result = model.transcribe([wav])[0]
    assert [(s.start, s.end) for s in result.segments] == \
        [(w.start, w.end) for w in plan_segments(wav, SR, mode="silero")]


def test_without_the_extra_the_error_names_it(not_installed):
    not_installed("silero_vad")
    with pytest.raises(MissingExtraError, match=r"--segmenter silero needs silero_vad, which is not installed: "
                                                r"pip install -e '\.\[vad\]'"):
        SegmentDataset([], SR, None, segmenter="silero")
    with pytest.raises(MissingExtraError, match=r"\[vad\]"):
        silero.speech_probabilities(np.zeros(SR, np.float32), SR)
