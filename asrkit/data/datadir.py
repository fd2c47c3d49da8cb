"""Kaldi data directories: read, write, validate, fix, subset, combine.

A data dir holds ``wav.scp`` (recording -> path, or ``cmd |`` whose stdout is
audio) and optionally ``segments`` (``utt rec start end``, end ``-1`` = to the
end of the recording), ``text``, ``utt2spk``, ``spk2utt`` and ``utt2dur``.
Without ``segments`` a recording is an utterance. Relative audio paths resolve
against the current directory (Kaldi convention), not against the data dir.

:class:`DataDir` holds the tables as dicts; ``spk2utt`` is never stored but
derived from ``utt2spk`` (and always rewritten from it), so the two cannot
disagree. Keys are written sorted in C-locale byte order, as Kaldi's ``sort``
does (Python's ``str`` order on code points is the same as UTF-8 byte order).
The ``tools/*_data_dir.py`` scripts are thin wrappers over these functions.
"""
from __future__ import annotations

import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from asrkit.audio.io import AudioError, audio_duration
from asrkit.config import _quote  # the one rule for a piece of a file in a message: escaped, short
from asrkit.data.table import TableError, read_table, read_table_with_lines, write_table

#: Files this module reads and writes; others in a data dir are left untouched.
FILES = ("wav.scp", "segments", "text", "utt2spk", "spk2utt", "utt2dur")


class DataDirError(ValueError):
    """A data dir that cannot be used as asked; the message names the dir or file."""


@dataclass(frozen=True)
class Segment:
    rec: str
    start: float  # seconds
    end: Optional[float]  # seconds; None = to the end of the recording (-1 in the file)


@dataclass(frozen=True)
class Utterance:
    """One utterance as the dataset sees it; ``source`` is None when no audio entry exists."""
    utt: str
    source: Optional[str]  # wav.scp value: a path or "cmd |"
    start: float
    end: Optional[float]
    text: Optional[str]
    spk: Optional[str]
    duration: Optional[float]  # seconds, from utt2dur or the segment bounds; None if unknown without reading audio


@dataclass
class DataDir:
    """The tables of one data dir. ``None`` means the file is absent."""
    wav_scp: Dict[str, str] = field(default_factory=dict)
    segments: Optional[Dict[str, Segment]] = None
    text: Optional[Dict[str, str]] = None
    utt2spk: Optional[Dict[str, str]] = None
    utt2dur: Optional[Dict[str, float]] = None
    path: Optional[str] = None

    @property
    def spk2utt(self) -> Dict[str, List[str]]:
        return utt2spk_to_spk2utt(self.utt2spk or {})

    def audio_utts(self) -> List[str]:
        """Utterances that have an audio entry (segments keys, or wav.scp keys without segments), sorted."""
        return sorted(self.segments if self.segments is not None else self.wav_scp)

    def all_utts(self) -> List[str]:
        """Every utterance id named by any table, sorted."""
        keys = set(self.audio_utts())
        for table in (self.text, self.utt2spk, self.utt2dur):
            keys.update(table or ())
        return sorted(keys)

    def utterances(self) -> Iterator[Utterance]:
        """One :class:`Utterance` per id in :meth:`all_utts` (no audio is read)."""
        for utt in self.all_utts():
            source, start, end = None, 0.0, None
            if self.segments is not None:
                seg = self.segments.get(utt)
                if seg is not None:
                    source, start, end = self.wav_scp.get(seg.rec), seg.start, seg.end
            else:
                source = self.wav_scp.get(utt)
            dur = (self.utt2dur or {}).get(utt)
            if dur is None and end is not None:
                dur = end - start
            yield Utterance(utt, source, start, end, (self.text or {}).get(utt),
                            (self.utt2spk or {}).get(utt), dur)

    def subset(self, utts: Iterable[str]) -> "DataDir":
        """A new DataDir restricted to ``utts`` (and, with segments, to the recordings they use)."""
        keep = set(utts)

        def pick(table):
            return None if table is None else {k: v for k, v in table.items() if k in keep}
        segments = pick(self.segments)
        wav = (pick(self.wav_scp) if segments is None else
               {r: v for r, v in self.wav_scp.items() if r in {s.rec for s in segments.values()}})
        return DataDir(wav, segments, pick(self.text), pick(self.utt2spk), pick(self.utt2dur))


def utt2spk_to_spk2utt(utt2spk: Mapping[str, str]) -> Dict[str, List[str]]:
    """Invert utt2spk; each speaker's utterances in sorted order."""
    out: Dict[str, List[str]] = {}
    for utt in sorted(utt2spk):
        out.setdefault(utt2spk[utt], []).append(utt)
    return out


def format_seconds(x: Optional[float]) -> str:
    """Seconds as written in segments/utt2dur (microsecond precision, no trailing '.0'); None -> '-1'."""
    if x is None:
        return "-1"
    s = repr(round(float(x), 6))  # shortest text that reads back as the same float
    return s[:-2] if s.endswith(".0") else s


def _parse_segment(fields: Sequence[str]) -> Segment:
    """``[rec, start, end]`` -> Segment; ValueError saying what is wrong (syntax only)."""
    if len(fields) != 3:
        raise ValueError(f"expected 'utt rec start end', got {len(fields) + 1} fields")
    try:
        start, end = float(fields[1]), float(fields[2])
    except ValueError:
        raise ValueError(f"start/end {_quote(fields[1] + ' ' + fields[2])} are not numbers") from None
    return Segment(fields[0], start, None if end == -1 else end)


def _parse_duration(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"duration {_quote(text)} is not a number") from None


def read_data_dir(path: str | os.PathLike) -> DataDir:
    """Read a data dir; ``wav.scp`` is required. Raises TableError (file:line) for malformed lines."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataDirError(f"{path}: not a directory")
    p = lambda name: os.path.join(path, name)  # noqa: E731
    if not os.path.isfile(p("wav.scp")):
        raise DataDirError(f"{p('wav.scp')}: missing (every data dir needs a wav.scp)")
    dd = DataDir(read_table(p("wav.scp"), allow_empty_value=False), path=path)
    if os.path.isfile(p("segments")):
        dd.segments = {}
        for utt, (value, line) in read_table_with_lines(p("segments")).items():
            try:
                dd.segments[utt] = _parse_segment(value.split())
            except ValueError as exc:
                raise TableError(f"{p('segments')}:{line}: {exc}") from None
    if os.path.isfile(p("text")):
        dd.text = read_table(p("text"))
    if os.path.isfile(p("utt2spk")):
        dd.utt2spk = read_table(p("utt2spk"), allow_empty_value=False)
    if os.path.isfile(p("utt2dur")):
        dd.utt2dur = {}
        for utt, (value, line) in read_table_with_lines(p("utt2dur"), allow_empty_value=False).items():
            try:
                dd.utt2dur[utt] = _parse_duration(value)
            except ValueError as exc:
                raise TableError(f"{p('utt2dur')}:{line}: {exc}") from None
    return dd


def write_data_dir(dd: DataDir, path: str | os.PathLike) -> None:
    """Write ``dd`` into ``path`` (created if needed), sorted; spk2utt is derived from utt2spk.

    Files of :data:`FILES` that ``dd`` lacks are removed so the dir stays consistent.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tables = {
        "wav.scp": dd.wav_scp,
        "segments": None if dd.segments is None else {
            u: f"{s.rec} {format_seconds(s.start)} {format_seconds(s.end)}" for u, s in dd.segments.items()},
        "text": dd.text,
        "utt2spk": dd.utt2spk,
        "spk2utt": None if dd.utt2spk is None else {s: " ".join(u) for s, u in dd.spk2utt.items()},
        "utt2dur": None if dd.utt2dur is None else {u: format_seconds(d) for u, d in dd.utt2dur.items()},
    }
    for name, table in tables.items():
        target = os.path.join(path, name)
        if table is not None:
            write_table(target, table)
        elif os.path.exists(target):
            os.remove(target)


# ----------------------------------------------------------------------------- durations

def compute_utt2dur(dd: DataDir, *, only_missing: bool = False, jobs: int = 1
                    ) -> Tuple[Dict[str, float], Dict[str, str]]:
    """Durations of the utterances with audio: ``({utt: seconds}, {utt: error message})``.

    With segments, a segment with an explicit end needs no audio (end - start);
    one ending at ``-1`` needs its recording's length from the header. Without
    segments each wav.scp entry's header is read. ``only_missing``: keep the
    durations already known (utt2dur / segment bounds) and compute the rest.
    ``jobs`` > 1 reads headers in threads (worth it for ``cmd |`` sources).
    """
    known: Dict[str, float] = {}
    todo: Dict[str, Tuple[str, float]] = {}  # utt -> (recording id, segment start)
    for u in dd.utterances():
        if u.source is None:
            continue
        if only_missing and u.duration is not None:
            known[u.utt] = u.duration
        elif dd.segments is not None and u.end is not None:
            known[u.utt] = u.end - u.start
        else:
            todo[u.utt] = (dd.segments[u.utt].rec if dd.segments is not None else u.utt, u.start)
    recs = sorted({rec for rec, _ in todo.values()})

    def one(rec: str) -> Tuple[Optional[float], Optional[str]]:
        try:
            return audio_duration(dd.wav_scp[rec], name=rec), None
        except AudioError as exc:
            return None, str(exc)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rec_dur = dict(zip(recs, pool.map(one, recs)))
    errors: Dict[str, str] = {}
    for utt, (rec, start) in todo.items():
        dur, err = rec_dur[rec]
        if err is None:
            known[utt] = dur - start
        else:  # name the utterance, and the recording when they differ
            errors[utt] = err if rec == utt else err.replace(f"utt {rec}: ", f"utt {utt}: recording {rec}: ", 1)
    return known, errors


# ----------------------------------------------------------------------------- validate / fix

def _scan(path: str, problems: List[str]) -> Dict[str, Tuple[List[str], int]]:
    """Tolerant table reader for validation and repair: ``{key: (fields, line)}``.

    Unlike :func:`asrkit.data.table.read_table`, which stops at the first bad
    line, this records every empty, non-UTF-8, duplicate or out-of-order line in
    ``problems`` and keeps going (the first occurrence of a key wins).
    """
    records: Dict[str, Tuple[List[str], int]] = {}
    prev: Optional[str] = None
    unsorted_seen = False
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            where = f"{path}:{line}"
            try:
                fields = raw.decode("utf-8").split()
            except UnicodeDecodeError:
                problems.append(f"{where}: not valid UTF-8")
                continue
            if not fields:
                problems.append(f"{where}: empty line")
                continue
            key = fields[0]
            if key in records:
                problems.append(f"{where}: duplicate key '{key}' (first on line {records[key][1]})")
                continue
            if prev is not None and key < prev and not unsorted_seen:
                unsorted_seen = True  # one report per file: the lines after it are usually out of order too
                problems.append(f"{where}: not sorted: '{key}' comes after '{prev}' (C-locale byte order)")
            prev = key
            records[key] = (fields[1:], line)
    return records


def _one_field(what: str):
    def parse(fields: List[str]) -> str:
        if len(fields) != 1:
            raise ValueError(f"expected 'key {what}', got {len(fields) + 1} fields")
        return fields[0]
    return parse


def _checked_segment(fields: List[str]) -> Segment:
    seg = _parse_segment(fields)
    if seg.start < 0:
        raise ValueError(f"start {seg.start} < 0")
    if seg.end is not None and seg.end <= seg.start:
        raise ValueError(f"start {seg.start} >= end {seg.end}")
    return seg


def _positive_duration(fields: List[str]) -> float:
    dur = _parse_duration(_one_field("duration")(fields))
    if dur <= 0:
        raise ValueError(f"duration {fields[0]} is not positive")
    return dur


def _nonempty(fields: List[str]) -> str:
    if not fields:
        raise ValueError("no path or command")
    return " ".join(fields)


_TOLERANT = {"wav.scp": _nonempty, "segments": _checked_segment, "text": " ".join,
             "utt2spk": _one_field("speaker"), "utt2dur": _positive_duration, "spk2utt": list}


@dataclass
class _Inspection:
    """A data dir read tolerantly: the usable records plus everything wrong, with lines."""
    dd: DataDir
    spk2utt: Optional[Dict[str, List[str]]]
    lines: Dict[str, Dict[str, int]]  # file -> key -> line number
    line_problems: List[str]  # empty / duplicate / unsorted / non-UTF-8 lines: "file:line: what"
    problems: List[str]  # everything else wrong: "file:line: what"
    unusable: Dict[str, List[str]]  # utt -> reasons it cannot be kept


def _inspect(path: str) -> _Inspection:
    line_problems: List[str] = []
    problems: List[str] = []
    unusable: Dict[str, List[str]] = {}
    lines: Dict[str, Dict[str, int]] = {}
    tables: Dict[str, dict] = {}
    for name, parse in _TOLERANT.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        records = _scan(file, line_problems)
        lines[name] = {k: ln for k, (_, ln) in records.items()}
        tables[name] = {}
        for key, (fields, ln) in records.items():
            try:
                tables[name][key] = parse(fields)
            except ValueError as exc:
                problems.append(f"{file}:{ln}: '{key}': {exc}")
                if name != "spk2utt" and not (name == "wav.scp" and os.path.isfile(os.path.join(path, "segments"))):
                    unusable.setdefault(key, []).append(f"{name}:{ln}: {exc}")  # key is an utterance id
    dd = DataDir(tables.get("wav.scp", {}), tables.get("segments"), tables.get("text"), tables.get("utt2spk"),
                 tables.get("utt2dur"), path=path)
    for utt, seg in (dd.segments or {}).items():
        if seg.rec not in dd.wav_scp:
            ln = lines["segments"][utt]
            problems.append(f"{path}/segments:{ln}: recording '{seg.rec}' of utt '{utt}' has no entry in wav.scp")
            unusable.setdefault(utt, []).append(f"segments:{ln}: recording '{seg.rec}' not in wav.scp")
    # Every utt must be in every utt-keyed table that exists (by key, even if its line was bad).
    audio = "segments" if "segments" in lines else "wav.scp"
    keyed = [n for n in (audio, "text", "utt2spk", "utt2dur") if n in lines]
    for utt in sorted(set().union(*(lines[n] for n in keyed))):
        have = [n for n in keyed if utt in lines[n]]
        for name in keyed:
            if utt not in lines[name]:
                problems.append(f"{path}/{have[0]}:{lines[have[0]][utt]}: utt '{utt}' is not in {name}")
                unusable.setdefault(utt, []).append(f"not in {name}")
    return _Inspection(dd, tables.get("spk2utt"), lines, line_problems, problems, unusable)


@dataclass
class ValidationReport:
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_data_dir(path: str | os.PathLike, *, require_text: bool = True,
                      check_audio: bool = False) -> ValidationReport:
    """Check a data dir like Kaldi's validate_data_dir.sh and list every problem with file and line.

    Required: wav.scp, utt2spk, spk2utt and (unless ``require_text=False``) text.
    ``check_audio`` also opens each recording's header (missing/corrupt/empty files).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        return ValidationReport([f"{path}: not a directory"])
    ins = _inspect(path)
    rep = ValidationReport(ins.line_problems + ins.problems)
    required = ("wav.scp", "utt2spk", "spk2utt") + (("text",) if require_text else ())
    rep.problems += [f"{path}/{n}: missing" for n in required if n not in ins.lines]
    dd, lines = ins.dd, ins.lines
    rep.warnings += [f"{path}/text:{lines['text'][u]}: utt '{u}' has an empty transcript"
                     for u, words in (dd.text or {}).items() if not words]
    if dd.segments is not None:
        unused = sorted(set(dd.wav_scp) - {s.rec for s in dd.segments.values()})
        if unused:
            rep.warnings.append(f"{path}/wav.scp: {len(unused)} recordings have no segment, e.g. {unused[:3]}")
    if dd.utt2spk is not None and ins.spk2utt is not None:
        listed: Dict[str, int] = {}
        for spk, utts in ins.spk2utt.items():
            where = f"{path}/spk2utt:{lines['spk2utt'][spk]}"
            if not utts:
                rep.problems.append(f"{where}: speaker '{spk}' has no utterances")
            for utt in utts:
                if utt in listed:
                    rep.problems.append(f"{where}: utt '{utt}' listed again (first on line {listed[utt]})")
                elif dd.utt2spk.get(utt) != spk:
                    rep.problems.append(f"{where}: utt '{utt}' is under speaker '{spk}' but utt2spk says "
                                        f"'{dd.utt2spk.get(utt, '(nothing)')}'")
                listed.setdefault(utt, lines["spk2utt"][spk])
        rep.problems += [f"{path}/utt2spk:{lines['utt2spk'][u]}: utt '{u}' is not in spk2utt"
                         for u in dd.utt2spk if u not in listed]
    if check_audio:
        for rec, src in dd.wav_scp.items():
            try:
                audio_duration(src, name=rec)
            except AudioError as exc:
                rep.problems.append(f"{path}/wav.scp:{lines['wav.scp'][rec]}: {exc}")
    return rep


@dataclass
class FixReport:
    kept: int
    dropped: Dict[str, List[str]]  # utt -> reasons
    notes: List[str]

    def summary(self) -> str:
        total = self.kept + len(self.dropped)
        out = [f"kept {self.kept} of {total} utterances, dropped {len(self.dropped)}"]
        out += [f"  dropped {u}: {'; '.join(r)}" for u, r in sorted(self.dropped.items())]
        return "\n".join(out + [f"  repaired: {n}" for n in self.notes])


def fix_data_dir(path: str | os.PathLike) -> FixReport:
    """Repair a data dir in place, like Kaldi's fix_data_dir.sh, after copying its files to ``path/.backup/``.

    Sorts every table; drops empty, duplicate (the first occurrence wins) and
    malformed lines; keeps only utterances present in every utt-keyed table whose
    segment is valid (start < end, recording in wav.scp) and whose utt2dur is
    positive; drops recordings no segment uses; rewrites spk2utt from utt2spk
    (if utt2spk is missing, each utterance becomes its own speaker).
    """
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "wav.scp")):
        raise DataDirError(f"{os.path.join(path, 'wav.scp')}: missing (every data dir needs a wav.scp)")
    ins = _inspect(path)
    kept = [u for u in ins.dd.all_utts() if u not in ins.unusable]
    if not kept:
        raise DataDirError(f"{path}: no utterance is valid and present in all of "
                           f"{', '.join(n for n in ins.lines if n != 'spk2utt')}; nothing was changed")
    fixed = ins.dd.subset(kept)
    notes = list(ins.line_problems)
    if fixed.utt2spk is None:
        fixed.utt2spk = {u: u for u in kept}
        notes.append("utt2spk was missing: each utterance is its own speaker")
    backup = os.path.join(path, ".backup")
    os.makedirs(backup, exist_ok=True)
    for name in FILES:
        if os.path.isfile(os.path.join(path, name)):
            shutil.copy2(os.path.join(path, name), os.path.join(backup, name))
    write_data_dir(fixed, path)
    return FixReport(len(kept), ins.unusable, notes)


# ----------------------------------------------------------------------------- subset / combine

def subset_data_dir(dd: DataDir, *, first: Optional[int] = None, last: Optional[int] = None,
                    random_n: Optional[int] = None, seed: int = 0, utt_list: Optional[Sequence[str]] = None,
                    spk_list: Optional[Sequence[str]] = None) -> DataDir:
    """Select utterances by exactly one criterion (in sorted utt order for first/last)."""
    chosen = [k for k, v in dict(first=first, last=last, random_n=random_n, utt_list=utt_list,
                                 spk_list=spk_list).items() if v is not None]
    if len(chosen) != 1:
        raise DataDirError(f"choose exactly one of first, last, random_n, utt_list, spk_list (got {chosen or 'none'})")
    utts = dd.audio_utts()
    n = first if first is not None else last if last is not None else random_n
    if n is not None and not 0 < n <= len(utts):
        raise DataDirError(f"asked for {n} utterances but the data dir has {len(utts)}")
    if first is not None:
        keep = utts[:first]
    elif last is not None:
        keep = utts[-last:]
    elif random_n is not None:
        keep = random.Random(seed).sample(utts, random_n)
    elif utt_list is not None:
        have = set(utts)
        keep = [u for u in utt_list if u in have]
    else:
        if dd.utt2spk is None:
            raise DataDirError("selecting speakers needs utt2spk")
        spks = set(spk_list)
        keep = [u for u in utts if dd.utt2spk.get(u) in spks]
    return dd.subset(keep)


def combine_data_dirs(dirs: Sequence[Tuple[str, DataDir]]) -> Tuple[DataDir, List[str]]:
    """Merge ``(name, DataDir)`` pairs; returns the result and notes about files left out.

    An utterance id in two dirs is an error naming both. If some dirs have
    segments, the others get whole-recording segments (``utt utt 0 -1``).
    text/utt2spk/utt2dur are kept only if every dir has them.
    """
    notes: List[str] = []
    with_segments = any(d.segments is not None for _, d in dirs)
    owner: Dict[str, str] = {}
    dup: List[str] = []
    for name, d in dirs:
        for utt in d.all_utts():
            if utt in owner:
                dup.append(f"'{utt}' is in both {owner[utt]} and {name}")
            owner.setdefault(utt, name)
    if dup:
        more = f" (and {len(dup) - 10} more)" if len(dup) > 10 else ""
        raise DataDirError("duplicate utterance ids: " + "; ".join(dup[:10]) + more)
    out = DataDir(segments={} if with_segments else None)
    rec_owner: Dict[str, str] = {}
    for name, d in dirs:
        for rec, src in d.wav_scp.items():
            if rec in out.wav_scp and out.wav_scp[rec] != src:
                raise DataDirError(f"recording '{rec}' is in both {rec_owner[rec]} and {name} with different audio")
            out.wav_scp[rec] = src
            rec_owner.setdefault(rec, name)
        if with_segments:
            out.segments.update(d.segments if d.segments is not None else
                                {u: Segment(u, 0.0, None) for u in d.wav_scp})
    for attr in ("text", "utt2spk", "utt2dur"):
        have = [getattr(d, attr) for _, d in dirs]
        if all(h is not None for h in have):
            setattr(out, attr, {k: v for h in have for k, v in h.items()})
        elif any(h is not None for h in have):
            missing = [name for name, d in dirs if getattr(d, attr) is None]
            notes.append(f"{attr} left out: missing in {', '.join(missing)}")
    return out, notes
