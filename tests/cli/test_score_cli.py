"""`asrkit score` end to end on small files, checked against jiwer."""
from __future__ import annotations

import jiwer
import pytest

from asrkit.cli import main as asrkit_main
from asrkit.cli.score import main

REF = "u1 the cat sat on the mat\r\nu2\tgood  morning\nu3 a b c\nu4\n"
HYP = "u1 the cat sat in the hat\nu2 good morning everyone\nu4\nu9 stray\n"


@pytest.fixture()
def ref_hyp(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_bytes(REF.encode())
    hyp.write_bytes(HYP.encode())
    (tmp_path / "utt2spk").write_text("u1 s1\nu2 s1\nu3 s2\nu4 s2\n")
    return ref, hyp, tmp_path / "utt2spk"


def test_score_cli_prints_and_writes(ref_hyp, tmp_path, capsys):
    ref, hyp, u2s = ref_hyp
    out = tmp_path / "out"
    assert main(["--ref", str(ref), "--hyp", str(hyp), "--utt2spk", str(u2s), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    refs = ["the cat sat on the mat", "good morning", "a b c", ""]
    hyps = ["the cat sat in the hat", "good morning everyone", "", ""]
    jw = jiwer.process_words(refs, hyps)
    n_err = jw.substitutions + jw.deletions + jw.insertions
    assert stdout.splitlines()[0] == (f"%WER {100 * jiwer.wer(refs, hyps):.2f} [ {n_err} / 11, "
                                      f"{jw.insertions} ins, {jw.deletions} del, {jw.substitutions} sub ]")
    assert stdout.splitlines()[1] == "%SER 75.00 [ 3 / 4 ]"
    assert any(line.startswith("| s1 ") for line in stdout.splitlines())
    summary = (out / "result.txt").read_text(encoding="utf-8")
    assert stdout.startswith(summary)
    pra = (out / "result.pra").read_text(encoding="utf-8")
    assert "id: (u1)\nScores: (#C #S #D #I) 4 2 0 0\n" in pra
    assert "REF:  the cat sat on the mat\nHYP:  the cat sat in the hat\nEVAL:             S      S\n" in pra
    assert "id: (u3)" in pra and "id: (u9)" in pra and "Note: missing from hypothesis" in pra


def test_score_cli_cer_through_dispatcher(ref_hyp, capsys):
    ref, hyp, _ = ref_hyp
    assert asrkit_main(["score", "--ref", str(ref), "--hyp", str(hyp), "--cer"]) == 0
    refs = ["thecatsatonthemat", "goodmorning", "abc", ""]
    hyps = ["thecatsatinthehat", "goodmorningeveryone", "", ""]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"%CER {100 * jiwer.cer(refs, hyps):.2f} [ ")


def test_score_cli_errors(ref_hyp, tmp_path, capsys):
    ref, hyp, _ = ref_hyp
    dup = tmp_path / "dup.txt"
    dup.write_text("u1 a\nu2 b\nu1 c\n")
    assert main(["--ref", str(ref), "--hyp", str(dup)]) == 1
    assert "dup.txt:3: duplicate key 'u1' (first seen on line 1)" in capsys.readouterr().err
    assert main(["--ref", str(tmp_path / "nope"), "--hyp", str(hyp)]) == 1
    assert "nope: cannot open" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # --out names a file
        main(["--ref", str(ref), "--hyp", str(hyp), "--out", str(dup)])
    assert exc.value.code == 2 and "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("flags, n_err", [([], 4), (["--upper"], 2), (["--remove-punct"], 3),
                                          (["--upper", "--remove-punct"], 0)])
def test_score_cli_normalisation_flags(tmp_path, capsys, flags, n_err):
    """Catches --upper/--remove-punct being accepted but silently ignored (or always on).
    Hand counts over 4 reference words: "Hello," vs "hello" differs in case and punctuation,
    "World"/"world" and "Yes"/"yes" in case only, "again!" vs "again" in punctuation only."""
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("u1 Hello, World Yes again!\n", encoding="utf-8")
    hyp.write_text("u1 hello world yes again\n", encoding="utf-8")
    assert main(["--ref", str(ref), "--hyp", str(hyp), *flags]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"%WER {100 * n_err / 4:.2f} [ {n_err} / 4, 0 ins, 0 del, {n_err} sub ]"


@pytest.mark.parametrize("bad_side", ["hyp", "ref"])
@pytest.mark.parametrize("bad_line", [3, 1500])  # 1500: far past the text reader's first decoded chunk
def test_score_cli_invalid_utf8_names_file_and_line(tmp_path, capsys, bad_side, bad_line):
    lines = [f"u{i} caf\u00e9 \u65e5\u672c {i}".encode() for i in range(1, 2001)]  # valid multi-byte UTF-8
    good = b"\n".join(lines) + b"\n"
    broken = list(lines)
    broken[bad_line - 1] = f"u{bad_line} caf".encode() + b"\xe9 au lait"  # Latin-1 e-acute: not UTF-8
    good_path, bad_path = tmp_path / "good.txt", tmp_path / "bad.txt"
    good_path.write_bytes(good)
    bad_path.write_bytes(b"\n".join(broken) + b"\n")
    # The reference for the line number: count the newlines before the first byte that fails to decode.
    with pytest.raises(UnicodeDecodeError) as info:
        bad_path.read_bytes().decode("utf-8")
    expected_line = bad_path.read_bytes()[:info.value.start].count(b"\n") + 1
    assert expected_line == bad_line
    ref, hyp = (good_path, bad_path) if bad_side == "hyp" else (bad_path, good_path)
    assert asrkit_main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert captured.err.startswith(f"asrkit score: error: {bad_path}: line {expected_line}: not valid UTF-8 (0xe9 ")
    assert len(captured.err.strip().splitlines()) == 1
