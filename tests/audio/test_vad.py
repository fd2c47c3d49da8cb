"""asrkit.audio.vad: frame energies (streamed = whole-file reference), speech segments against known layouts,
bounded length (cuts at pauses, windows where there are none), fixed windows that tile, bounded memory."""
from __future__ import annotations

import math
import shutil
import subprocess
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
import torch

from asrkit.audio.io import AudioError
from asrkit.audio.vad import (VadConfig, Window, fixed_windows, frame_energies, frame_geometry, plan_segments,
                              speech_regions)

SR = 16000
TOL = 0.05  # seconds: segment boundaries against the truth


def reference_energies(x: np.ndarray, sr: int, frame: float = 0.025, hop: float = 0.010) -> np.ndarray:
    """Written out frame by frame: ceil(T / hop) frames of `frame` samples, zero-padded at the end,
    energy = 10 log10(variance + 1e-10)."""
    h, n = int(round(hop * sr)), int(round(frame * sr))
    count = math.ceil(len(x) / h)
    padded = np.concatenate([x.astype(np.float64), np.zeros(n)])
    out = []
    for i in range(count):
        f = padded[i * h:i * h + n]
        out.append(10 * math.log10(float(np.mean((f - f.mean()) ** 2)) + 1e-10))
    return np.array(out)


def layout(bursts, total: float, sr: int = SR, floor: float = 0.0, level: float = 0.2, seed: int = 0):
    """Noise bursts (start, end) in seconds at `level` (std) over background noise of std `floor`;
    every other burst a 300 Hz tone, so both kinds of sound are covered."""
    rng = np.random.default_rng(seed)
    x = floor * rng.standard_normal(int(round(total * sr)))
    for k, (s, e) in enumerate(bursts):
        a, b = int(round(s * sr)), int(round(e * sr))
        if k % 2:
            x[a:b] += level * math.sqrt(2) * np.sin(2 * np.pi * 300 * np.arange(b - a) / sr)
        else:
            x[a:b] += level * rng.standard_normal(b - a)
    return x.astype(np.float32)


def spans(windows):
    return [(w.start, w.end) for w in windows]


@pytest.mark.parametrize("sr", [16000, 22050])
@pytest.mark.parametrize("block_hops", [1, 7, 1024])
def test_streamed_energies_equal_whole_file_reference(tmp_path, sr, block_hops):
    rng = np.random.default_rng(1)
    n = int(3.3 * sr) + 37  # not a whole number of hops: the zero-padded tail is checked too
    stereo = np.stack([layout([(0.5, 1.5)], n / sr, sr, floor=1e-3)[:n], 0.1 * rng.standard_normal(n)], 1)
    path = tmp_path / "a.wav"
    sf.write(path, stereo.astype(np.float32), sr, subtype="FLOAT")
    mono = sf.read(path, dtype="float32")[0].mean(axis=1)
    ref = reference_energies(mono, sr)
    cfg = VadConfig(block_hops=block_hops)
    got_file = frame_energies(str(path), cfg=cfg)
    got_wave = frame_energies(torch.from_numpy(stereo.T.copy()), sr, cfg)  # (C, T)
    assert got_file.shape == ref.shape == got_wave.shape
    np.testing.assert_allclose(got_file, ref, atol=1e-3)
    np.testing.assert_allclose(got_wave, ref, atol=1e-3)
    assert frame_geometry(sr)[1] == int(round(0.01 * sr))


@pytest.mark.parametrize("floor", [0.0, 1e-3, 1e-2])
def test_segments_match_a_known_layout(floor):
    truth = [(0.5, 1.7), (2.4, 2.9), (4.0, 6.25), (7.1, 7.5)]
    x = layout(truth, 9.0, floor=floor)
    got = plan_segments(x, SR, VadConfig(padding=0.0))
    assert len(got) == len(truth), spans(got)
    for w, (s, e) in zip(got, truth):
        assert abs(w.start - s) <= TOL and abs(w.end - e) <= TOL, (spans(got), truth)
        assert (w.keep_start, w.keep_end) == (w.start, w.end) and not w.fixed


def test_merging_padding_and_short_bursts():
    # 0.2 s gap (< min_silence) merged; 0.05 s click dropped; padding 0.2 s, meeting mid-gap at 0.35 s.
    truth_bursts = [(1.0, 2.0), (2.2, 3.0), (4.0, 4.05), (5.0, 6.0), (6.35, 7.0)]
    x = layout(truth_bursts, 8.0, floor=1e-3)
    cfg = VadConfig(padding=0.2, min_silence=0.3)
    got = speech_regions(frame_energies(x, SR, cfg), 0.01, cfg, duration=8.0)
    want = [(0.8, 3.2), (4.8, 6.175), (6.175, 7.2)]
    assert len(got) == len(want), got
    for (gs, ge), (ws, we) in zip(got, want):
        assert abs(gs - ws) <= TOL and abs(ge - we) <= TOL, got
    assert got[1][1] == got[2][0]  # paddings meet in the middle, no overlap


def test_long_region_is_cut_at_its_pauses():
    # 61 s of "speech": bursts of 0.6-3 s with 0.15 s gaps (shorter than min_silence, so one region).
    rng = np.random.default_rng(2)
    bursts, t = [], 0.5
    while t < 61:
        d = float(rng.uniform(0.6, 3.0))
        bursts.append((t, t + d))
        t += d + 0.15
    total = bursts[-1][1] + 0.5
    x = layout(bursts, total, floor=1e-3)
    cfg = VadConfig(max_segment=12.0, padding=0.1)
    got = plan_segments(x, SR, cfg)
    assert len(got) >= 6 and not any(w.fixed for w in got)
    assert all(w.duration <= cfg.max_segment + 1e-9 for w in got)
    assert all(w.duration >= cfg.min_segment for w in got)
    for a, b in zip(got, got[1:]):
        assert a.end == b.start  # contiguous, no overlap
        assert any(e - 0.02 <= a.end <= s + 0.02 for (_, e), (s, _) in zip(bursts, bursts[1:])), a.end
    assert abs(got[0].start - (bursts[0][0] - 0.1)) <= TOL and abs(got[-1].end - (bursts[-1][1] + 0.1)) <= TOL


def check_tiles(windows, start, end, overlap, window):
    assert windows[0].keep_start == pytest.approx(start) and windows[-1].keep_end == pytest.approx(end)
    assert windows[0].start == pytest.approx(start) and windows[-1].end == pytest.approx(end)
    for a, b in zip(windows, windows[1:]):
        assert a.keep_end == b.keep_start  # exact: no gap, no overlap
        assert a.end - b.start >= overlap - 1e-9  # the spans overlap by at least `overlap`
        assert b.start < a.keep_end < a.end  # the seam is inside both spans
    for w in windows:
        assert w.start <= w.keep_start < w.keep_end <= w.end and w.duration <= window + 1e-9


def test_region_without_pauses_falls_back_to_windows():
    x = layout([(1.0, 51.0)], 52.0, floor=1e-3)  # 50 s of continuous noise: no quiet frame
    cfg = VadConfig(max_segment=10.0, overlap=2.0, padding=0.2)
    got = plan_segments(x, SR, cfg)
    assert all(w.fixed for w in got) and len(got) >= 6
    check_tiles(got, got[0].start, got[-1].end, cfg.overlap, cfg.max_segment)
    assert abs(got[0].start - 0.8) <= TOL and abs(got[-1].end - 51.2) <= TOL


def test_pause_then_no_pause_mixes_cuts_and_windows():
    # 8 s of bursts with short pauses, then 30 s without any, then bursts again: one 50 s region.
    bursts = [(1.0, 4.0), (4.15, 9.0), (9.15, 39.0), (39.15, 44.0), (44.15, 50.0)]
    x = layout(bursts, 51.0, floor=1e-3)
    cfg = VadConfig(max_segment=10.0, overlap=2.0)
    got = plan_segments(x, SR, cfg)
    assert any(w.fixed for w in got) and any(not w.fixed for w in got)
    assert all(w.duration <= cfg.max_segment + 1e-9 for w in got)
    for a, b in zip(got, got[1:]):
        assert a.keep_end == b.keep_start  # one region: the ownership intervals tile it
    assert got[0].keep_start == got[0].start and got[-1].keep_end == got[-1].end


@pytest.mark.parametrize("duration", [0.0, 5.0, 20.0, 20.0001, 61.3, 3600.0])
def test_fixed_windows_tile_the_recording(duration):
    got = fixed_windows(duration, 20.0, 3.0)
    if duration == 0:
        assert got == []
        return
    check_tiles(got, 0.0, duration, 3.0, 20.0)
    assert len(got) == (1 if duration <= 20 else math.ceil((duration - 3.0) / 17.0))


@pytest.mark.parametrize("mode", ["vad", "fixed"])
def test_silence_and_empty_audio_give_no_segments(tmp_path, mode):
    rng = np.random.default_rng(3)
    for k, x in enumerate([np.zeros(SR * 3, np.float32), (1e-3 * rng.standard_normal(SR * 3)).astype(np.float32),
                           np.zeros(0, np.float32)]):
        path = tmp_path / f"{k}.wav"
        sf.write(path, x, SR)
        assert plan_segments(str(path), mode=mode) == []
        assert plan_segments(x, SR, mode=mode) == []
    x = layout([(1.0, 2.0)], 3.0, floor=1e-3)
    want = [Window(0.0, 3.0, 0.0, 3.0, fixed=True)] if mode == "fixed" else None
    got = plan_segments(x, SR, mode=mode)
    assert (got == want) if want else len(got) == 1


def test_file_names_are_taken_literally_and_errors_name_the_file(tmp_path):
    path = tmp_path / "touch x; a b|"
    sf.write(path, layout([(0.5, 1.0)], 2.0, floor=1e-3), SR, format="WAV")
    assert len(plan_segments(str(path))) == 1
    assert not (tmp_path / "x").exists()
    with pytest.raises(AudioError, match="missing.wav: file not found"):
        plan_segments(str(tmp_path / "missing.wav"))
    (tmp_path / "bad.wav").write_bytes(b"RIFF not really")
    with pytest.raises(AudioError, match="bad.wav: cannot read audio header"):
        plan_segments(str(tmp_path / "bad.wav"))
    with pytest.raises(ValueError, match="sample_rate"):
        plan_segments(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="mode"):
        plan_segments(np.zeros(10, np.float32), SR, mode="vda")
    with pytest.raises(ValueError, match="max_segment"):
        VadConfig(max_segment=1.0, min_segment=1.0)


def write_minutes(path, minutes: int, sr: int) -> None:
    """Each minute: 18 s of speech-like noise, 42 s of quiet; written chunk by chunk (never whole here either)."""
    rng = np.random.default_rng(4)
    minute = np.concatenate([0.2 * rng.standard_normal(18 * sr), 1e-3 * rng.standard_normal(42 * sr)])
    with sf.SoundFile(path, "w", sr, 1, subtype="PCM_16") as f:
        for _ in range(minutes):
            f.write(minute.astype(np.float32))


def traced_peaks(path):
    """Peak traced memory of frame_energies and of plan_segments on one file (numpy reports to tracemalloc)."""
    peaks = []
    tracemalloc.start()
    try:
        energies = frame_energies(str(path))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.reset_peak()
        windows = plan_segments(str(path))
        peaks.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    return peaks, energies, windows


def test_energies_of_a_30_minute_file_are_computed_in_bounded_memory(tmp_path):
    sr, minutes = 8000, 30
    write_minutes(tmp_path / "short.wav", 3, sr)
    write_minutes(tmp_path / "long.wav", minutes, sr)
    short_peaks, _, _ = traced_peaks(tmp_path / "short.wav")
    peaks, energies, windows = traced_peaks(tmp_path / "long.wav")
    whole_bytes = minutes * 60 * sr * 4  # the file as float32 samples: 57.6 MB
    # Ten times the audio may cost only per-hop arrays more (energies: 4 bytes per 10 ms, a few copies),
    # nothing per sample: 27 minutes more are 162000 hops.
    growth = max(p - q for p, q in zip(peaks, short_peaks))
    assert growth < 24 * 162000 and max(peaks) < whole_bytes / 8, (peaks, short_peaks)
    assert len(energies) == minutes * 60 * 100
    # each minute's burst is one segment (18 s + padding, under max_segment), the first one starting at 0
    assert len(windows) == minutes and not any(w.fixed for w in windows)
    assert all(abs(w.start - max(0.0, 60 * k - 0.2)) <= TOL and abs(w.end - (60 * k + 18.2)) <= TOL
               for k, w in enumerate(windows))



def test_energies_of_a_long_waveform_are_computed_in_blocks():
    """A waveform (asrkit decode hands an over-long utterance to the segmenter as one) is framed block by block,
    as a file is: framing it whole made a float64 copy of every frame (an hour at 16 kHz: 1.2 GB)."""
    sr = 16000
    wav = torch.from_numpy(layout([(5.0, 50.0), (100.0, 170.0)], 600.0, sr))  # 10 minutes: 38 MB of float32
    cfg = VadConfig()
    tracemalloc.start()
    try:
        energies = frame_energies(wav, sr, cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    framed_whole = 60000 * frame_geometry(sr)[0] * 8  # 60000 frames of 400 float64 samples: 192 MB
    assert peak < wav.numel() * 4 * 1.5 < framed_whole / 2, peak  # the mono copy and one block, no more
    np.testing.assert_allclose(energies, frame_energies(wav, sr, VadConfig(block_hops=10**9)), atol=1e-4)


SENTENCES = ["the cat sat on the mat", "she read a good book", "birds sing in the morning"]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_sentences_are_found(tmp_path):
    clips, rate = [], None
    for k, text in enumerate(SENTENCES):
        out = tmp_path / f"{k}.wav"
        subprocess.run(["espeak-ng", "-w", str(out), text], check=True)
        x, rate = sf.read(out, dtype="float32")
        loud = np.flatnonzero(np.abs(x) > 1e-3)  # espeak pads with (near) digital silence
        clips.append(x[loud[0]:loud[-1] + 1])
    rng = np.random.default_rng(5)
    pieces, truth, t = [], [], 0.0
    for clip in clips:
        gap = np.zeros(int(0.8 * rate), np.float32)
        pieces += [gap, clip]
        t += len(gap) / rate
        truth.append((t, t + len(clip) / rate))
        t += len(clip) / rate
    pieces.append(np.zeros(int(0.8 * rate), np.float32))
    x = np.concatenate(pieces)
    x += (1e-4 * rng.standard_normal(len(x))).astype(np.float32)
    path = tmp_path / "all.wav"
    sf.write(path, x, rate)
    got = plan_segments(str(path), cfg=VadConfig(padding=0.0))
    assert len(got) == len(truth), (spans(got), truth)
    for w, (s, e) in zip(got, truth):
        assert abs(w.start - s) <= TOL and abs(w.end - e) <= TOL, (spans(got), truth)


def test_noise_floor_follows_a_drifting_level():
    """A quiet minute then a loud minute whose background is as loud as the quiet minute's speech: a global
    floor calls the loud minute's background speech (one long region); the floor per noise_window block finds
    every burst of both minutes."""
    truth_quiet = [(5.0 + 10 * k, 6.5 + 10 * k) for k in range(6)]
    quiet = layout(truth_quiet, 60.0, floor=0.0005, level=0.02, seed=1)
    loud = layout([(5.0 + 10 * k, 6.5 + 10 * k) for k in range(6)], 60.0, floor=0.02, level=0.5, seed=2)
    x = np.concatenate([quiet, loud])
    truth = truth_quiet + [(s + 60.0, e + 60.0) for s, e in truth_quiet]
    local = plan_segments(x, SR, VadConfig(padding=0.0, noise_window=30.0))
    assert len(local) == len(truth), spans(local)
    for w, (s, e) in zip(local, truth):
        assert abs(w.start - s) <= TOL and abs(w.end - e) <= TOL, (spans(local), truth)
    merged = plan_segments(x, SR, VadConfig(padding=0.0, noise_window=0.0))
    assert len(merged) < len(truth)  # the global floor cannot see the loud minute's pauses
