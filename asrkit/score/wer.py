"""Word/character error rates between Kaldi text files, with sclite-style reports.

Alignment is jiwer's (minimum edit distance, unit costs). Conventions:

* CER removes spaces and aligns the remaining characters (as ESPnet's
  training-time CER and WeNet's ``compute-wer.py --char`` do), so the figure does
  not depend on word segmentation and a wrong word boundary costs nothing.
* A reference utterance missing from the hypothesis scores as all deletions; a
  hypothesis utterance missing from the reference is listed and not scored.
* Rates are fractions (``0.1234``; reports print percentages). With zero
  reference tokens a rate is 0.0 when there are no errors and ``inf`` otherwise.
"""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import jiwer

from asrkit.data.table import read_table
from asrkit.text.normalize import normalize_text

GAP = "***"  # fills the REF or HYP column of an insertion or deletion


class ScoreError(ValueError):
    """Inputs that cannot be scored together (e.g. an utterance without a speaker)."""


def _ratio(num: int, den: int) -> float:
    if den:
        return num / den
    return 0.0 if num == 0 else float("inf")


@dataclass(frozen=True)
class Counts:
    """Error counts of one utterance, one speaker or a whole set."""

    corr: int = 0
    sub: int = 0
    dele: int = 0
    ins: int = 0
    n_snt: int = 0  # scored sentences
    n_err_snt: int = 0  # sentences with at least one error

    @property
    def n_ref(self) -> int:
        return self.corr + self.sub + self.dele

    @property
    def errors(self) -> int:
        return self.sub + self.dele + self.ins

    @property
    def wer(self) -> float:
        """Errors over reference tokens (the CER when the tokens are characters)."""
        return _ratio(self.errors, self.n_ref)

    @property
    def ser(self) -> float:
        return _ratio(self.n_err_snt, self.n_snt)

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.corr + other.corr, self.sub + other.sub, self.dele + other.dele,
                      self.ins + other.ins, self.n_snt + other.n_snt, self.n_err_snt + other.n_err_snt)


@dataclass(frozen=True)
class Edit:
    """One alignment column: op is C (correct), S, D or I; the gap side is None."""

    op: str
    ref: Optional[str]
    hyp: Optional[str]


@dataclass(frozen=True)
class UttResult:
    utt: str
    speaker: Optional[str]
    edits: Tuple[Edit, ...]
    counts: Counts
    missing: bool = False  # no hypothesis: scored as deletions


@dataclass(frozen=True)
class ScoreReport:
    """Everything ``asrkit score`` reports; the totals are exposed as attributes too."""

    unit: str  # "word" or "char"
    utts: Tuple[UttResult, ...]
    totals: Counts
    speakers: Dict[str, Counts]  # empty without utt2spk
    missing: Tuple[str, ...]  # reference utterances absent from the hypothesis
    extra: Tuple[Tuple[str, str], ...]  # (utt, text) of hypotheses not in the reference
    ref_name: str = "ref"
    hyp_name: str = "hyp"

    wer = property(lambda self: self.totals.wer)
    ser = property(lambda self: self.totals.ser)
    errors = property(lambda self: self.totals.errors)
    corr = property(lambda self: self.totals.corr)
    sub = property(lambda self: self.totals.sub)
    dele = property(lambda self: self.totals.dele)
    ins = property(lambda self: self.totals.ins)
    n_ref = property(lambda self: self.totals.n_ref)


def _tokens(text: str, cer: bool) -> List[str]:
    return list(text.replace(" ", "")) if cer else text.split()


def _edits_from_chunks(ref: Sequence[str], hyp: Sequence[str], chunks) -> List[Edit]:
    """Expand jiwer's alignment chunks into one Edit per column."""
    op_of = {"equal": "C", "substitute": "S"}
    edits: List[Edit] = []
    for ch in chunks:
        r = ref[ch.ref_start_idx:ch.ref_end_idx]
        h = hyp[ch.hyp_start_idx:ch.hyp_end_idx]
        if ch.type in op_of:
            edits += [Edit(op_of[ch.type], a, b) for a, b in zip(r, h)]
        elif ch.type == "delete":
            edits += [Edit("D", a, None) for a in r]
        elif ch.type == "insert":
            edits += [Edit("I", None, b) for b in h]
        else:
            raise ScoreError(f"unknown jiwer alignment type {ch.type!r}")
    return edits


def _align(pairs: List[Tuple[List[str], List[str]]], cer: bool) -> List[List[Edit]]:
    """Align (ref tokens, hyp tokens) pairs; empty sides are handled here because jiwer 3 rejects them."""
    out: List[List[Edit]] = [[Edit("D", t, None) for t in r] + [Edit("I", None, t) for t in h]
                             for r, h in pairs]
    both = [i for i, (r, h) in enumerate(pairs) if r and h]
    if both:
        # One batched call for all utterances rather than one call each.
        if cer:
            res = jiwer.process_characters(["".join(pairs[i][0]) for i in both],
                                           ["".join(pairs[i][1]) for i in both])
        else:
            res = jiwer.process_words([" ".join(pairs[i][0]) for i in both],
                                      [" ".join(pairs[i][1]) for i in both])
        for k, i in enumerate(both):
            out[i] = _edits_from_chunks(res.references[k], res.hypotheses[k], res.alignments[k])
    return out


def _count(edits: Sequence[Edit]) -> Counts:
    ops = [e.op for e in edits]
    c = Counts(ops.count("C"), ops.count("S"), ops.count("D"), ops.count("I"), n_snt=1)
    return replace(c, n_err_snt=int(c.errors > 0))


def score_texts(ref: Mapping[str, str], hyp: Mapping[str, str], *,
                utt2spk: Optional[Mapping[str, str]] = None, cer: bool = False,
                upper: bool = False, remove_punct: bool = False) -> ScoreReport:
    """Score ``{utt: transcript}`` dicts, in reference order (see the module docstring for conventions).

    ``upper``/``remove_punct`` are applied to both sides (:func:`normalize_text`).
    With ``utt2spk`` every reference utterance needs a speaker; extra entries are ignored.
    """
    if utt2spk is not None:
        lost = [u for u in ref if u not in utt2spk]
        if lost:
            more = f" (and {len(lost) - 5} more)" if len(lost) > 5 else ""
            raise ScoreError(f"utt2spk has no speaker for reference utterance(s) "
                             f"{', '.join(lost[:5])}{more}")

    def norm(text: str) -> List[str]:
        return _tokens(normalize_text(text, upper=upper, remove_punct=remove_punct), cer)

    utt_ids = list(ref)
    pairs = [(norm(ref[u]), norm(hyp.get(u, ""))) for u in utt_ids]
    utts = []
    totals = Counts()
    speakers: Dict[str, Counts] = {}
    for u, edits in zip(utt_ids, _align(pairs, cer)):
        spk = utt2spk[u] if utt2spk is not None else None
        counts = _count(edits)
        utts.append(UttResult(u, spk, tuple(edits), counts, missing=u not in hyp))
        totals = totals + counts
        if spk is not None:
            speakers[spk] = speakers.get(spk, Counts()) + counts
    return ScoreReport(
        unit="char" if cer else "word", utts=tuple(utts), totals=totals,
        speakers=dict(sorted(speakers.items())),
        missing=tuple(u for u in utt_ids if u not in hyp),
        extra=tuple((u, t) for u, t in hyp.items() if u not in ref))


def score_files(ref_path: str | os.PathLike, hyp_path: str | os.PathLike,
                utt2spk: str | os.PathLike | None = None, cer: bool = False,
                upper: bool = False, remove_punct: bool = False) -> ScoreReport:
    """Score two Kaldi ``text`` files (``uttid word ...``); see :func:`score_texts`.

    Raises ``TableError`` (file:line) for unreadable files or duplicate ids and
    ``ScoreError`` naming the utt2spk file when a speaker is missing.
    """
    ref, hyp = read_table(ref_path), read_table(hyp_path)
    spk_map = read_table(utt2spk, allow_empty_value=False) if utt2spk is not None else None
    try:
        report = score_texts(ref, hyp, utt2spk=spk_map, cer=cer, upper=upper, remove_punct=remove_punct)
    except ScoreError as exc:
        raise ScoreError(f"{os.fspath(utt2spk)}: {exc}" if utt2spk is not None else str(exc)) from None
    return replace(report, ref_name=os.fspath(ref_path), hyp_name=os.fspath(hyp_path))


# ---------------------------------------------------------------- reports

def _pct(num: int, den: int) -> str:
    return f"{100 * _ratio(num, den):.1f}"


def _table(report: ScoreReport) -> List[str]:
    """sclite-like table: per-speaker rows (when known) and the Sum/Avg row; percentages of ref tokens."""
    rows = list(report.speakers.items()) + [("Sum/Avg", report.totals)]
    unit = "#Chr" if report.unit == "char" else "#Wrd"
    cells = [[name, str(c.n_snt), str(c.n_ref)] + [_pct(x, c.n_ref) for x in (c.corr, c.sub, c.dele, c.ins, c.errors)]
             + [_pct(c.n_err_snt, c.n_snt)] for name, c in rows]
    header = ["SPKR", "#Snt", unit, "Corr", "Sub", "Del", "Ins", "Err", "S.Err"]
    widths = [max(len(r[i]) for r in cells + [header]) for i in range(len(header))]

    def line(r: List[str]) -> str:
        f = [r[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(r[1:], widths[1:])]
        return f"| {f[0]} | {' '.join(f[1:3])} | {' '.join(f[3:])} |"

    groups = (widths[0], widths[1] + 1 + widths[2], sum(widths[3:]) + len(widths) - 4)  # the 3 cell groups
    rule = "|" + "+".join("-" * (w + 2) for w in groups) + "|"
    body = [line(r) for r in cells]
    sep = [rule.replace("-", "=")] if len(body) > 1 else []
    return [line(header), rule] + body[:-1] + sep + body[-1:]


def format_report(report: ScoreReport) -> str:
    """Summary: a Kaldi ``compute-wer`` style ``%WER`` (or ``%CER``) line first, then the table."""
    t = report.totals
    name = "%CER" if report.unit == "char" else "%WER"
    lines = [f"{name} {100 * t.wer:.2f} [ {t.errors} / {t.n_ref}, {t.ins} ins, {t.dele} del, {t.sub} sub ]",
             f"%SER {100 * t.ser:.2f} [ {t.n_err_snt} / {t.n_snt} ]",
             f"Scored {t.n_snt} sentences, {len(report.missing)} not present in hyp (scored as deletions), "
             f"{len(report.extra)} hyp sentences not in ref (not scored).",
             f"reference: {report.ref_name}  hypothesis: {report.hyp_name}  unit: {report.unit}", ""]
    return "\n".join(lines + _table(report)) + "\n"


def _width(s: str) -> int:
    """Terminal columns of ``s``: CJK wide characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _aligned(rows: List[Tuple[str, List[str]]]) -> List[str]:
    """Print rows of equal length column-aligned, each column as wide as its widest cell."""
    widths = [max(_width(r[1][i]) for r in rows) for i in range(len(rows[0][1]))]
    return [(label + " ".join(c + " " * (w - _width(c)) for c, w in zip(cols, widths))).rstrip()
            for label, cols in rows]


def format_pra(report: ScoreReport) -> str:
    """Per-utterance alignments in the style of sclite's ``.pra``, with an EVAL line marking S/D/I."""
    out = [f"reference: {report.ref_name}", f"hypothesis: {report.hyp_name}", f"unit: {report.unit}",
           f"EVAL marks S (substitution), D (deletion), I (insertion); {GAP} fills gaps.", ""]
    for r in report.utts:
        c = r.counts
        out += [f"id: ({r.utt})", f"Scores: (#C #S #D #I) {c.corr} {c.sub} {c.dele} {c.ins}"]
        if r.speaker is not None:
            out.append(f"Speaker: {r.speaker}")
        if r.missing:
            out.append("Note: missing from hypothesis, scored as deletions")
        out += _aligned([("REF:  ", [e.ref if e.ref is not None else GAP for e in r.edits]),
                         ("HYP:  ", [e.hyp if e.hyp is not None else GAP for e in r.edits]),
                         ("EVAL: ", ["" if e.op == "C" else e.op for e in r.edits])])
        out.append("")
    if report.extra:
        out += ["Hypothesis utterances not in the reference (not scored):", ""]
        for utt, text in report.extra:
            out += [f"id: ({utt})", f"HYP:  {text}".rstrip(), ""]
    return "\n".join(out)


def write_report(report: ScoreReport, out_dir: str | os.PathLike) -> Tuple[str, str]:
    """Write ``result.txt`` (summary) and ``result.pra`` (alignments) under ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = (os.path.join(out_dir, "result.txt"), os.path.join(out_dir, "result.pra"))
    for path, text in zip(paths, (format_report(report), format_pra(report))):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return paths
