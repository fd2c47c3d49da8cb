"""tools/seed_table.py: WER mean and spread per method over seeds, from run.sh's scoring logs."""
from __future__ import annotations

import pytest

from tool_loader import load_tool

seed_table = load_tool("seed_table")


def _exp(root, name, wers):
    """An experiment dir whose decode_<set>[_lm]/scoring.log hold the given WERs."""
    exp = root / name
    for (s, lm), wer in wers.items():
        d = exp / f"decode_{s}{'_lm' if lm else ''}"
        d.mkdir(parents=True)
        (d / "scoring.log").write_text(f"%WER {wer:.2f} [ 1 / 40, 0 ins, 0 del, 1 sub ]\n%SER 50.00 [ 1 / 2 ]\n")
    return str(exp)


def _wers(greedy, lm):
    return {("test", False): greedy, ("test", True): lm}


def test_table_pools_seeds_and_compares_with_the_first_method(tmp_path, capsys):
    runs = [f"plain={_exp(tmp_path, 'p1', _wers(40.0, 20.0))}",
            f"dejavu={_exp(tmp_path, 'd1', _wers(36.0, 17.0))}",
            f"dejavu={_exp(tmp_path, 'd2', _wers(38.0, 18.5))}",
            f"dejavu={_exp(tmp_path, 'd3', _wers(35.0, 16.0))}"]
    assert seed_table.main(["--sets", "test", *runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| method | runs | test greedy | test LM | LM vs first |"
    assert lines[1] == "| --- | --- | --- | --- | --- |"
    assert lines[2] == "| plain | 1 | 40.0% | 20.0% | +0.0% |"
    # mean of 17.0, 18.5, 16.0 = 17.1667 -> -14.2% against 20.0; greedy mean 36.33
    assert lines[3] == "| dejavu | 3 | 36.3% (35.0-38.0, n=3) | 17.2% (16.0-18.5, n=3) | -14.2% |"
    assert len(lines) == 4


def test_columns_follow_the_sets_in_order(tmp_path, capsys):
    wers = {("test", False): 30.0, ("test", True): 10.0, ("test_unseen", False): 60.0, ("test_unseen", True): 25.0}
    assert seed_table.main([f"m={_exp(tmp_path, 'a', wers)}"]) == 0  # default sets: test test_unseen
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| method | runs | test greedy | test LM | test_unseen greedy | test_unseen LM |")
    assert out[2] == "| m | 1 | 30.0% | 10.0% | 60.0% | 25.0% | +0.0% |"


def test_missing_or_malformed_scores_name_the_file(tmp_path, capsys):
    exp = _exp(tmp_path, "a", _wers(30.0, 10.0))
    assert seed_table.main(["--sets", "test test_unseen", f"m={exp}"]) == 1
    err = capsys.readouterr().err
    assert "decode_test_unseen/scoring.log: no such file" in err and "stage 7" in err
    (tmp_path / "a" / "decode_test_lm" / "scoring.log").write_text("Traceback (most recent call last):\n")
    assert seed_table.main(["--sets", "test", f"m={exp}"]) == 1
    assert "decode_test_lm/scoring.log: line 1 is not a '%WER x [ ... ]' line" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["plain", "=exp/a", "plain="])
def test_arguments_must_be_method_equals_exp(spec, capsys):
    assert seed_table.main(["--sets", "test", spec]) == 1
    assert f"argument {spec!r} is not METHOD=EXP" in capsys.readouterr().err
