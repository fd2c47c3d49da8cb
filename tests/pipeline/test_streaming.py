"""Live streams through the pipeline (issue 30): the stream API on irregular pieces equals the same audio at once,
one chunk covering the utterance equals offline decoding, streams batched equal each alone, endpoints split a long
stream into finals at the right times, and the CLI's --streaming writes what offline decoding writes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import asrkit
from asrkit.cli import main
from asrkit.config import ConfigError, DecodeConfig, EndpointConfig, load_config, load_decode_config
from asrkit.data.table import read_table
from asrkit.models.registry import build_model
from asrkit.pipeline import Transcriber
from asrkit.pipeline.inputs import AudioInput
from asrkit.pipeline.results import Result
from asrkit.pipeline.streaming_files import stream_inputs
from asrkit.text.tokenizer import CharTokenizer
from tests.pipeline.streaming_exp import REPO, make_streaming_exp, make_tone_detector, tone_stream
from tests.pipeline.tiny_exp import tone, write_data_dir

SR = 16000
BIG_CHUNK = 40000  # ms: one chunk covers every utterance here


@pytest.fixture(scope="module")
def exps(tmp_path_factory):
    root = tmp_path_factory.mktemp("streaming")
    return {"ctc": make_streaming_exp(root / "ctc"),
            "two_pass": make_streaming_exp(root / "two_pass", kind="conformer", decoder=True)}


def _audio(seconds: float = 2.6, seed: int = 0) -> torch.Tensor:
    parts = [tone(0.9, 300, seed), tone(0.6, 900, seed + 1), tone(seconds - 1.5, 500, seed + 2)]
    return torch.from_numpy(np.concatenate(parts))


def _same_result(a: Result, b: Result, tol: float = 1e-4) -> None:
    assert a.text == b.text
    assert [(s.start, s.end, s.text) for s in a.segments] == [(s.start, s.end, s.text) for s in b.segments]
    assert [w.text for w in a.words] == [w.text for w in b.words]
    for x, y in zip(a.words, b.words):
        assert (x.start, x.end) == (y.start, y.end) and x.confidence == pytest.approx(y.confidence, abs=1e-3)
    assert [n.text for n in a.nbest] == [n.text for n in b.nbest]
    for x, y in zip(a.nbest, b.nbest):
        assert x.score == pytest.approx(y.score, abs=tol) and x.ctc_score == pytest.approx(y.ctc_score, abs=tol)


MODES = [("ctc", DecodeConfig(mode="greedy")), ("ctc", DecodeConfig(mode="ctc_prefix", beam=4, nbest=2)),
         ("two_pass", DecodeConfig(mode="rescore", beam=4, nbest=2))]


@pytest.mark.parametrize("which, decode", MODES, ids=["greedy", "ctc_prefix", "rescore"])
def test_irregular_pieces_equal_the_audio_at_once(exps, which, decode):
    model = asrkit.load_model(exps[which], decode=decode)
    wav = _audio()
    whole = model.stream(chunk_ms=320)
    whole.accept_waveform(wav)
    reference = whole.finish()
    rng = np.random.default_rng(1)
    pieces = model.stream(chunk_ms=320)
    i, partials = 0, []
    while i < wav.numel():  # 1 sample .. 2 s, numpy and torch
        n = int(rng.choice([1, 7, 160, 1234, 5000, 32000]))
        x = wav[i: i + n]
        pieces.accept_waveform(x.numpy() if n % 2 else x)
        partials.append(pieces.partial)
        i += n
    got = pieces.finish()
    _same_result(got, reference)
    assert reference.text and any(partials) and partials[-1]  # partials come before the end
    assert got.duration == pytest.approx(wav.numel() / SR)


def test_a_stream_at_another_rate_in_pieces_equals_it_at_once(exps):
    # 8 kHz audio is resampled as one signal: in pieces of 1 sample to 1 s it decodes as the same audio at once
    model = asrkit.load_model(exps["ctc"], decode=DecodeConfig(mode="ctc_prefix", beam=4, nbest=2))
    wav = _audio()[::2].contiguous()
    whole = model.stream(chunk_ms=320)
    whole.accept_waveform(wav, 8000)
    reference = whole.finish()
    rng = np.random.default_rng(2)
    pieces, i = model.stream(chunk_ms=320), 0
    while i < wav.numel():
        n = int(rng.choice([1, 7, 160, 1234, 8000]))
        pieces.accept_waveform(wav[i: i + n], 8000)
        i += n
    got = pieces.finish()
    _same_result(got, reference)
    assert reference.text and got.duration == pytest.approx(wav.numel() / 8000)


@pytest.mark.parametrize("which, decode", MODES, ids=["greedy", "ctc_prefix", "rescore"])
def test_one_chunk_over_the_utterance_equals_offline_decoding(exps, which, decode):
    model = asrkit.load_model(exps[which], decode=decode)
    wavs = [_audio(2.6, 0), _audio(1.9, 5)]
    offline = model.transcribe_nbest(wavs)
    for wav, hyps in zip(wavs, offline):
        stream = model.stream(chunk_ms=BIG_CHUNK)
        stream.accept_waveform(wav)
        assert stream.partial == ""  # no chunk is complete before the end
        result = stream.finish()
        assert [a.text for a in result.nbest] == [h.text for h in hyps]
        for a, h in zip(result.nbest, hyps):
            assert a.score == pytest.approx(h.score, abs=1e-4) and a.ctc_score == pytest.approx(h.ctc_score, abs=1e-4)
        assert len(result.segments) == 1 and result.segments[0].start == 0.0


@pytest.mark.parametrize("which, decode", MODES, ids=["greedy", "ctc_prefix", "rescore"])
@pytest.mark.parametrize("samples", [0, 1000])  # nothing, and less than one encoder frame's receptive field
def test_a_stream_without_an_encoder_frame_finishes_empty(exps, which, decode, samples):
    stream = asrkit.load_model(exps[which], decode=decode).stream(chunk_ms=320)
    stream.accept_waveform(np.zeros(samples, dtype=np.float32))
    result = stream.finish()
    assert (result.text, result.words, result.segments, result.error) == ("", [], [], None)
    assert [(a.text, a.score, a.ctc_score) for a in result.nbest] == [("", 0.0, 0.0)]
    assert stream.done and result.duration == round(samples / SR, 3)


@pytest.mark.parametrize("samples", [10960, 21200])  # 67 and 131 feature frames: exactly 1 and 2 chunks of 640 ms
def test_input_ending_on_a_chunk_boundary_finishes(exps, samples):
    """The last chunk took every feature frame: the final flush has none left to encode (and an encoder cache
    that has seen frames), and still ends the utterance."""
    model = asrkit.load_model(exps["ctc"])
    stream = model.stream(chunk_ms=640)
    stream.accept_waveform(_audio(2.0)[:samples])
    assert stream._pending_frames == 0 and not stream._fresh  # the case: nothing pending, a cache in use
    partial = stream.partial
    result = stream.finish()
    assert stream.done and result.duration == round(samples / SR, 3)
    assert partial and result.text == partial  # greedy: no frame came after the last partial


def test_streams_batched_equal_each_alone(exps):
    decode = DecodeConfig(mode="rescore", beam=4, nbest=2)
    model = asrkit.load_model(exps["two_pass"], decode=decode)
    wavs = [_audio(1.7 + 0.4 * k, k) for k in range(4)]
    alone = []
    for wav in wavs:
        s = model.stream(chunk_ms=240)
        s.accept_waveform(wav)
        alone.append(s.finish())
    rec = model.streaming_recognizer(chunk_ms=240)
    streams = [rec.create_stream(f"s{k}") for k in range(4)]
    rng = np.random.default_rng(0)
    fed = [0] * 4
    ticks = 0
    while not all(s.done for s in streams):
        ticks += 1
        for k, (s, wav) in enumerate(zip(streams, wavs)):
            if ticks <= k:  # stream k starts k ticks late: the batch mixes streams at different positions
                continue
            if fed[k] < wav.numel():
                n = int(rng.integers(800, 9000))
                s.accept_waveform(wav[fed[k]: fed[k] + n])
                fed[k] += n
            else:
                s.input_finished()
        assert rec.step(streams) <= len(streams)
        rec.decode_streams(streams)
    assert rec.stats.ticks < rec.stats.chunks  # streams did share batches
    for s, ref in zip(streams, alone):
        _same_result(s.result(), ref, tol=1e-3)


@pytest.mark.parametrize("vad", ["none", "energy", "silero"])
def test_endpoints_split_a_long_stream_into_finals_at_the_right_times(exps, vad):
    if vad == "silero":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("silero_vad")
    model = asrkit.load_model(exps["ctc"], decode=DecodeConfig(mode="ctc_prefix", beam=4, endpoint=EndpointConfig(
        trailing_silence=1.0, vad=vad)))
    token = model.tokenizer.token_list.index("C")
    make_tone_detector(model.model, token)
    audio, spans = tone_stream([("quiet", 0.5), ("tone", 0.8), ("quiet", 1.6), ("tone", 1.2), ("quiet", 1.6),
                                ("tone", 0.6), ("quiet", 0.5)])
    stream = model.stream(chunk_ms=320)
    popped = []
    for i in range(0, len(audio), 1600):
        stream.accept_waveform(audio[i: i + 1600])
        popped += stream.pop_finals()
    assert len(popped) == 2  # the third utterance ends with the input, not with a rule
    held = sum(x.numel() for x in stream._audio) / SR
    assert held <= len(audio) / SR - popped[-1].end + 0.05  # a stream holds its current utterance only
    result = stream.finish()
    assert stream.pop_finals() == result.segments[2:]
    assert result.text == "C C C" and len(result.segments) == 3
    for seg, word, (start, end) in zip(result.segments, result.words, spans):
        assert seg.text == "C" and seg.words == [word]
        assert abs(word.start - start) <= 0.06 and abs(word.end - end) <= 0.06, (word, start, end)
        assert seg.start <= word.start and word.end <= seg.end
    for k, (a, b) in enumerate(zip(result.segments, result.segments[1:])):
        assert a.end <= b.start + 1e-6 and b.start - a.end < 0.1  # back to back: only the dropped remainder between
        assert 1.0 <= a.end - spans[k][1] <= 1.0 + 0.32 + 0.1  # trailing_silence 1.0 s, then the chunk's end
    assert result.segments[-1].end == pytest.approx(len(audio) / SR, abs=1e-3)
    assert (stream._endpointer.vad_silence_seconds is None) == (vad == "none")  # the VAD heard the stream
    reused = model.stream(chunk_ms=320)  # a caller that fills one buffer again and again (a sound card's)
    buffer = np.empty(1600, dtype=np.float32)
    for i in range(0, len(audio), 1600):
        buffer[: len(audio[i: i + 1600])] = audio[i: i + 1600]
        reused.accept_waveform(buffer[: len(audio[i: i + 1600])])
    assert reused.finish() == result
    joined = result.nbest  # several utterances: their joined 1-best, as transcribe gives for a recording
    assert [a.text for a in joined] == ["C C C"]
    assert joined[0].score == pytest.approx(sum(s.nbest[0].score for s in result.segments))
    assert joined[0].ctc_score == pytest.approx(sum(s.nbest[0].ctc_score for s in result.segments))


def test_files_as_streams_report_each_utterance_s_partials(exps):
    """stream_inputs' partials: each non-empty change, with its utterance's start (the empty partial a new utterance
    begins with is not reported)."""
    model = asrkit.load_model(exps["ctc"], decode=DecodeConfig(mode="ctc_prefix", beam=4))
    make_tone_detector(model.model, model.tokenizer.token_list.index("C"))
    audio, _ = tone_stream([("quiet", 0.3), ("tone", 0.6), ("quiet", 1.4), ("tone", 0.6), ("quiet", 0.3)])
    seen = []
    results = list(stream_inputs(model.streaming_recognizer(chunk_ms=320), [AudioInput("a", waveform=torch.from_numpy(
        audio))], on_partial=lambda name, p: seen.append((name, p.text, p.start))))
    assert results[0].text == "C C" and [s.start for s in results[0].segments] == [0.0, seen[-1][2]]
    assert [(name, text) for name, text, _ in seen] == [("a", "C"), ("a", "C")] and seen[-1][2] > 1.5


def test_streaming_refuses_what_it_cannot_do(exps):
    model = asrkit.load_model(exps["two_pass"])
    with pytest.raises(ConfigError, match="decode.mode 'joint' cannot stream"):
        model.stream(mode="joint")
    with pytest.raises(ConfigError, match="decode.chunk_ms must be a positive multiple of the encoder frame"):
        model.stream(chunk_ms=650)
    s = model.stream()
    with pytest.raises(ValueError, match=r"stream stream: samples must be a 1-D float array in \[-1, 1\], got "
                                         r"torch.int16 of shape \(100,\) \(divide integer PCM"):
        s.accept_waveform(np.zeros(100, dtype=np.int16))
    with pytest.raises(ValueError, match="samples must be a 1-D float tensor or numpy array, got list"):
        s.accept_waveform([0.0, 0.1])
    with pytest.raises(ValueError, match=r"got torch.float32 of shape \(2, 50\)"):
        s.accept_waveform(torch.zeros(2, 50))
    s.accept_waveform(np.zeros(100, dtype=np.float32), sample_rate=8000)
    with pytest.raises(ValueError, match="sample_rate 16000 differs from the stream's 8000"):
        s.accept_waveform(np.zeros(100, dtype=np.float32), sample_rate=16000)
    s.finish()
    with pytest.raises(ValueError, match="accept_waveform after input_finished"):
        s.accept_waveform(np.zeros(100, dtype=np.float32), sample_rate=8000)
    with pytest.raises(ValueError, match="streaming needs an experiment dir"):
        Transcriber(None, None, model.tokenizer, exported=_FakeExported()).stream()


def test_a_bidirectional_lstm_cannot_stream(tmp_path):
    torch.manual_seed(0)
    cfg = load_config(REPO / "conf" / "tiny_blstm_ctc.yaml", [
        "model.encoder.hidden_size=16", "model.encoder.num_layers=1", "frontend.n_mels=20", "cmvn=null",
        "tokenizer.path=tokenizer.json", "specaug.enabled=false"])
    tok = CharTokenizer.train(["AB"])
    model = Transcriber(build_model(cfg, tok.vocab_size), cfg, tok)
    with pytest.raises(ValueError, match="model.encoder.kind blstm cannot stream"):
        model.stream()


class _FakeExported:
    """What Transcriber needs of an exported model to be built (streaming refuses it before using it)."""

    sample_rate, frame_shift = SR, 0.04


def test_transcribe_cli_streaming_writes_what_offline_writes(exps, tmp_path, capsys):
    wav = tmp_path / "a.wav"
    import soundfile as sf

    sf.write(wav, _audio().numpy(), SR, subtype="FLOAT")
    common = ["transcribe", "--model", str(exps["ctc"]), "--format", "jsonl", "--no-progress", "--num-workers", "0",
              "--segmenter", "none", str(wav)]
    assert main(common) == 0
    offline = json.loads(capsys.readouterr().out)
    assert main(common + ["--streaming", "--chunk-ms", str(BIG_CHUNK)]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert streamed.keys() == offline.keys()
    assert streamed["text"] == offline["text"] and streamed["nbest"][0]["text"] == offline["nbest"][0]["text"]
    assert [w["word"] for w in streamed["words"]] == [w["word"] for w in offline["words"]]
    assert main(common + ["--streaming", "--chunk-ms", "320", "--partials"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    partials, final = lines[:-1], lines[-1]
    assert partials and all(p.keys() == {"name", "partial", "start"} and p["name"] == str(wav) for p in partials)
    assert all(p["partial"] for p in partials) and len({p["partial"] for p in partials}) == len(partials)
    assert final.keys() == offline.keys() and final["text"]
    with pytest.raises(SystemExit):
        main(common + ["--partials"])
    assert "--partials needs --streaming and --format jsonl" in capsys.readouterr().err
    missing = tmp_path / "missing.wav"
    assert main(["transcribe", "--model", str(exps["ctc"]), "--no-progress", "--streaming", "--num-workers", "1",
                 str(missing), str(wav)]) == 1  # a missing input is named, the others are transcribed
    out, err = capsys.readouterr()
    assert out.startswith(f"{wav}\t") and out.count("\n") == 1
    assert f"{missing}" in err and "1 of 2 inputs failed" in err


def test_decode_cli_streaming_writes_the_offline_outputs(exps, tmp_path, capsys):
    data = write_data_dir(tmp_path / "data", {f"u{k}": _audio(1.5 + 0.3 * k, k).numpy() for k in range(3)})
    assert main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "off"),
                 "--mode", "ctc_prefix", "--beam", "4"]) == 0
    assert main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "on"),
                 "--mode", "ctc_prefix", "--beam", "4", "--streaming", "--chunk-ms", str(BIG_CHUNK)]) == 0
    assert read_table(tmp_path / "on" / "text") == read_table(tmp_path / "off" / "text")
    assert (tmp_path / "on" / "decode.yaml").read_text().count(f"chunk_ms: {BIG_CHUNK}") == 1
    assert main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "default"),
                 "--streaming"]) == 0  # the chunk of the model's training (none here: 640 ms), all left context
    used = load_decode_config(tmp_path / "default" / "decode.yaml")
    assert (used.chunk_ms, used.left_chunks) == (640, -1)
    with pytest.raises(SystemExit):
        main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "x"),
              "--chunk-ms", "320"])
    assert "--chunk-ms applies to --streaming" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "x"), "--streaming",
              "--nj", "2"])
    assert "--streaming decodes in one process and splits long utterances at endpoints" in capsys.readouterr().err


def test_decode_streaming_fails_an_utterance_alone(exps, tmp_path):
    """An utterance whose decoding raises (absurd samples: log-probs of NaN, refused by the prefix search) is listed
    in OUT/failed with its reason; its batch is decoded again one utterance at a time, so the others are decoded."""
    audio = {f"u{k}": _audio(1.5, k).numpy() for k in range(3)}
    audio["u1"] = np.full(24000, 3e38, dtype=np.float32)
    data = write_data_dir(tmp_path / "data", audio)
    assert main(["decode", "--model", str(exps["ctc"]), "--data", str(data), "--out", str(tmp_path / "on"),
                 "--mode", "ctc_prefix", "--beam", "4", "--streaming"]) == 0
    assert sorted(read_table(tmp_path / "on" / "text")) == ["u0", "u2"]
    failed = read_table(tmp_path / "on" / "failed")
    assert list(failed) == ["u1"] and failed["u1"].startswith("utt u1: cannot be decoded: ValueError: ")


def test_final_chunks_of_streams_holding_different_leftovers_batch(exps):
    """Two streams end with the same pending feature frames, one fresh (no leftover input) and one past its first
    chunk (the subsampling's 3 leftover frames): their final chunks cannot share a stacked cache, so they go in
    batches of their own, and each decodes as it does alone."""
    model = asrkit.load_model(exps["ctc"])
    wavs = [_audio(2.0)[:1520], _audio(2.0, 3)[:12240]]  # 8 feature frames; 67 (a first chunk of 640 ms) + 8
    alone = []
    for wav in wavs:
        s = model.stream(chunk_ms=640)
        s.accept_waveform(wav)
        alone.append(s.finish())
    rec = model.streaming_recognizer(chunk_ms=640)
    streams = [rec.create_stream(f"s{k}") for k in range(2)]
    for s, wav in zip(streams, wavs):
        s.accept_waveform(wav)
    rec.decode_streams(streams)  # the second stream's first chunk; the first waits for more audio
    assert [s._pending_frames for s in streams] == [8, 8]
    for s in streams:
        s.input_finished()
    rec.decode_streams(streams)
    for s, ref in zip(streams, alone):
        _same_result(s.result(), ref)


def test_a_partial_names_the_audio_it_needed(exps):
    """Partial.end is the least audio that gives the partial: the stream cut there reaches it, one sample less
    does not (a server measures partial latency from that sample)."""
    model = asrkit.load_model(exps["ctc"])
    wav = _audio(2.6)
    stream = model.stream(chunk_ms=320)
    assert stream.partial_result.end == 0.0
    ends = []
    for i in range(0, wav.numel(), 1600):
        stream.accept_waveform(wav[i: i + 1600])
        end = stream.partial_result.end
        assert end <= stream.duration + 1e-9
        if not ends or end != ends[-1]:
            ends.append(end)
    assert len(ends) >= 5  # 320 ms chunks over 2.6 s
    for end in ends[1:]:
        n = int(round(end * SR))
        cut = model.stream(chunk_ms=320)
        cut.accept_waveform(wav[:n])
        assert cut.partial_result.end == pytest.approx(end, abs=1e-9)
        short = model.stream(chunk_ms=320)
        short.accept_waveform(wav[:n - 1])
        assert short.partial_result.end < end
