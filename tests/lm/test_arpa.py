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
    ("-0.1\t<s> A\n", "-0.1\t<s> A B C\n", ":11: a 2-gram line needs 3 or 4 fields, got 5: '-0.1\\t<s> A B C'"),
    ("-0.5\tA\t-0.2", "-0.5\tA\tx", ":7: back-off 'x' is not a number"),
    ("-0.5\tA\t-0.2", "0.5\tA\t-0.2", ":7: positive log10 probability"),
    ("-0.1\t<s> A\n", "-0.1\t<s> A\t-0.3\n", ":11: highest-order 2-gram has a back-off"),
    ("-0.7\t</s>\n", "-0.7\t</s>\n-0.2\tA\n", ":9: duplicate 1-gram 'A'"),
    ("\\end\\\n", "", "missing \\end\\ marker"),
    ("\\data\\\n", "", "no \\data\\ header"),
    ("ngram 1=3\n", "ngram one=3\n", ":2: expected 'ngram K=COUNT' in \\data\\, got 'ngram one=3'"),
    ("\\2-grams:", "\\3-grams:", ":10: section \\3-grams: but \\data\\ declares order 2"),
    # The unigram count is checked like the others (a reader that only checks orders >= 2 misses it).
    ("ngram 1=3", "ngram 1=4", "declares ngram 1=4 but the \\1-grams: section has 3 entries"),
    ("-0.5\tA\t-0.2", "x\tA\t-0.2", ":7: log-probability 'x' is not a number"),
    ("-0.5\tA\t-0.2", "nan\tA\t-0.2", ":7: log-probability is NaN"),
    ("-0.5\tA\t-0.2", "-0.5\tA\tNaN", ":7: back-off is NaN"),
    # Infinite values score garbage (inf - inf in the back-off sums): refused, each named.
    ("-0.5\tA\t-0.2", "-0.5\tA\tinf", ":7: back-off inf is not finite"),
    ("-0.5\tA\t-0.2", "-0.5\tA\t-inf", ":7: back-off -inf is not finite"),
    ("-0.5\tA\t-0.2", "-inf\tA\t-0.2", ":7: log-probability -inf is not finite (write -99"),
    ("-0.5\tA\t-0.2", "inf\tA\t-0.2", ":7: log-probability inf is not finite"),
    # A duplicate of a multi-word n-gram is named with its words space-separated.
    ("-0.1\t<s> A\n", "-0.1\t<s> A\n-0.2\t<s> A\n", ":12: duplicate 2-gram '<s> A'"),
    ("-0.1\t<s> A\n", "-0.1\t<s> A\n\\2-grams:\n-0.2\tA </s>\n", ":12: section \\2-grams: appears twice"),
    ("\\end\\\n", "\\fin\\\n", ":13: unexpected marker '\\\\fin\\\\'"),  # quoted escaped (repr)
    # Entries before any section header (a reader that starts "inside" the 1-gram section would take them).
    ("\\1-grams:\n", "", ":5: n-gram line outside any \\K-grams: section"),
    ("ngram 1=3\nngram 2=1\n", "", ":3: \\data\\ section declares no n-gram counts"),
    ("ngram 2=1", "ngram 3=1", ": \\data\\ declares orders [1, 3]; expected 1..3"),
])
def test_errors_name_file_and_line(tmp_path, old, new, message):
    path = tmp_path / "bad.arpa"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ArpaError) as err:
        read_arpa(path)
    assert str(err.value).startswith(f"{path}:")  # the message names the file first
    assert message in str(err.value)


def test_good_template_parses(tmp_path):
    path = tmp_path / "good.arpa"
    path.write_text(GOOD, encoding="utf-8")
    assert read_arpa(path).ngrams[1] == {("<s>", "A"): (-0.1, 0.0)}


def test_missing_file():
    with pytest.raises(ArpaError, match="cannot open"):
        read_arpa(FIXTURES / "nope.arpa")


def _write(tmp_path, text, name="lm.arpa"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_no_blank_line_before_the_first_section(tmp_path):
    # Some tools write `\1-grams:` right after the counts. A reader that needs the blank line drops the
    # section header (and then rejects or mis-files every n-gram after it).
    tight = GOOD.replace("ngram 2=1\n\n\\1-grams:", "ngram 2=1\n\\1-grams:")
    assert read_arpa(_write(tmp_path, tight)).ngrams == read_arpa(_write(tmp_path, GOOD, "good.arpa")).ngrams
    # The section header found that way is still checked, with its own line number.
    bad = "\\data\\\nngram 1=1\n\\2-grams:\n-0.1\t<s> A\n\\end\\\n"
    with pytest.raises(ArpaError, match=r"lm\.arpa:3: section \\2-grams: but \\data\\ declares order 1"):
        read_arpa(_write(tmp_path, bad))


def test_blank_lines_and_comments_around_the_counts(tmp_path):
    # A blank line between `\data\` and the counts must not end the header (it has no counts yet).
    loose = "written by some-tool\n\n" + GOOD.replace("\\data\\\n", "\\data\\\n\n")
    assert read_arpa(_write(tmp_path, loose)).ngrams == read_arpa(_write(tmp_path, GOOD, "good.arpa")).ngrams


def test_file_ending_right_after_data_names_that_line(tmp_path):
    path = _write(tmp_path, "# header comment\n\\data\\\n")
    with pytest.raises(ArpaError, match=r"lm\.arpa:2: \\data\\ section declares no n-gram counts"):
        read_arpa(path)


def test_log_prob_zero_is_a_valid_probability(tmp_path):
    # log10(1) = 0: a reader that rejects `prob >= 0` instead of `prob > 0` refuses valid models.
    text = GOOD.replace("-0.1\t<s> A", "0\t<s> A").replace("-0.5\tA\t-0.2", "0.0\tA\t-0.2")
    lm = read_arpa(_write(tmp_path, text))
    assert lm.ngrams[1][("<s>", "A")] == (0.0, 0.0)
    assert lm.ngrams[0][("A",)] == (0.0, -0.2)


def test_undecodable_or_truncated_files_are_arpa_errors(tmp_path):
    path = tmp_path / "latin1.arpa"
    path.write_bytes(GOOD.replace("\tA", "\tCAF\xc9").encode("latin-1"))  # not UTF-8
    with pytest.raises(ArpaError, match=r"latin1\.arpa: cannot read: .*utf-8"):
        read_arpa(path)
    gz = tmp_path / "cut.arpa.gz"
    gz.write_bytes(gzip.compress(GOOD.encode("utf-8"))[:40])  # truncated download
    with pytest.raises(ArpaError, match=r"cut\.arpa\.gz: cannot read"):
        read_arpa(gz)


def test_utf8_words_read_whatever_the_locale(tmp_path, c_locale):
    # ARPA files are UTF-8; a reader that opens them with the locale's encoding fails (or mis-decodes)
    # non-ASCII words under a C/ASCII or Windows locale. (Catches the bug when Python is not in UTF-8
    # mode, as here: sys.flags.utf8_mode == 0.)
    text = GOOD.replace("\tA", "\tCAFÉ").replace("<s> A", "<s> CAFÉ")
    plain = _write(tmp_path, text)
    gz = tmp_path / "lm.arpa.gz"
    gz.write_bytes(gzip.compress(text.encode("utf-8")))
    for path in (plain, gz):
        lm = read_arpa(path)
        assert lm.vocab == ["<s>", "CAFÉ", "</s>"], path
        assert lm.ngrams[1] == {("<s>", "CAFÉ"): (-0.1, 0.0)}


def test_a_utf8_byte_order_mark_is_read(tmp_path):
    # Editors on Windows write a BOM: a reader that keeps it sees "\ufeff\\data\\" and finds no header.
    plain = tmp_path / "bom.arpa"
    plain.write_bytes(b"\xef\xbb\xbf" + GOOD.encode("utf-8"))
    gz = tmp_path / "bom.arpa.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + GOOD.encode("utf-8")))
    want = read_arpa(_write(tmp_path, GOOD, "good.arpa")).ngrams
    for path in (plain, gz):
        assert read_arpa(path).ngrams == want, path


def test_non_finite_values_are_named_exactly(tmp_path):
    # The hint about -99 belongs to log-probabilities only; a back-off's message ends at "not finite".
    inf_backoff = _write(tmp_path, GOOD.replace("-0.5\tA\t-0.2", "-0.5\tA\tinf"))
    with pytest.raises(ArpaError, match=rf"^{inf_backoff}:7: back-off inf is not finite$"):
        read_arpa(inf_backoff)
    inf_prob = _write(tmp_path, GOOD.replace("-0.5\tA\t-0.2", "-inf\tA\t-0.2"), "prob.arpa")
    with pytest.raises(ArpaError, match=rf"^{inf_prob}:7: log-probability -inf is not finite \(write -99 for a "
                                        r"probability of 0, as SRILM does\)$"):
        read_arpa(inf_prob)
