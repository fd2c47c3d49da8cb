"""asrkit.score against jiwer computed independently on the same scored pairs."""
from __future__ import annotations

import math
import re
import unicodedata

import jiwer
import pytest

from asrkit.data.table import TableError
from asrkit.score import ScoreError, format_pra, format_report, score_files, score_texts
from asrkit.text.normalize import normalize_text

# CRLF, tabs, repeated spaces, an id with no words, unicode (accents, CJK), a missing and an extra utterance.
REF = ("a1 the cat sat on the mat\r\n"
       "a2\tshe  sells\tsea shells\r\n"
       "a3 one two three\n"
       "b1\n"
       "b2\n"
       "b3 naïve café 日本語 テスト\n"
       "c1 hello world\n")
HYP = ("a1 the cat big sat in the mat\n"
       "a2 she sells shells\n"
       "b1 uh oh\n"
       "b2\n"
       "b3 naive café 日本 テスト extra\n"
       "c1 hello world\n"
       "z9 not in the reference\n")
UTT2SPK = "a1 A\na2 A\na3 A\nb1 B\nb2 B\nb3 B\nc1 C\nunused X\n"


@pytest.fixture()
def files(tmp_path):
    paths = {}
    for name, text in (("ref", REF), ("hyp", HYP), ("utt2spk", UTT2SPK)):
        paths[name] = tmp_path / name
        paths[name].write_bytes(text.encode("utf-8"))  # keep the CRLFs
    return paths


def _pairs(utts=None):
    """The pairs asrkit should score, built by hand: ref order, a missing hyp is the empty string."""
    ref = {line.split()[0]: " ".join(line.split()[1:]) for line in REF.splitlines()}
    hyp = {line.split()[0]: " ".join(line.split()[1:]) for line in HYP.splitlines()}
    keys = [u for u in ref if utts is None or u in utts]
    return [ref[u] for u in keys], [hyp.get(u, "") for u in keys]


def _check_counts(counts, jw):
    assert (counts.corr, counts.sub, counts.dele, counts.ins) == (jw.hits, jw.substitutions, jw.deletions,
                                                                   jw.insertions)
    assert counts.n_ref == jw.hits + jw.substitutions + jw.deletions


def test_word_totals_match_jiwer(files):
    rep = score_files(files["ref"], files["hyp"])
    refs, hyps = _pairs()
    jw = jiwer.process_words(refs, hyps)
    _check_counts(rep.totals, jw)
    assert rep.n_ref == 19 and rep.errors == jw.substitutions + jw.deletions + jw.insertions
    assert rep.wer == pytest.approx(jiwer.wer(refs, hyps))
    # A sentence is correct iff its token sequences are identical: SER needs no aligner.
    n_err = sum(r.split() != h.split() for r, h in zip(refs, hyps))
    assert rep.totals.n_snt == 7 and rep.ser == pytest.approx(n_err / 7)
    assert n_err == 5  # a1 a2 a3 b1 b3 wrong; b2 (empty/empty) and c1 correct


def test_per_utterance_counts_and_alignment(files):
    rep = score_files(files["ref"], files["hyp"])
    refs, hyps = _pairs()
    assert [r.utt for r in rep.utts] == ["a1", "a2", "a3", "b1", "b2", "b3", "c1"]
    for res, r, h in zip(rep.utts, refs, hyps):
        _check_counts(res.counts, jiwer.process_words([r], [h]))
        # The alignment columns spell out both sides, and each op agrees with its column.
        assert [e.ref for e in res.edits if e.ref is not None] == r.split()
        assert [e.hyp for e in res.edits if e.hyp is not None] == h.split()
        for e in res.edits:
            assert e.op == {(True, True): "S" if e.ref != e.hyp else "C", (True, False): "D",
                            (False, True): "I"}[(e.ref is not None, e.hyp is not None)]
    a1 = rep.utts[0]
    assert [e.op for e in a1.edits] == ["C", "C", "I", "C", "S", "C", "C"]


def test_missing_and_extra(files):
    rep = score_files(files["ref"], files["hyp"])
    assert rep.missing == ("a3",) and [r.utt for r in rep.utts if r.missing] == ["a3"]
    assert rep.extra == (("z9", "not in the reference"),)
    a3 = rep.utts[2]
    assert (a3.counts.dele, a3.counts.n_ref, a3.counts.errors) == (3, 3, 3)


def test_cer_matches_jiwer_without_spaces(files):
    rep = score_files(files["ref"], files["hyp"], cer=True)
    refs, hyps = _pairs()
    refs, hyps = [r.replace(" ", "") for r in refs], [h.replace(" ", "") for h in hyps]
    jw = jiwer.process_characters(refs, hyps)
    _check_counts(rep.totals, jw)
    assert rep.n_ref == sum(len(r) for r in refs)
    assert rep.wer == pytest.approx(jiwer.cer(refs, hyps))
    assert rep.unit == "char" and format_report(rep).startswith("%CER ")


def test_per_speaker_matches_jiwer_and_sums_to_totals(files):
    rep = score_files(files["ref"], files["hyp"], utt2spk=files["utt2spk"])
    assert list(rep.speakers) == ["A", "B", "C"]  # the unused utt2spk entry is ignored
    groups = {"A": {"a1", "a2", "a3"}, "B": {"b1", "b2", "b3"}, "C": {"c1"}}
    for spk, utts in groups.items():
        refs, hyps = _pairs(utts)
        _check_counts(rep.speakers[spk], jiwer.process_words(refs, hyps))
        assert rep.speakers[spk].n_snt == len(utts)
    for name in ("corr", "sub", "dele", "ins", "n_snt", "n_err_snt", "n_ref", "errors"):
        assert sum(getattr(c, name) for c in rep.speakers.values()) == getattr(rep.totals, name)
    # Speaker rows of the printed table carry the same figures.
    b = rep.speakers["B"]
    row = next(line for line in format_report(rep).splitlines() if line.startswith("| B "))
    nums = row.replace("|", " ").split()[1:]
    assert nums[:2] == [str(b.n_snt), str(b.n_ref)]
    assert float(nums[6]) == pytest.approx(100 * b.errors / b.n_ref, abs=0.05)
    assert float(nums[7]) == pytest.approx(100 * b.n_err_snt / b.n_snt, abs=0.05)


def test_utt2spk_without_a_reference_utterance(files, tmp_path):
    bad = tmp_path / "u2s_bad"
    bad.write_text("a1 A\n")
    with pytest.raises(ScoreError, match=r"u2s_bad.*a2, a3, b1, b2, b3 \(and 1 more\)"):
        score_files(files["ref"], files["hyp"], utt2spk=bad)


@pytest.mark.parametrize("which", ["ref", "hyp"])
def test_duplicate_id_names_both_lines(files, tmp_path, which):
    dup = tmp_path / f"dup_{which}"
    dup.write_text("x1 a b\nx2 c\n\tx1  d\n")
    args = (dup, files["hyp"]) if which == "ref" else (files["ref"], dup)
    with pytest.raises(TableError, match=rf"dup_{which}:3: duplicate key 'x1' \(first seen on line 1\)"):
        score_files(*args)


def test_empty_references():
    # Empty ref + non-empty hyp: insertions count; empty ref + empty hyp: a correct sentence.
    rep = score_texts({"u1": "a b", "u2": "", "u3": ""}, {"u1": "a b", "u2": "x y z", "u3": ""})
    jw = jiwer.process_words(["a b", "", ""], ["a b", "x y z", ""])
    _check_counts(rep.totals, jw)
    assert (rep.ins, rep.n_ref, rep.wer, rep.ser) == (3, 2, 1.5, pytest.approx(1 / 3))
    # No reference words at all: no division by zero.
    only_ins = score_texts({"u": ""}, {"u": "x"})
    assert math.isinf(only_ins.wer) and only_ins.ins == 1 and only_ins.ser == 1.0
    assert format_report(only_ins).splitlines()[0] == "%WER inf [ 1 / 0, 1 ins, 0 del, 0 sub ]"
    perfect = score_texts({"u": ""}, {"u": ""})
    assert (perfect.wer, perfect.ser, perfect.errors) == (0.0, 0.0, 0)
    nothing = score_texts({}, {"x": "a"})
    assert (nothing.wer, nothing.ser, nothing.extra) == (0.0, 0.0, (("x", "a"),))


def test_normalisation_options():
    assert normalize_text("  a\t b\u00a0\r\n c ") == "a b c"
    assert normalize_text("Don't, STOP--now! <unk>", remove_punct=True) == "Don't STOP now <unk>"
    assert normalize_text("straße", upper=True) == "STRASSE"
    ref, hyp = {"u": "Hello, World!"}, {"u": "hello world"}
    assert score_texts(ref, hyp).errors == 2
    assert score_texts(ref, hyp, upper=True).errors == 2  # punctuation still differs
    assert score_texts(ref, hyp, upper=True, remove_punct=True).errors == 0


def test_kaldi_wer_line(files):
    rep = score_files(files["ref"], files["hyp"])
    refs, hyps = _pairs()
    jw = jiwer.process_words(refs, hyps)
    n_err = jw.substitutions + jw.deletions + jw.insertions
    first = format_report(rep).splitlines()[0]
    assert first == (f"%WER {100 * jiwer.wer(refs, hyps):.2f} [ {n_err} / 19, {jw.insertions} ins, "
                     f"{jw.deletions} del, {jw.substitutions} sub ]")
    sum_row = next(line for line in format_report(rep).splitlines() if line.startswith("| Sum/Avg"))
    assert float(sum_row.replace("|", " ").split()[3]) == pytest.approx(100 * jw.hits / 19, abs=0.05)


def _display_starts(line: str):
    """Display column where each whitespace-separated field of ``line`` starts (CJK counts double)."""
    starts, col = [], 0
    for m in re.finditer(r"\S+|\s+", line):
        if not m.group().isspace():
            starts.append(col)
        col += sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in m.group())
    return starts


def test_pra_columns_are_aligned(files):
    rep = score_files(files["ref"], files["hyp"])
    pra = format_pra(rep)
    blocks = {b.splitlines()[0]: b.splitlines() for b in pra.split("\n\n") if b.startswith("id: (")}
    assert set(blocks) == {f"id: ({u})" for u in ("a1", "a2", "a3", "b1", "b2", "b3", "c1", "z9")}
    for res in rep.utts:
        lines = blocks[f"id: ({res.utt})"]
        c = res.counts
        assert lines[1] == f"Scores: (#C #S #D #I) {c.corr} {c.sub} {c.dele} {c.ins}"
        ref = next(x for x in lines if x.startswith("REF:"))
        hyp = next(x for x in lines if x.startswith("HYP:"))
        ev = next(x for x in lines if x.startswith("EVAL:"))
        # Every column starts at the same display position in REF and HYP; EVAL letters sit on error columns.
        assert _display_starts(ref)[1:] == _display_starts(hyp)[1:]
        starts = _display_starts(ref)[1:]
        err_cols = [starts[i] for i, e in enumerate(res.edits) if e.op != "C"]
        assert _display_starts(ev)[1:] == err_cols
        assert ev.split()[1:] == [e.op for e in res.edits if e.op != "C"]
        assert ref.split()[1:].count("***") == c.ins and hyp.split()[1:].count("***") == c.dele
    assert "Note: missing from hypothesis" in "\n".join(blocks["id: (a3)"])
    assert blocks["id: (z9)"][1] == "HYP:  not in the reference"
    b3_ref = next(x for x in blocks["id: (b3)"] if x.startswith("REF:"))
    assert "日本語" in b3_ref  # unicode survives untouched
