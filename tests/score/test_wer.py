"""asrkit.score against jiwer computed independently on the same scored pairs."""
from __future__ import annotations

import math
import re
import unicodedata

import jiwer
import pytest

from asrkit.data.table import TableError
from asrkit.score import ScoreError, format_pra, format_report, score_files, score_texts, write_report
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


# ------------------------------------------------------------------ options and defaults

def test_score_texts_defaults_are_case_and_punctuation_sensitive():
    """Catches a flipped default (upper/remove_punct on by default): WER quietly under-reported."""
    assert score_texts({"u": "Hello there"}, {"u": "hello there"}).errors == 1  # "Hello" vs "hello": 1 sub
    assert score_texts({"u": "a, b"}, {"u": "a b"}).errors == 1  # "a," vs "a": 1 sub


def test_score_files_defaults_and_options_reach_the_scorer(tmp_path):
    """Catches score_files dropping or not forwarding upper/remove_punct (CLI flags silently ignored),
    and flipped defaults in score_files. Hand counts: "Hello, World!" vs "hello world" is 2 subs
    until both options are on; each option alone still leaves 2 (case or punctuation differs)."""
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("u1 Hello, World!\nu2 a, b\nu3 Yes\n", encoding="utf-8")
    hyp.write_text("u1 hello world\nu2 a b\nu3 yes\n", encoding="utf-8")
    errs = lambda **kw: [r.counts.errors for r in score_files(ref, hyp, **kw).utts]  # noqa: E731
    assert errs() == [2, 1, 1]
    assert errs(upper=True) == [2, 1, 0]
    assert errs(remove_punct=True) == [2, 0, 1]
    assert errs(upper=True, remove_punct=True) == [0, 0, 0]


def test_utt2spk_line_without_speaker_is_an_error(files, tmp_path):
    """Catches reading utt2spk with empty values allowed: "a2" alone would become speaker ''."""
    u2s = tmp_path / "u2s_empty"
    u2s.write_text("a1 A\na2\n")
    with pytest.raises(TableError, match=r"u2s_empty:2: no value for key 'a2'"):
        score_files(files["ref"], files["hyp"], utt2spk=u2s)


def test_utt2spk_error_lists_up_to_five_without_suffix():
    """Catches an off-by-one in the "(and N more)" suffix (printing "(and 0 more)" at exactly 5)."""
    ref = {f"u{i}": "a" for i in range(1, 6)}
    with pytest.raises(ScoreError) as exc:
        score_texts(ref, ref, utt2spk={"other": "S"})
    assert str(exc.value) == "utt2spk has no speaker for reference utterance(s) u1, u2, u3, u4, u5"
    with pytest.raises(ScoreError) as exc:
        score_texts({"u1": "a", "u2": "b"}, {}, utt2spk={"u1": "S"})
    assert str(exc.value) == "utt2spk has no speaker for reference utterance(s) u2"


def test_unknown_alignment_op_is_reported(monkeypatch, tmp_path):
    """Catches a jiwer alignment op that asrkit does not know being dropped, or reported without its name,
    and score_files mangling the error when there is no utt2spk (os.fspath(None) TypeError, or 'None')."""
    from types import SimpleNamespace

    def fake(refs, hyps):
        chunk = SimpleNamespace(type="transpose", ref_start_idx=0, ref_end_idx=1, hyp_start_idx=0, hyp_end_idx=1)
        return SimpleNamespace(references=[r.split() for r in refs], hypotheses=[h.split() for h in hyps],
                               alignments=[[chunk] for _ in refs])

    monkeypatch.setattr(jiwer, "process_words", fake)
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("u1 a\n")
    hyp.write_text("u1 b\n")
    with pytest.raises(ScoreError, match=r"^unknown jiwer alignment type 'transpose'$"):
        score_files(ref, hyp)


# ------------------------------------------------------------------ exact report layout (hand-written)

def test_report_golden_words_without_speakers():
    """The whole summary written out by hand: catches a wrong %SER line, wrong unit names (#Wrd/word),
    mis-sized columns or rule (ljust/rjust, group widths), a '=' separator with no speaker rows,
    and a missing blank line or final newline.
    u1 "a b c d" vs "a x c d y": C a, S b/x, C c, C d, I y; u2 "e f" correct.
    Totals 5 C, 1 S, 0 D, 1 I over 6 words: 2 errors (33.33%), 1 of 2 sentences wrong (50%)."""
    rep = score_texts({"u1": "a b c d", "u2": "e f"}, {"u1": "a x c d y", "u2": "e f"})
    assert rep.unit == "word" and all(r.speaker is None for r in rep.utts)
    expected = (
        "%WER 33.33 [ 2 / 6, 1 ins, 0 del, 1 sub ]\n"
        "%SER 50.00 [ 1 / 2 ]\n"
        "Scored 2 sentences, 0 not present in hyp (scored as deletions), 0 hyp sentences not in ref (not scored).\n"
        "reference: ref  hypothesis: hyp  unit: word\n"
        "\n"
        "| SPKR    | #Snt #Wrd | Corr  Sub Del  Ins  Err S.Err |\n"
        "|---------+-----------+-------------------------------|\n"
        "| Sum/Avg |    2    6 | 83.3 16.7 0.0 16.7 33.3  50.0 |\n")
    assert format_report(rep) == expected
    pra = format_pra(rep)
    assert "Speaker:" not in pra and "Hypothesis utterances not in the reference" not in pra
    assert "id: (u1)\nScores: (#C #S #D #I) 3 1 0 1\nREF:  a b c d ***\nHYP:  a x c d y\nEVAL:   S     I\n" in pra


def _golden_files(tmp_path):
    ref, hyp, u2s = tmp_path / "ref.txt", tmp_path / "hyp.txt", tmp_path / "utt2spk"
    ref.write_text("u1 ab cd\nu2 ef\n", encoding="utf-8")
    hyp.write_text("u1 abd\nu3 zz\nu4\n", encoding="utf-8")
    u2s.write_text("u1 spk1\nu2 spk1\n", encoding="utf-8")
    return ref, hyp, u2s


def test_report_golden_chars_one_speaker(tmp_path):
    """Catches a dropped/duplicated speaker row, a missing '=' separator between speaker rows and
    Sum/Avg, #Chr/char unit names, and lost ref/hyp file names.
    CER: u1 "abcd" vs "abd" is 3 C + 1 D (c); u2 "ef" has no hypothesis: 2 D. 3 errors / 6 chars = 50%,
    both sentences wrong (100%). u3 and u4 are hypotheses without a reference."""
    ref, hyp, u2s = _golden_files(tmp_path)
    rep = score_files(ref, hyp, utt2spk=u2s, cer=True)
    assert (rep.ref_name, rep.hyp_name) == (str(ref), str(hyp))
    row = "|    2    6 | 50.0 0.0 50.0 0.0 50.0 100.0 |"
    expected = (
        "%CER 50.00 [ 3 / 6, 0 ins, 3 del, 0 sub ]\n"
        "%SER 100.00 [ 2 / 2 ]\n"
        "Scored 2 sentences, 1 not present in hyp (scored as deletions), 2 hyp sentences not in ref (not scored).\n"
        f"reference: {ref}  hypothesis: {hyp}  unit: char\n"
        "\n"
        "| SPKR    | #Snt #Chr | Corr Sub  Del Ins  Err S.Err |\n"
        "|---------+-----------+------------------------------|\n"
        f"| spk1    {row}\n"
        "|=========+===========+==============================|\n"
        f"| Sum/Avg {row}\n")
    assert format_report(rep) == expected


def test_pra_golden_with_speakers_missing_and_extra(tmp_path):
    """Catches .pra output with utt2spk printing no/wrong Speaker lines, altered notes and headers, an
    extra hypothesis with no words printed as 'HYP:  ' (trailing blanks), and broken block separators."""
    ref, hyp, u2s = _golden_files(tmp_path)
    rep = score_files(ref, hyp, utt2spk=u2s, cer=True)
    assert [r.speaker for r in rep.utts] == ["spk1", "spk1"]
    expected = "\n".join([
        f"reference: {ref}", f"hypothesis: {hyp}", "unit: char",
        "EVAL marks S (substitution), D (deletion), I (insertion); *** fills gaps.", "",
        "id: (u1)", "Scores: (#C #S #D #I) 3 0 1 0", "Speaker: spk1",
        "REF:  a b c   d",
        "HYP:  a b *** d",
        "EVAL:     D", "",
        "id: (u2)", "Scores: (#C #S #D #I) 0 0 2 0", "Speaker: spk1",
        "Note: missing from hypothesis, scored as deletions",
        "REF:  e   f",
        "HYP:  *** ***",
        "EVAL: D   D", "",
        "Hypothesis utterances not in the reference (not scored):", "",
        "id: (u3)", "HYP:  zz", "",
        "id: (u4)", "HYP:", ""])
    assert format_pra(rep) == expected


def test_speaker_rows_each_once_in_sorted_order():
    """Catches a speaker row dropped or duplicated in the per-speaker table, or speakers left unsorted.
    Hand counts: carol u3 "x y" vs "x" (1 D, 2 words); alice u1 correct (1 word) and u4 "p" vs "q" (1 S);
    bob u2 "m n o" vs "m n o z" (1 I, 3 words)."""
    rep = score_texts({"u1": "a", "u2": "m n o", "u3": "x y", "u4": "p"},
                      {"u1": "a", "u2": "m n o z", "u3": "x", "u4": "q"},
                      utt2spk={"u1": "alice", "u2": "bob", "u3": "carol", "u4": "alice"})
    lines = format_report(rep).splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| SPKR")]
    assert [r.split()[1] for r in rows] == ["alice", "bob", "carol", "Sum/Avg"]
    # name, #Snt, #Wrd, Corr, Sub, Del, Ins, Err, S.Err (percent of reference words / sentences)
    figures = {"alice": ["2", "2", "50.0", "50.0", "0.0", "0.0", "50.0", "50.0"],
               "bob": ["1", "3", "100.0", "0.0", "0.0", "33.3", "33.3", "100.0"],
               "carol": ["1", "2", "50.0", "0.0", "50.0", "0.0", "50.0", "100.0"],
               "Sum/Avg": ["4", "7", "71.4", "14.3", "14.3", "14.3", "42.9", "75.0"]}
    for r in rows:
        cells = r.replace("|", " ").split()
        assert cells[1:] == figures[cells[0]], r
    # One '=' separator, right before Sum/Avg; every line of the table has the same width.
    table = lines[lines.index(next(x for x in lines if x.startswith("| SPKR"))):]
    assert [x for x in table if "=" in x] == [table[-2]]
    assert len({len(x) for x in table}) == 1
    assert lines[1] == "%SER 75.00 [ 3 / 4 ]"


def test_pra_columns_with_combining_marks():
    """Catches counting a combining accent (decomposed "é" = "e" + U+0301) as a display column,
    which pushes every later HYP/EVAL column out of line with REF."""
    rep = score_texts({"u": "cafe\u0301 x"}, {"u": "cafe y"})
    lines = format_pra(rep).splitlines()
    assert "REF:  cafe\u0301 x" in lines
    assert "HYP:  cafe y" in lines
    assert "EVAL: S    S" in lines


# ------------------------------------------------------------------ writing the report files

def test_write_report_into_existing_dir_twice(tmp_path):
    """Catches write_report failing when the output directory already exists (re-scoring into --out),
    and checks it creates missing parents and writes exactly the formatted texts."""
    rep = score_texts({"u": "a b"}, {"u": "a c"})
    assert write_report(rep, tmp_path) == (str(tmp_path / "result.txt"), str(tmp_path / "result.pra"))
    write_report(rep, tmp_path)  # again: overwrites
    txt, pra = write_report(rep, tmp_path / "new" / "dir")
    with open(txt, encoding="utf-8") as fh:
        assert fh.read() == format_report(rep)
    with open(pra, encoding="utf-8") as fh:
        assert fh.read() == format_pra(rep)


def test_write_report_is_utf8_under_a_c_locale(tmp_path, c_locale):
    """Catches files opened in the locale's encoding: with LANG=C (common on servers and in containers)
    writing Japanese alignments raises UnicodeEncodeError, or produces non-UTF-8 bytes."""
    import sys

    if sys.flags.utf8_mode:
        pytest.skip("Python UTF-8 mode makes the locale encoding UTF-8")
    rep = score_texts({"u": "日本語 テスト"}, {"u": "日本 テスト"})
    txt, pra = write_report(rep, tmp_path)
    with open(pra, "rb") as fh:
        assert "REF:  日本語 テスト".encode("utf-8") in fh.read()
    with open(txt, "rb") as fh:
        assert fh.read().decode("utf-8") == format_report(rep)


def test_table_layout_with_five_digit_counts():
    """Catches the rule line sized from the wrong column (e.g. #Wrd's width used for #Snt): with 10000+
    reference words the #Wrd column is wider than its header and the rule no longer meets the '|'s.
    12000 words, 1 substituted: counts hand-known, and every table line has the same '|'/'+' positions."""
    words = ["w"] * 12000
    rep = score_texts({"u": " ".join(words)}, {"u": " ".join(["x"] + words[1:])})
    assert (rep.n_ref, rep.sub, rep.corr) == (12000, 1, 11999)
    lines = format_report(rep).splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("| SPKR"))):]
    assert table[2] == "| Sum/Avg |    1 12000 | 100.0 0.0 0.0 0.0 0.0 100.0 |"
    bars = [[i for i, ch in enumerate(x) if ch in "|+"] for x in table]
    assert all(b == bars[0] for b in bars) and len({len(x) for x in table}) == 1
