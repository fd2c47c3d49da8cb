"""An error about a file quotes at most its line number and a short, escaped excerpt, and nothing of a file that
is not of the expected kind at all: ``lexicon: /etc/shadow`` in a decode config printed the file's first lines
(its password hashes) in the error about them."""
from __future__ import annotations

import pytest

from asrkit.cli import main
from asrkit.data.table import TableError, read_table
from asrkit.lm.arpa import ArpaError, read_arpa
from tests.pipeline.tiny_exp import make_tiny_exp, tone, write_data_dir

SHADOW = ("root:$6$SECRETsalt$SECREThashSECREThashSECREThash:19000:0:99999:7:::\n"
          "daemon:*:19000:0:99999:7:::\n"
          "user SECRET2 more:x\n")


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_tiny_exp(tmp_path_factory.mktemp("excerpts") / "exp")


def test_a_lexicon_that_is_no_word_list_is_not_quoted(exp, tmp_path, capsys):
    shadow = tmp_path / "shadow"
    shadow.write_text(SHADOW)
    (tmp_path / "decode.yaml").write_text(f"mode: ctc_prefix\nlexicon: {shadow}\n")
    data = write_data_dir(tmp_path / "data", {"a": tone(0.5, 300)})
    assert main(["decode", "--model", str(exp), "--data", str(data), "--out", str(tmp_path / "out"),
                 "--decode-config", str(tmp_path / "decode.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asrkit decode: decode.lexicon {shadow}: "), err
    assert "SECRET" not in err[0] and "$6$" not in err[0] and "none of the 3 words" in err[0]


def test_a_lexicon_with_a_few_unspellable_words_quotes_them_briefly(exp, tmp_path):
    from asrkit.search import LexiconScorer

    words = ["ABC", "DEF", "X" * 200 + "\x1b[2J"]  # the last: too long, and a terminal escape
    tokens = ["<blank>", "<unk>", "<sos/eos>", "\u2581", "A", "B", "C", "D", "E", "F"]
    with pytest.warns(UserWarning) as caught:
        LexiconScorer(words, tokens)
    message = str(caught[0].message)
    assert "1 of 3 words" in message and "\x1b" not in message and "\\x1b" not in message
    assert "X" * 20 in message and "X" * 21 not in message


def test_a_table_whose_first_record_fails_is_not_quoted(tmp_path):
    path = tmp_path / "wav.scp"
    path.write_text(SHADOW)
    with pytest.raises(TableError) as info:
        read_table(path, allow_empty_value=False)
    assert str(info.value) == f"{path}:1: no value after the key (is this a Kaldi table file?)"


def test_a_later_bad_record_is_quoted_short_and_escaped(tmp_path):
    path = tmp_path / "wav.scp"
    path.write_text("a a.wav\n" + "k" * 300 + "\x1b[2J\n")
    with pytest.raises(TableError) as info:
        read_table(path, allow_empty_value=False)
    message = str(info.value)
    assert message.startswith(f"{path}:2: no value for key 'kkk") and "\x1b" not in message
    assert len(message) < len(str(path)) + 100
    path.write_text("a a.wav\n" + "d" * 300 + " x\n" + "d" * 300 + " y\n")
    with pytest.raises(TableError, match=r":3: duplicate key 'd+\.\.\.d+' \(first seen on line 2\)") as info:
        read_table(path)
    assert len(str(info.value)) < len(str(path)) + 120


def test_transcribe_scp_that_is_no_wav_scp_is_one_line_quoting_nothing(exp, tmp_path, capsys):
    shadow = tmp_path / "shadow"
    shadow.write_text(SHADOW)
    assert main(["transcribe", "--model", str(exp), "--scp", str(shadow), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "SECRET" not in err and "$6$" not in err
    assert err.strip().splitlines() == [
        f"asrkit transcribe: {shadow}:1: no value after the key (is this a Kaldi table file?)"]


def test_arpa_lines_are_quoted_short(tmp_path):
    arpa = tmp_path / "lm.arpa"
    arpa.write_text("\\data\\\nngram 1=2\n\n\\1-grams:\n-1.0 <s> " + "w" * 300 + " extra fields\n-1.0 </s>\n"
                    "\\end\\\n")
    with pytest.raises(ArpaError) as info:
        read_arpa(str(arpa))
    assert ":5: a 1-gram line needs 2 or 3 fields, got 5" in str(info.value)
    assert len(str(info.value)) < len(str(arpa)) + 140
