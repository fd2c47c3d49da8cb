"""ARPA parsing: values, gzip, and clear errors naming file and line."""
import gzip
import shutil
from pathlib import Path

import pytest

from asrkit.lm.arpa import ArpaError, read_arpa

FIXTURES = Path(__file__).parent / "fixtures"


def test_reads_counts_values_and_vocab_order():
    lm = read_arpa(FIXTURES / "words_3gram.arpa")
    assert lm.order == 3
    assert lm.counts() == [10, 10, 4]
    assert lm.vocab[:4] == ["<unk>", "<s>", "</s>", "THE"]
    assert lm.ngrams[0][("MAT",)] == (-1.4, 0.1)  # positive back-off kept
    assert lm.ngrams[0][("</s>",)] == (-1.0, 0.0)  # missing back-off reads as 0
    assert lm.ngrams[1][("A", "DOG")] == (-0.55, -0.22)
    assert lm.ngrams[2][("THE", "CAT", "SAT")] == (-0.35, 0.0)


def test_gzip_equals_plain(tmp_path):
    gz = tmp_path / "lm.arpa"  # no .gz suffix: detected by magic bytes
    with open(FIXTURES / "words_3gram.arpa", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert read_arpa(gz).ngrams == read_arpa(FIXTURES / "words_3gram.arpa").ngrams


GOOD = "\\data\\\nngram 1=3\nngram 2=1\n\n\\1-grams:\n-1\t<s>\t-0.5\n-0.5\tA\t-0.2\n-0.7\t</s>\n\n" \
       "\\2-grams:\n-0.1\t<s> A\n\n\\end\\\n"


@pytest.mark.parametrize("old,new,message", [
    ("ngram 2=1", "ngram 2=2", "declares ngram 2=2 but the \\2-grams: section has 1"),
    ("-0.1\t<s> A\n", "-0.1\t<s> A B C\n", ":11: a 2-gram line needs 3 or 4 fields"),
    ("-0.5\tA\t-0.2", "-0.5\tA\tx", ":7: back-off 'x' is not a number"),
    ("-0.5\tA\t-0.2", "0.5\tA\t-0.2", ":7: positive log10 probability"),
    ("-0.1\t<s> A\n", "-0.1\t<s> A\t-0.3\n", ":11: highest-order 2-gram has a back-off"),
    ("-0.7\t</s>\n", "-0.7\t</s>\n-0.2\tA\n", ":9: duplicate 1-gram 'A'"),
    ("\\end\\\n", "", "missing \\end\\ marker"),
    ("\\data\\\n", "", "no \\data\\ header"),
    ("ngram 1=3\n", "ngram one=3\n", ":2: expected 'ngram K=COUNT'"),
    ("\\2-grams:", "\\3-grams:", ":10: section \\3-grams: but \\data\\ declares order 2"),
])
def test_errors_name_file_and_line(tmp_path, old, new, message):
    path = tmp_path / "bad.arpa"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ArpaError) as err:
        read_arpa(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_good_template_parses(tmp_path):
    path = tmp_path / "good.arpa"
    path.write_text(GOOD, encoding="utf-8")
    assert read_arpa(path).ngrams[1] == {("<s>", "A"): (-0.1, 0.0)}


def test_missing_file():
    with pytest.raises(ArpaError, match="cannot open"):
        read_arpa(FIXTURES / "nope.arpa")
