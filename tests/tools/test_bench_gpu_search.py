"""tools/bench/bench_gpu_search.py runs every section end to end (on the CPU, tiny sizes: a smoke test of the
script a GPU lease runs once) and its tables hold every row, with the captured loop agreeing with the eager one."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from asrkit.text.tokenizer import CharTokenizer
from test_bench_decode import SENTENCES, _write_bigram_arpa
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu_bench_lm")
    (root / "heldout.txt").write_text("\n".join(SENTENCES) + "\n")
    tok = CharTokenizer.train(SENTENCES)
    (root / "char").mkdir()
    tok.save(root / "char" / "tokenizer.json")
    _write_bigram_arpa(root / "word_3gram.arpa", SENTENCES, str.split)  # a 2-gram under the 3-gram's name
    return root


def test_every_section_writes_its_rows(lm_dir: Path, tmp_path: Path, capsys) -> None:
    tool = load_tool("bench/bench_gpu_search")
    out = tmp_path / "gpu.md"
    rc = tool.main(["--device", "cpu", "--lm-dir", str(lm_dir), "--lm-units", "char", "--frames", "40",
                    "--batches", "3", "--lm-batches", "2", "--e2e-batches", "2", "--repeats", "1",
                    "--config", str(REPO / "conf" / "tiny_ctc.yaml"), "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| V ")
            and not line.startswith("| batch ")]
    search = [r for r in rows if re.match(r"\| (29|500) \| 3 \|", r)]
    assert [r.split(" | ")[2] for r in search] == ["greedy", "asrkit eager", "asrkit captured",
                                                   "asrkit C++ loop, 1 CPU core"] * 2
    for vocab in ("29", "500"):  # the captured loop is the eager loop's search: the same agreement
        agree = {r.split(" | ")[2]: r.split(" | ")[-1] for r in search if r.startswith(f"| {vocab} ")}
        assert agree["asrkit eager"] == agree["asrkit captured"] != ""
    assert sum("CTC prefix" in r for r in rows) == 3 and sum("| greedy |" in r for r in rows) == 3
    assert sum("word 3-gram" in line for line in text.splitlines()) >= 1
