"""tools/make_lm_text.py: book text + transcripts, held-out sentences never written; the committed LM text."""
from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]


def _tool():
    return load_tool("make_lm_text")


def _kaldi(path: Path, rows: dict) -> Path:
    path.write_text("".join(f"{k} {v}\n" for k, v in rows.items()), encoding="utf-8")
    return path


def test_corpus_and_transcripts_are_written_minus_held_out_sentences(tmp_path):
    corpus = tmp_path / "books.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write("IT WAS A DARK NIGHT\n\nTHE TEST SENTENCE  HERE\nSHE SAID NO\n")
    train = _kaldi(tmp_path / "train_text", {"a1": "HELLO THERE", "a2": "SHE SAID NO"})
    test = _kaldi(tmp_path / "test_text", {"t1": "THE TEST SENTENCE HERE", "t2": "NEVER IN ANY TEXT"})
    dev = _kaldi(tmp_path / "dev_text", {"d1": "HELLO THERE"})
    out = tmp_path / "lm" / "text.txt"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_lm_text.py"), "--out", str(out),
                           "--corpus", str(corpus), "--transcripts", str(train), "--exclude", str(test), str(dev),
                           "--word-list", str(tmp_path / "words.txt")],
                          capture_output=True, text=True, check=True)
    # The held-out test sentence (with its double space normalised) and the dev sentence are gone,
    # everything else is kept in order, duplicates across sources included.
    assert out.read_text().splitlines() == ["IT WAS A DARK NIGHT", "SHE SAID NO", "SHE SAID NO"]
    assert "3 sentences, 11 words (2 held-out sentences left out)" in proc.stdout
    # The vocabulary is that of the written text only: no word of a held-out sentence leaks into the lexicon.
    assert (tmp_path / "words.txt").read_text().splitlines() == ["A", "DARK", "IT", "NIGHT", "NO", "SAID", "SHE", "WAS"]


def test_unnormalised_corpus_line_is_named(tmp_path):
    corpus = tmp_path / "books.txt"
    corpus.write_text("GOOD LINE\nA lower case line\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_lm_text.py"), "--out", str(tmp_path / "o.txt"),
                           "--corpus", str(corpus)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{corpus}:2: lower-case text" in proc.stderr
    assert not (tmp_path / "o.txt").exists()


def test_missing_input_file_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_lm_text.py"), "--out", str(tmp_path / "o.txt"),
                           "--exclude", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_committed_lm_text_holds_no_synthesized_sentence():
    """Every dev/test utterance of the synthetic corpus comes from sentences.txt: none may be in the LM text."""
    synthesized = set((REPO / "tools" / "corpus" / "sentences.txt").read_text(encoding="utf-8").splitlines())
    lines = [s for _, s in _tool().corpus_sentences(str(REPO / "tools" / "corpus" / "lm_text.txt.gz"))]
    assert len(lines) > 20000
    assert not synthesized & set(lines)
