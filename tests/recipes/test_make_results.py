"""tools/make_results.py: RESULTS.md from decode dirs scored by asrkit score, checked against jiwer."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import jiwer
import pytest

from asrkit.config import load_decode_config, save_config
from asrkit.data.table import write_table
from asrkit.score.wer import score_files, write_report
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
REFS = {
    "dev-clean": {"a-1-0001": "THE CAT SAT ON THE MAT", "a-1-0002": "HELLO WORLD", "b-2-0001": "GOOD MORNING TO YOU"},
    "test-clean": {"c-3-0001": "A VERY ODD GAME", "c-3-0002": "SHE COULD NOT COME"},
}
HYPS = {  # (setting, set) -> hypotheses with substitutions, deletions and insertions of their own
    ("greedy", "dev-clean"): {"a-1-0001": "THE CAT SAT ON MAT", "a-1-0002": "HELLO WORD", "b-2-0001": "GOOD MORNING"},
    ("greedy", "test-clean"): {"c-3-0001": "A VERY OLD GAME", "c-3-0002": ""},
    ("ctc_prefix_lm", "dev-clean"): {"a-1-0001": "THE CAT SAT ON THE MAT", "a-1-0002": "HELLO WORLD WORLD",
                                     "b-2-0001": "GOOD MORNING TO YOU"},
    ("ctc_prefix_lm", "test-clean"): {"c-3-0001": "A VERY ODD GAME", "c-3-0002": "SHE COULD NOT COME"},
}


mr = load_tool("make_results")


def _make_exp(tmp_path: Path) -> Path:
    """exp/decode_<setting>/<set>/ with text, decode.yaml and scoring/ as run.sh's stages 6-7 leave them."""
    exp = tmp_path / "exp" / "tiny"
    lm = tmp_path / "exp" / "lm" / "word3gram.arpa.gz"
    for (setting, part), hyps in HYPS.items():
        d = exp / f"decode_{setting}" / part
        d.mkdir(parents=True)
        if setting == "greedy":
            cfg = load_decode_config(str(REPO / "conf" / "decode_greedy.yaml"))
        else:
            cfg = replace(load_decode_config(str(REPO / "conf" / "decode_ctc_prefix_lm.yaml")), lm=str(lm),
                          lm_units="word", lm_weight=0.4, length_bonus=1.5)
        save_config(cfg, d / "decode.yaml")
        write_table(d / "text", hyps)
        ref = tmp_path / f"ref_{part}"
        write_table(ref, REFS[part])
        write_report(score_files(ref, d / "text"), d / "scoring")
    return exp


def _rows(text: str) -> List[List[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| eval set")]


def test_table_rows_match_jiwer_and_the_decode_configs(tmp_path, monkeypatch):
    exp = _make_exp(tmp_path)
    monkeypatch.chdir(tmp_path)  # paths in the report are shown relative to the working dir (the recipe's)
    assert mr.main([str(exp), "--config", str(REPO / "conf" / "tiny_transformer.yaml"), "--train-opts",
                    "--set train.epochs=1", "--settings", "greedy ctc_prefix_lm"]) == 0
    text = (exp / "RESULTS.md").read_text()
    rows = _rows(text)
    assert [r[:2] for r in rows] == [["dev-clean", "greedy"], ["dev-clean", "ctc_prefix_lm"],
                                     ["test-clean", "greedy"], ["test-clean", "ctc_prefix_lm"]]
    for r in rows:
        part, setting = r[0], r[1]
        utts = sorted(REFS[part])
        refs = [REFS[part][u] for u in utts]
        hyps = [HYPS[(setting, part)][u] for u in utts]
        m = jiwer.process_words(refs, hyps)
        n_ref = sum(len(x.split()) for x in refs)
        errors = m.substitutions + m.deletions + m.insertions
        assert float(r[10].strip("*")) == pytest.approx(100 * m.wer, abs=0.006)
        assert [int(x) for x in [r[8], r[9]] + r[11:15]] == [len(utts), n_ref, errors, m.substitutions,
                                                               m.deletions, m.insertions]
        bad = sum(a != b for a, b in zip(refs, hyps))
        assert float(r[15]) == pytest.approx(100 * bad / len(utts), abs=0.06)
        if setting == "greedy":
            assert r[2:8] == ["greedy", "1", "-", "-", "-", "-"]
        else:
            assert r[2:8] == ["ctc_prefix", "10", "-", os.path.join("exp", "lm", "word3gram.arpa.gz") + " (word)",
                              "0.4", "1.5"]
    assert "- model config: conf/tiny_transformer.yaml" in text and "--set train.epochs=1" in text
    # each setting's whole decode.yaml follows the table, once for the eval sets that share it
    assert "### ctc_prefix_lm (dev-clean, test-clean)" in text and "lm_weight: 0.4" in text


def test_rewritten_only_when_a_result_changes(tmp_path, capsys):
    exp = _make_exp(tmp_path)
    out = exp / "RESULTS.md"
    assert mr.main([str(exp)]) == 0
    first, mtime = out.read_text(), out.stat().st_mtime_ns
    os.utime(out, ns=(mtime - 10**9, mtime - 10**9))  # older: a rewrite would show
    mtime = out.stat().st_mtime_ns
    assert mr.main([str(exp)]) == 0
    assert out.stat().st_mtime_ns == mtime and out.read_text() == first
    assert "unchanged: " in capsys.readouterr().out
    # a decode dir rescored with other hypotheses: a new row value
    d = exp / "decode_greedy" / "test-clean"
    write_table(d / "text", REFS["test-clean"])
    ref = tmp_path / "ref_test-clean"
    write_report(score_files(ref, d / "text"), d / "scoring")
    assert mr.main([str(exp)]) == 0
    rows = {(r[0], r[1]): r for r in _rows(out.read_text())}
    assert rows[("test-clean", "greedy")][10] == "**0.00**"


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert mr.main([str(empty)]) == 1
    assert "no decode_<setting>/<set>/scoring/result.txt found" in capsys.readouterr().err

    exp = _make_exp(tmp_path)
    result = exp / "decode_greedy" / "dev-clean" / "scoring" / "result.txt"
    result.write_text("WER is low\n")
    assert mr.main([str(exp)]) == 1
    assert f"{result}:1: expected '%WER" in capsys.readouterr().err

    result.unlink()
    (exp / "decode_greedy" / "test-clean" / "decode.yaml").unlink()
    assert mr.main([str(exp)]) == 1
    err = capsys.readouterr().err
    assert str(exp / "decode_greedy" / "test-clean" / "decode.yaml") in err and "cannot read" in err


def test_parse_result_reads_asrkit_score_output(tmp_path):
    refs: Dict[str, str] = {"u1": "A B C D", "u2": "E F"}
    hyps = {"u1": "A X C D Y", "u2": ""}
    write_table(tmp_path / "ref", refs)
    write_table(tmp_path / "hyp", hyps)
    write_report(score_files(tmp_path / "ref", tmp_path / "hyp"), tmp_path / "scoring")
    s = mr.parse_result(str(tmp_path / "scoring" / "result.txt"))
    assert (s.unit, s.errors, s.n_ref, s.sub, s.dele, s.ins, s.n_err_snt, s.n_snt) == ("WER", 4, 6, 1, 2, 1, 2, 2)
    assert s.rate == pytest.approx(100 * 4 / 6, abs=0.006)
