"""Output formats parse back with independent parsers: SRT (``srt``), WebVTT (``webvtt-py``), CTM by columns,
JSONL by ``json.loads`` checked field by field against the Result it came from."""
from __future__ import annotations

import html
import io
import json
import math
import os
import random
from datetime import timedelta

import pytest
import srt
import webvtt

from asrkit.pipeline.formats import (FORMATS, MAX_CUE_SECONDS, MAX_LINE_CHARS, MAX_LINES, MAX_PAUSE_SECONDS,
                                     format_result, output_stem, srt_timestamp, subtitle_cues, vtt_timestamp,
                                     write_results)
from asrkit.pipeline.results import Alternative, Result, Segment, Word

VOCAB = ["the", "cat", "sat", "on", "a", "mat", "café", "naïve", "Zürich", "日本語", "ñandú", "R&D", "<unk>",
         "extraordinarily", "x", "photosynthesis"]


def _speech(name: str = "talk.wav", offset: float = 0.0, n_words: int = 80, seed: int = 0) -> Result:
    """A result with known words: two segments (a split at 60% of the words), a few long pauses."""
    rng = random.Random(seed)
    t, words = offset + 0.3, []
    for i in range(n_words):
        if i == int(0.6 * n_words):
            t += 1.0  # the gap between the two segments
        elif rng.random() < 0.05:
            t += MAX_PAUSE_SECONDS + 0.5
        dur = rng.uniform(0.15, 0.6)
        words.append(Word(rng.choice(VOCAB), round(t, 3), round(t + dur, 3), rng.uniform(0.3, 1.0)))
        t += dur + rng.uniform(0.02, 0.3)
    split = int(0.6 * n_words)
    cut = (words[split - 1].end + words[split].start) / 2
    duration = t + 0.4  # times are in the whole input: an offset shifts the words, not the clock
    segs = [Segment(0.0, cut, " ".join(w.text for w in words[:split]), words[:split]),
            Segment(cut, duration, " ".join(w.text for w in words[split:]), words[split:])]
    text = " ".join(w.text for w in words)
    return Result(name, text, words, segs, [Alternative(text, -12.5, -3.25)], duration=duration)


def _failed(name: str = "broken.flac") -> Result:
    return Result(name, "", error=f"{name}: cannot decode audio")


def _segment_of(result: Result, t: float) -> int:
    return max(i for i, s in enumerate(result.segments) if s.start <= t) if result.segments else 0


# ---------------------------------------------------------------- text, JSONL, CTM

def test_text_lines_are_name_tab_transcript():
    results = [_speech("a b.wav"), _speech("odd\tname\n.wav", seed=1), _failed()]
    out = "".join(format_result(r, "text") for r in results)
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 3  # the failed input has no line
    for line, r in zip(lines[:-1], results[:2]):
        name, text = line.split("\t")
        assert name == " ".join(r.name.split()) and text == r.text


def _strict_json(line: str) -> dict:
    def no_constants(c):
        raise AssertionError(f"{c} is not JSON")
    return json.loads(line, parse_constant=no_constants)


def test_jsonl_schema_field_by_field():
    good = _speech()
    good.nbest.append(Alternative("the cat", -math.inf, -7.0))  # a pruned score: JSON has no -Infinity
    bad = _failed()
    lines = (format_result(good, "jsonl") + format_result(bad, "jsonl")).splitlines()
    assert len(lines) == 2
    obj, err = _strict_json(lines[0]), _strict_json(lines[1])
    assert set(obj) == {"name", "text", "duration", "words", "segments", "nbest", "error"}
    assert obj["name"] == good.name and obj["text"] == good.text and obj["error"] is None
    assert obj["duration"] == pytest.approx(good.duration, abs=5e-4)
    assert len(obj["words"]) == len(good.words)
    for o, w in zip(obj["words"], good.words):
        assert set(o) == {"word", "start", "end", "confidence"}
        assert o["word"] == w.text  # non-ASCII and <, & survive as they are
        assert o["start"] == pytest.approx(w.start, abs=5e-4) and o["end"] == pytest.approx(w.end, abs=5e-4)
        assert o["confidence"] == pytest.approx(w.confidence, abs=5e-5) and 0 <= o["confidence"] <= 1
    assert [(s["start"], s["end"], s["text"]) for s in obj["segments"]] == [
        (pytest.approx(s.start, abs=5e-4), pytest.approx(s.end, abs=5e-4), s.text) for s in good.segments]
    assert all(set(s) == {"start", "end", "text"} for s in obj["segments"])
    assert obj["nbest"] == [{"text": good.text, "score": -12.5, "ctc_score": -3.25},
                            {"text": "the cat", "score": None, "ctc_score": -7.0}]
    assert err == {"name": bad.name, "text": "", "duration": 0.0, "words": [], "segments": [], "nbest": [],
                   "error": bad.error}
    assert "日本語" in lines[0]  # written as UTF-8, not \u escapes


def test_ctm_columns():
    results = [_speech("my recording.wav"), _failed(), _speech("two", seed=5)]
    # A word ending exactly at the end of the audio, at a time that rounds up past it.
    last = Result("edge", "tail", [Word("tail", 0.5, 1.238, 0.9)], duration=1.238)
    ctm = "".join(format_result(r, "ctm") for r in results + [last])
    rows = [line.split(" ") for line in ctm.splitlines()]
    assert len(rows) == len(results[0].words) + len(results[2].words) + 1
    expected = [(r, w) for r in results + [last] if r.ok for w in r.words]
    for cols, (r, w) in zip(rows, expected):
        assert len(cols) == 6, cols
        utt, channel, start, dur, word, conf = cols
        assert utt == r.name.replace(" ", "_") and channel == "1" and word == w.text
        start, dur, conf = float(start), float(dur), float(conf)
        assert cols[2] == f"{start:.2f}" and cols[3] == f"{dur:.2f}"  # rounded to 0.01 s
        assert start == pytest.approx(w.start, abs=0.005 + 1e-9)
        assert start + dur == pytest.approx(min(w.end, r.duration), abs=0.01 + 1e-9)
        assert 0 <= start and dur >= 0 and start + dur <= r.duration + 1e-9  # within the input
        assert conf == pytest.approx(w.confidence, abs=0.005 + 1e-9)
    starts = [float(c[2]) for c in rows if c[0] == "my_recording.wav"]
    assert starts == sorted(starts)


# ---------------------------------------------------------------- subtitles

def _srt_seconds(td: timedelta) -> float:
    return td.total_seconds()


def _check_cues(result: Result, cues: list) -> None:
    """cues: [(start, end, [lines])] parsed back. Timing, layout and content against the result's words."""
    words = list(result.words)
    assert cues, "no cues"
    assert " ".join(" ".join(lines) for _, _, lines in cues).split() == [w.text for w in words]
    prev_end, k = 0.0, 0
    for start, end, lines in cues:
        n = sum(len(line.split()) for line in lines)
        first, last = words[k], words[k + n - 1]
        assert start == pytest.approx(first.start, abs=1e-3) and end == pytest.approx(last.end, abs=1e-3)
        assert prev_end <= start < end <= result.duration + 1e-3  # monotonic, within the audio
        assert 1 <= len(lines) <= MAX_LINES
        assert all(len(line) <= MAX_LINE_CHARS or " " not in line for line in lines)
        assert end - start <= MAX_CUE_SECONDS or n == 1
        assert all(b.start - a.end <= MAX_PAUSE_SECONDS for a, b in zip(words[k:k + n], words[k + 1:k + n]))
        assert _segment_of(result, (first.start + first.end) / 2) == _segment_of(result, (last.start + last.end) / 2)
        # Every break is needed: the next word would have crossed a segment, the time, the layout or a pause.
        if k + n < len(words):
            nxt = words[k + n]
            texts = [w.text for w in words[k:k + n + 1]]
            wrapped, line = [], ""
            for t in texts:  # greedy filling written out again
                if line and len(line) + 1 + len(t) <= MAX_LINE_CHARS:
                    line += " " + t
                else:
                    if line:
                        wrapped.append(line)
                    line = t
            wrapped.append(line)
            assert (_segment_of(result, (nxt.start + nxt.end) / 2) != _segment_of(result, (last.start + last.end) / 2)
                    or nxt.end - first.start > MAX_CUE_SECONDS or nxt.start - last.end > MAX_PAUSE_SECONDS
                    or len(wrapped) > MAX_LINES), f"cue broken for no reason before {nxt}"
        prev_end, k = end, k + n
    assert k == len(words)


def _parse_srt(text: str) -> list:
    subs = list(srt.parse(text))
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    return [(_srt_seconds(s.start), _srt_seconds(s.end), s.content.split("\n")) for s in subs]


def _vtt_seconds(ts) -> float:
    return ts.hours * 3600 + ts.minutes * 60 + ts.seconds + ts.milliseconds / 1000


def _parse_vtt(text: str) -> list:
    assert text.startswith("WEBVTT\n")
    vtt = webvtt.from_string(text, strict=True)
    return [(_vtt_seconds(c.start_time), _vtt_seconds(c.end_time), [html.unescape(x) for x in c.lines])
            for c in vtt.captions]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_srt_and_vtt_parse_back_with_cue_rules(seed):
    result = _speech(seed=seed, n_words=120)
    _check_cues(result, _parse_srt(format_result(result, "srt")))
    _check_cues(result, _parse_vtt(format_result(result, "vtt")))
    assert "R&amp;D" in format_result(result, "vtt") or "R&D" not in result.text  # escaped in the payload
    assert any("日本語" in line for _, _, lines in _parse_vtt(format_result(result, "vtt")) for line in lines)


def test_two_hour_times():
    assert srt_timestamp(7200.0) == "02:00:00,000" and vtt_timestamp(7200.0) == "02:00:00.000"
    assert srt_timestamp(7325.6784) == "02:02:05,678" and vtt_timestamp(59.9996) == "00:01:00.000"
    assert srt_timestamp(100 * 3600 + 1.5) == "100:00:01,500"
    late = _speech(offset=7190.0, n_words=60, seed=4)  # words from 2 h minus 10 s onwards
    cues = _parse_srt(format_result(late, "srt"))
    _check_cues(late, cues)
    assert cues[0][0] == pytest.approx(late.words[0].start, abs=1e-3) and cues[-1][1] > 7200
    _check_cues(late, _parse_vtt(format_result(late, "vtt")))


def test_empty_and_failed_inputs_give_valid_empty_files(tmp_path):
    empty = Result("silence.wav", "", duration=3.0)
    assert format_result(empty, "srt") == "" and list(srt.parse(format_result(empty, "srt"))) == []
    assert webvtt.from_string(format_result(empty, "vtt"), strict=True).captions == []
    assert format_result(empty, "ctm") == ""
    assert _strict_json(format_result(empty, "jsonl"))["words"] == []
    paths = {fmt: write_results([empty, _failed()], fmt, out_dir=tmp_path / fmt) for fmt in FORMATS}
    for fmt, written in paths.items():
        expected = ["silence", "broken"] if fmt == "jsonl" else ["silence"]  # failed inputs: jsonl only
        assert [os.path.basename(p).rsplit(".", 1)[0] for p in written] == expected, fmt
    assert (tmp_path / "vtt" / "silence.vtt").read_text(encoding="utf-8") == "WEBVTT\n"
    assert (tmp_path / "text" / "silence.txt").read_text(encoding="utf-8") == "\n"
    assert _strict_json((tmp_path / "jsonl" / "broken.jsonl").read_text(encoding="utf-8"))["error"]


def test_segments_without_word_times_become_cues():
    r = Result("noctc.wav", "hello there general kenobi", segments=[
        Segment(0.5, 2.0, "hello there"), Segment(3.0, 4.5, "general kenobi")], duration=5.0)
    assert [(s, e, lines) for s, e, lines in _parse_srt(format_result(r, "srt"))] == [
        (0.5, 2.0, ["hello there"]), (3.0, 4.5, ["general kenobi"])]
    assert [(c.start, c.end) for c in subtitle_cues(Result("x", "one two", duration=2.0))] == [(0.0, 2.0)]


# ---------------------------------------------------------------- writing

def test_write_results_file_names_are_safe_and_unique(tmp_path):
    names = ["a/b.wav", "c/b.wav", "B.FLAC", "x|;y z.wav", "../../etc/passwd", "日本.wav", "...", "utt-001",
             "b_2.wav"]
    results = [_speech(n, n_words=10, seed=i) for i, n in enumerate(names)]
    out = tmp_path / "out"
    written = write_results(results, "srt", out_dir=out)
    stems = [os.path.basename(p)[:-4] for p in written]
    assert stems == ["b", "b_2", "B_3", "x__y_z", "passwd", "日本", "input", "utt-001", "b_2_2"]
    assert sorted(os.listdir(out)) == sorted(f"{s}.srt" for s in stems)  # nothing written outside out/
    assert not os.path.exists(tmp_path / "etc")
    for p, r in zip(written, results):
        _check_cues(r, _parse_srt(open(p, encoding="utf-8").read()))
    assert output_stem("dir\\win.wav") == "win" and output_stem("talk.final.mp3") == "talk.final"


@pytest.mark.parametrize("fmt", ["text", "jsonl", "ctm"])
def test_streamable_formats_concatenate(fmt):
    results = [_speech("one.wav", n_words=8), _failed(), _speech("two.wav", n_words=5, seed=3)]
    buf = io.StringIO()
    assert write_results(iter(results), fmt, stream=buf) == []
    assert buf.getvalue() == "".join(format_result(r, fmt) for r in results)
    n_lines = {"text": 2, "jsonl": 3, "ctm": 13}[fmt]
    assert len(buf.getvalue().splitlines()) == n_lines


def test_subtitles_to_a_stream_need_one_input():
    buf = io.StringIO()
    write_results([_speech(n_words=6)], "vtt", stream=buf)
    assert len(_parse_vtt(buf.getvalue())) >= 1
    with pytest.raises(ValueError, match="single input"):
        write_results([_speech(n_words=6), _speech("b", n_words=6)], "srt", stream=io.StringIO())
    with pytest.raises(ValueError, match="unknown output format"):
        format_result(_speech(n_words=3), "ass")
