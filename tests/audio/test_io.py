"""asrkit.audio.io: formats, channels, segments, pipes, resampling and per-utterance errors."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF

from asrkit.audio.io import AudioError, StreamResampler, audio_duration, audio_info, load_audio

SR = 16000


def signal(n: int = 8000, sr: int = SR, seed: int = 0) -> np.ndarray:
    """Two sines plus a little noise, peak < 0.8: exercises every quantisation step."""
    t = np.arange(n) / sr
    rng = np.random.default_rng(seed)
    x = 0.5 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.01 * rng.standard_normal(n)
    return x.astype(np.float32)


@pytest.mark.parametrize("ext,subtype,atol", [
    ("wav", "PCM_16", 2.0 ** -15),
    ("wav", "PCM_24", 2.0 ** -23),
    ("wav", "PCM_32", 1e-7),
    ("wav", "FLOAT", 0.0),
    ("wav", "DOUBLE", 0.0),
    ("flac", "PCM_16", 2.0 ** -15),
    ("flac", "PCM_24", 2.0 ** -23),
])
def test_lossless_formats_load_the_written_signal(tmp_path, ext, subtype, atol):
    x = signal()
    path = tmp_path / f"a.{ext}"
    sf.write(path, x, SR, subtype=subtype)
    wav = load_audio(str(path), SR)
    assert wav.dtype == torch.float32 and wav.shape == (len(x),)
    np.testing.assert_allclose(wav.numpy(), x, rtol=0, atol=atol)


def test_ogg_vorbis_is_close_to_the_written_signal(tmp_path):
    x = signal(16000)
    path = tmp_path / "a.ogg"
    sf.write(path, x, SR, format="OGG", subtype="VORBIS")
    wav = load_audio(str(path), SR).numpy()
    assert abs(len(wav) - len(x)) < 0.01 * SR
    n = min(len(wav), len(x))
    snr = 10 * np.log10(np.sum(x[:n] ** 2) / np.sum((wav[:n] - x[:n]) ** 2))
    assert snr > 15, f"vorbis round trip SNR {snr:.1f} dB"


def test_channels_are_averaged(tmp_path):
    a, b = signal(seed=1), signal(seed=2) * 0.5
    path = tmp_path / "st.wav"
    sf.write(path, np.stack([a, b], axis=1), SR, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(str(path), SR).numpy(), (a + b) / 2, atol=1e-7)


def test_segment_reads_only_its_frames(tmp_path):
    x = signal(SR)  # 1 s
    path = tmp_path / "a.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(str(path), SR, start=0.25, end=0.5).numpy(), x[4000:8000])
    np.testing.assert_array_equal(load_audio(str(path), SR, start=0.75).numpy(), x[12000:])
    # an end slightly past the audio (rounding in a segments file) is clipped, as in Kaldi
    np.testing.assert_array_equal(load_audio(str(path), SR, start=0.9, end=1.2).numpy(), x[14400:])
    with pytest.raises(AudioError, match=r"utt s1: .*after the end of the audio"):
        load_audio(str(path), SR, start=0.5, end=3.0, name="s1")
    with pytest.raises(AudioError, match=r"utt s2: .*starts at 1.500 s, after the end"):
        load_audio(str(path), SR, start=1.5, name="s2")


def test_pipe_sources_equal_the_file(tmp_path):
    x = signal()
    path = tmp_path / "a.wav"
    sf.write(path, x, SR, subtype="PCM_16")
    direct = load_audio(str(path), SR)
    for cmd in (f"cat {path} |", f"sox {path} -t wav - |", f"sox {path} -t flac - |"):
        torch.testing.assert_close(load_audio(cmd, SR), direct, rtol=0, atol=0)
        assert audio_duration(cmd) == pytest.approx(len(x) / SR)
    torch.testing.assert_close(load_audio(f"cat {path} |", SR, start=0.1, end=0.3), direct[1600:4800])


def test_failing_pipe_reports_status_and_stderr():
    with pytest.raises(AudioError) as err:
        load_audio("sh -c 'echo no such corpus >&2; exit 3' |", SR, name="u7")
    msg = str(err.value)
    assert msg.startswith("utt u7: sh -c") and "status 3" in msg and "no such corpus" in msg
    with pytest.raises(AudioError, match=r"utt u8: .*no audio to stdout"):
        load_audio("true |", SR, name="u8")


def test_resampling_matches_torchaudio(tmp_path):
    x = signal(8000, sr=8000)
    path = tmp_path / "a8k.wav"
    sf.write(path, x, 8000, subtype="FLOAT")
    wav = load_audio(str(path), 16000)
    torch.testing.assert_close(wav, AF.resample(torch.from_numpy(x), 8000, 16000))
    assert wav.shape == (16000,)


def test_resampled_sine_is_the_same_sine_at_the_new_rate(tmp_path):
    # independent of torchaudio: a 440 Hz tone at 8 kHz must become the 440 Hz tone at 16 kHz
    t8, t16 = np.arange(8000) / 8000, np.arange(16000) / 16000
    sf.write(tmp_path / "tone.wav", (0.5 * np.sin(2 * np.pi * 440 * t8)).astype(np.float32), 8000, subtype="FLOAT")
    wav = load_audio(str(tmp_path / "tone.wav"), 16000).numpy()
    ref = 0.5 * np.sin(2 * np.pi * 440 * t16)
    np.testing.assert_allclose(wav[800:-800], ref[800:-800], atol=5e-3)


@pytest.mark.parametrize("orig", [8000, 44100, 48000])
def test_a_signal_resampled_in_pieces_is_the_signal_resampled_at_once(orig):
    # pieces of 1 sample to 0.5 s through one StreamResampler: the whole signal as soxr resamples it at once
    import soxr

    rng = np.random.default_rng(0)
    x = rng.standard_normal(orig * 2).astype(np.float32) * 0.1
    stream, out, i = StreamResampler(orig, 16000), [], 0
    while i < x.size:
        n = int(rng.choice([1, 7, 333, 4000, orig // 2]))
        out.append(stream(torch.from_numpy(x[i: i + n])))
        i += n
    got = torch.cat(out + [stream.flush()]).numpy()
    want = soxr.resample(x, orig, 16000, quality="HQ")
    assert got.shape == want.shape == (32000,)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_sine_resampled_in_pieces_is_the_sine_at_the_new_rate():
    # independent of soxr's one-shot path: 440 Hz at 44.1 kHz in 10 ms pieces is 440 Hz at 16 kHz, with no edge
    # error at the boundaries (each piece resampled alone left about 45 dB SNR)
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)).astype(np.float32)
    stream = StreamResampler(44100, 16000)
    got = torch.cat([stream(torch.from_numpy(x[i: i + 441])) for i in range(0, x.size, 441)] + [stream.flush()])
    ref = 0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    err = got.numpy()[400:-400] - ref[400:-400]
    assert 10 * np.log10(np.sum(ref[400:-400] ** 2) / np.sum(err ** 2)) > 80


def test_a_stream_at_the_same_rate_is_passed_through():
    x = torch.randn(100)
    stream = StreamResampler(16000, 16000)
    assert stream(x) is x and stream.flush().numel() == 0


@pytest.mark.parametrize("n,sr,ext", [(12345, 16000, "wav"), (8000, 8000, "flac"), (22050, 44100, "wav")])
def test_audio_duration_from_header(tmp_path, n, sr, ext):
    path = tmp_path / f"a.{ext}"
    sf.write(path, np.zeros(n, np.float32), sr, subtype="PCM_16")
    assert audio_info(str(path)) == (sr, n)
    assert audio_duration(str(path)) == n / sr


def test_errors_name_utterance_source_and_problem(tmp_path):
    missing = tmp_path / "missing.wav"
    with pytest.raises(AudioError, match=rf"^utt u1: {missing}: file not found$"):
        load_audio(str(missing), SR, name="u1")
    empty_file = tmp_path / "empty.wav"
    empty_file.write_bytes(b"")
    with pytest.raises(AudioError, match=r"^utt u2: .*empty.wav: empty file \(0 bytes\)$"):
        load_audio(str(empty_file), SR, name="u2")
    no_samples = tmp_path / "nosamples.wav"
    sf.write(no_samples, np.zeros(0, np.float32), SR)
    with pytest.raises(AudioError, match=r"^utt u3: .*nosamples.wav: empty audio \(0 samples\)$"):
        load_audio(str(no_samples), SR, name="u3")
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8).tobytes())
    with pytest.raises(AudioError, match=r"^utt u4: .*corrupt.wav: cannot read audio header"):
        load_audio(str(corrupt), SR, name="u4")
    with pytest.raises(AudioError, match=r"^utt u5: .*: not a regular file$"):
        load_audio(str(tmp_path), SR, name="u5")
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.array([0.1, np.nan, 0.2] * 100, np.float32), SR, subtype="FLOAT")
    with pytest.raises(AudioError, match=r"^utt u6: .*NaN"):
        load_audio(str(nan), SR, name="u6")
    with pytest.raises(AudioError, match=r"^utt u0: no audio entry"):
        load_audio(None, SR, name="u0")
    with pytest.raises(AudioError, match=r"^utt u9: .*corrupt.wav: cannot read audio header"):
        audio_duration(str(corrupt), name="u9")
