"""Transcription results as text, JSONL, CTM, SRT or WebVTT.

One function per format turns one :class:`~asrkit.pipeline.results.Result` into a string;
:func:`write_results` writes many, either to one stream or one file per input.

* ``text``: ``name<TAB>transcript`` per input (one file per input: the transcript alone).
* ``jsonl``: one JSON object per input: ``name``, ``text``, ``duration``, ``words``
  (``word``, ``start``, ``end``, ``confidence``), ``segments`` (``start``, ``end``, ``text``),
  ``nbest`` (``text``, ``score``, ``ctc_score``; a score that is not finite is ``null``) and ``error``
  (``null`` on success). Times are seconds rounded to milliseconds. ``transcribe --streaming --partials`` puts
  ``{"name", "partial", "start"}`` lines (:func:`format_partial`) before an input's object.
* ``ctm``: ``<id> 1 <start> <dur> <word> <confidence>`` per word (NIST CTM with a confidence column), times
  rounded to 0.01 s; ``<id>`` is the name with whitespace replaced by ``_`` so there are always 6 columns.
* ``srt`` / ``vtt``: subtitle cues built from the words (see :func:`subtitle_cues`); SRT times
  ``HH:MM:SS,mmm``, WebVTT a ``WEBVTT`` header and ``HH:MM:SS.mmm`` (hours grow past 99 if they must).

A result with an error is left out of text, CTM, SRT and VTT (no file is written for it) and kept,
with its ``error``, in JSONL. An input with no words gives an empty CTM, and an SRT or VTT without cues
(still a valid file).
"""
from __future__ import annotations

import bisect
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

from asrkit.atomic import atomic_write
from asrkit.pipeline.results import Result, Word

FORMATS = ("text", "jsonl", "ctm", "srt", "vtt")
EXTENSIONS = {"text": "txt", "jsonl": "jsonl", "ctm": "ctm", "srt": "srt", "vtt": "vtt"}
STREAMABLE = ("text", "jsonl", "ctm")  # formats whose outputs for several inputs concatenate into one valid file
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".m4a", ".aac", ".sph", ".wma", ".webm")

# Subtitle layout (common broadcast guidelines: at most 2 lines of about 42 characters, a few seconds a cue).
MAX_CUE_SECONDS = 7.0
MAX_LINE_CHARS = 42
MAX_LINES = 2
MAX_PAUSE_SECONDS = 2.0  # a longer silence between words ends the cue: no text on screen over silence

_WS = re.compile(r"\s+")


def _one_line(text: str) -> str:
    """Whitespace (tabs, newlines included) collapsed to single spaces, so a record stays on its line."""
    return _WS.sub(" ", text).strip()


def _seconds(t: float, ndigits: int = 3) -> float:
    return round(float(t), ndigits)


def _finite_or_none(x: float) -> Optional[float]:
    return float(x) if math.isfinite(x) else None  # JSON has no -inf


# ---------------------------------------------------------------- text, JSONL, CTM

def format_text(result: Result) -> str:
    """``name<TAB>transcript\\n``; empty for a failed input."""
    if not result.ok:
        return ""
    return f"{_one_line(result.name)}\t{_one_line(result.text)}\n"


def result_to_dict(result: Result) -> Dict[str, object]:
    """The JSONL object of one input (see the module docstring for the schema)."""
    return {
        "name": result.name,
        "text": result.text,
        "duration": _seconds(result.duration),
        "words": [{"word": w.text, "start": _seconds(w.start), "end": _seconds(w.end),
                   "confidence": round(float(w.confidence), 4)} for w in result.words],
        "segments": [{"start": _seconds(s.start), "end": _seconds(s.end), "text": s.text} for s in result.segments],
        "nbest": [{"text": a.text, "score": _finite_or_none(a.score), "ctc_score": _finite_or_none(a.ctc_score)}
                  for a in result.nbest],
        "error": result.error,
    }


def format_jsonl(result: Result) -> str:
    """One JSON object and a newline; non-ASCII text is kept as is (the file is UTF-8)."""
    return json.dumps(result_to_dict(result), ensure_ascii=False, allow_nan=False) + "\n"


def format_partial(name: str, text: str, start: float) -> str:
    """A live stream's partial result as a JSONL line, ``{"name", "partial", "start"}``: the text of the utterance
    begun at ``start`` seconds, so far (``transcribe --streaming --partials``; a reader tells it from a result by
    its ``partial`` key)."""
    return json.dumps({"name": name, "partial": text, "start": _seconds(start)}, ensure_ascii=False) + "\n"


def _ctm_times(word: Word, duration: float) -> Tuple[float, float]:
    """(start, dur) in centiseconds-rounded seconds, kept inside [0, duration] so start + dur never passes the end."""
    start, end = round(max(word.start, 0.0), 2), round(max(word.end, 0.0), 2)
    if duration > 0:
        last = math.floor(duration * 100 + 1e-6) / 100  # the last centisecond inside the audio
        start, end = min(start, last), min(end, last)
    return start, round(max(end - start, 0.0), 2)


def format_ctm(result: Result) -> str:
    """One ``<id> 1 <start> <dur> <word> <confidence>`` line per word; empty for a failed input."""
    if not result.ok:
        return ""
    utt = _WS.sub("_", result.name.strip()) or "_"
    lines = []
    for w in result.words:
        word = _WS.sub("_", w.text.strip())
        if not word:
            continue
        start, dur = _ctm_times(w, result.duration)
        lines.append(f"{utt} 1 {start:.2f} {dur:.2f} {word} {min(max(w.confidence, 0.0), 1.0):.2f}\n")
    return "".join(lines)


# ---------------------------------------------------------------- subtitles

@dataclass(frozen=True)
class Cue:
    """One subtitle: shown from ``start`` to ``end`` seconds; ``lines`` are the text lines (at most MAX_LINES)."""

    start: float
    end: float
    lines: Tuple[str, ...]


def _wrap(words: Sequence[str], width: int) -> List[str]:
    """Greedy line filling; a word longer than ``width`` gets a line of its own."""
    lines: List[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines


def _word_groups(result: Result) -> List[List[Word]]:
    """The result's words split where one segment ends and the next begins (a word belongs to the segment
    its midpoint falls in), so no cue spans two segments."""
    words = [w for w in result.words if w.text.strip()]
    if not words:
        return []
    starts = sorted(s.start for s in result.segments)[1:]
    groups: List[List[Word]] = []
    current = -1
    for w in words:
        seg = bisect.bisect_right(starts, (w.start + w.end) / 2)
        if seg != current or not groups:
            groups.append([])
            current = seg
        groups[-1].append(w)
    return groups


def subtitle_cues(result: Result, max_seconds: float = MAX_CUE_SECONDS, max_chars: int = MAX_LINE_CHARS,
                  max_lines: int = MAX_LINES, max_pause: float = MAX_PAUSE_SECONDS) -> List[Cue]:
    """Cues from the words: a cue ends at a segment boundary, before a word that would take it past
    ``max_seconds`` or past ``max_lines`` lines of ``max_chars``, or at a pause over ``max_pause`` seconds.
    A cue runs from its first word's start to its last word's end (clipped to the audio).

    Without word times (a model with no CTC head) each segment is one cue, and a result without segments one
    cue over the whole input, its text wrapped the same way.
    """
    if not result.ok:
        return []
    limit = result.duration if result.duration > 0 else math.inf
    cues: List[Cue] = []

    def add(start: float, end: float, texts: Sequence[str]) -> None:
        start, end = max(start, 0.0), min(end, limit)
        if cues:  # rounding or odd word times must never make cues overlap or run backwards
            start = max(start, cues[-1].end)
        end = max(end, start)
        cues.append(Cue(start, end, tuple(_wrap(texts, max_chars))))

    groups = _word_groups(result)
    if groups:
        for group in groups:
            cue: List[Word] = []
            for w in group:
                if cue:
                    texts = [_one_line(x.text) for x in cue] + [_one_line(w.text)]
                    if (w.end - cue[0].start > max_seconds or w.start - cue[-1].end > max_pause
                            or len(_wrap(texts, max_chars)) > max_lines):
                        add(cue[0].start, cue[-1].end, [_one_line(x.text) for x in cue])
                        cue = []
                cue.append(w)
            add(cue[0].start, cue[-1].end, [_one_line(x.text) for x in cue])
        return cues
    # No word times: whole segments (or the whole input) as cues.
    spans = [(s.start, s.end, s.text) for s in result.segments] or [(0.0, result.duration, result.text)]
    for start, end, text in spans:
        if text.split():
            add(start, end, text.split())
    return cues


def _timestamp(t: float, sep: str) -> str:
    ms = int(round(max(t, 0.0) * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    seconds, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{sep}{ms:03d}"


def srt_timestamp(t: float) -> str:
    """``HH:MM:SS,mmm`` (SubRip)."""
    return _timestamp(t, ",")


def vtt_timestamp(t: float) -> str:
    """``HH:MM:SS.mmm`` (WebVTT)."""
    return _timestamp(t, ".")


def format_srt(result: Result) -> str:
    """SubRip: numbered cues separated by blank lines; empty for no cues."""
    return "".join(f"{i}\n{srt_timestamp(c.start)} --> {srt_timestamp(c.end)}\n" + "\n".join(c.lines) + "\n\n"
                   for i, c in enumerate(subtitle_cues(result), start=1))


def _vtt_escape(text: str) -> str:
    # A cue payload is HTML-like: these three must be escaped (and "-->" then cannot occur in it).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def format_vtt(result: Result) -> str:
    """WebVTT: the ``WEBVTT`` header, then cues separated by blank lines (just the header for no cues)."""
    cues = "".join(f"\n{vtt_timestamp(c.start)} --> {vtt_timestamp(c.end)}\n"
                   + "\n".join(_vtt_escape(line) for line in c.lines) + "\n" for c in subtitle_cues(result))
    return "WEBVTT\n" + cues


_FORMATTERS: Dict[str, Callable[[Result], str]] = {
    "text": format_text, "jsonl": format_jsonl, "ctm": format_ctm, "srt": format_srt, "vtt": format_vtt}


def format_result(result: Result, fmt: str) -> str:
    """One result in format ``fmt`` (one of :data:`FORMATS`)."""
    try:
        return _FORMATTERS[fmt](result)
    except KeyError:
        raise ValueError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})") from None


# ---------------------------------------------------------------- writing

_UNSAFE = re.compile(r"[^\w.+=@,-]")  # \w: Unicode letters and digits are kept


def output_stem(name: str) -> str:
    """A file-name stem for a result's name: its base name without an audio extension, with path
    separators, whitespace and other odd characters replaced by ``_`` (never hidden, never empty)."""
    base = re.split(r"[/\\]", name.rstrip("/\\"))[-1]
    root, ext = os.path.splitext(base)
    if ext.lower() in AUDIO_EXTENSIONS and root:
        base = root
    stem = _UNSAFE.sub("_", base).lstrip(".")[:200]
    return stem or "input"


class _Stems:
    """Unique stems in the order names arrive: a repeat gets ``_2``, ``_3``, ... (compared case-insensitively,
    since some file systems are)."""

    def __init__(self) -> None:
        self.used: set = set()

    def __call__(self, name: str) -> str:
        stem, k = output_stem(name), 1
        candidate = stem
        while candidate.casefold() in self.used:
            k += 1
            candidate = f"{stem}_{k}"
        self.used.add(candidate.casefold())
        return candidate


def write_results(results: Iterable[Result], fmt: str, out_dir: Optional[str | os.PathLike] = None,
                  stream: Optional[TextIO] = None) -> List[str]:
    """Write ``results`` in format ``fmt``; return the paths written (none when writing to a stream).

    Each result is written as it arrives (``results`` may be a generator still transcribing), so a run
    that is stopped leaves every finished result in place and whole.

    With ``out_dir``: one UTF-8 file per input, ``out_dir/<stem>.<ext>`` (:func:`output_stem`; names that
    give the same stem get ``_2``, ``_3``, ... in input order), each written whole or not at all; a failed
    input gets no file except in jsonl. Without: everything goes to ``stream`` (default ``sys.stdout``),
    flushed after each result. SRT and WebVTT cannot be concatenated, so a stream takes them for a single
    input only (ValueError on a second).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r} (choose from {', '.join(FORMATS)})")
    written: List[str] = []
    if out_dir is None:
        out = stream if stream is not None else sys.stdout
        for i, result in enumerate(results):
            if i and fmt not in STREAMABLE:
                raise ValueError(f"format {fmt} to one stream needs a single input: give an output dir")
            out.write(format_result(result, fmt))
            out.flush()
        return written
    os.makedirs(out_dir, exist_ok=True)
    stems = _Stems()
    for result in results:
        stem = stems(result.name)
        if not result.ok and fmt != "jsonl":
            continue
        text = _one_line(result.text) + "\n" if fmt == "text" else format_result(result, fmt)
        path = os.path.join(os.fspath(out_dir), f"{stem}.{EXTENSIONS[fmt]}")
        with atomic_write(path, newline="\n") as fh:
            fh.write(text)
        written.append(path)
    return written
