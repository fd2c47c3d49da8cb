import base64
import json

import pytest

from asrkit.text.tokenizer import WORD_MARK, CharTokenizer, load_tokenizer, train_sentencepiece

TEXTS = ["THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG", "IT'S A SMALL WORLD AFTER ALL",
         "SHE SELLS SEA SHELLS BY THE SEA SHORE", "HOW MUCH WOOD WOULD A WOODCHUCK CHUCK"] * 20


def test_char_round_trip_and_special_ids(tmp_path):
    tok = CharTokenizer.train(TEXTS)
    assert tok.token_list[:4] == ["<blank>", "<unk>", "<sos/eos>", WORD_MARK]
    assert (tok.blank_id, tok.unk_id, tok.sos_eos_id) == (0, 1, 2)
    for s in TEXTS[:4]:
        ids = tok.encode(s)
        assert len(ids) == len(s) and tok.decode(ids) == s
    assert tok.encode("A  B\tC") == tok.encode("A B C")
    assert tok.encode("Q~")[1] == tok.unk_id
    tok.save(tmp_path / "t.json")
    again = load_tokenizer(tmp_path / "t.json")
    assert again.token_list == tok.token_list


def test_char_decode_drops_blank_and_sos():
    tok = CharTokenizer.train(["AB"])
    a, b = tok.encode("AB")
    assert tok.decode([0, a, 2, 0, b]) == "AB"


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_round_trip(tmp_path, model_type):
    tok = train_sentencepiece(TEXTS, vocab_size=60, model_type=model_type)
    assert tok.token_list[:3] == ["<blank>", "<unk>", "<sos/eos>"]
    assert tok.vocab_size <= 60
    for s in TEXTS[:4]:
        ids = tok.encode(s)
        assert all(i > 2 for i in ids)
        assert tok.decode(ids) == s
    # Pieces that begin a word carry the marker.
    first = tok.token_list[tok.encode("THE")[0]]
    assert first.startswith(WORD_MARK)
    tok.save(tmp_path / "sp.json")
    assert load_tokenizer(tmp_path / "sp.json").encode(TEXTS[1]) == tok.encode(TEXTS[1])


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "wordpiece"}')
    with pytest.raises(ValueError, match="bad.json.*wordpiece"):
        load_tokenizer(bad)
    with pytest.raises(ValueError, match="missing.json"):
        load_tokenizer(tmp_path / "missing.json")


@pytest.mark.parametrize("content, why", [
    ({"kind": "sentencepiece", "model": base64.b64encode(b"SECRET not a model").decode()}, "corrupt"),
    ({"kind": "sentencepiece", "model": "SECRET!not base64"}, "base64"),
    ({"kind": "sentencepiece"}, "no 'model'"),
    ({"kind": "char", "tokens": "SECRET"}, "list of strings"),
    ({"kind": "char"}, "no 'tokens'"),
    (["SECRET"], "not an asrkit tokenizer"),
    ({"kind": "SECRET" * 100}, "unknown tokenizer kind"),
])
def test_a_corrupt_tokenizer_file_is_one_line_naming_it(tmp_path, content, why):
    """A damaged tokenizer.json (a corrupt sentencepiece model inside, missing or mistyped entries) is a ValueError
    naming the file and what is wrong, not a sentencepiece RuntimeError, KeyError or TypeError; and it quotes
    nothing of the file beyond a short excerpt."""
    bad = tmp_path / "tok.json"
    bad.write_text(json.dumps(content))
    with pytest.raises(ValueError) as info:
        load_tokenizer(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and why in message and "\n" not in message
    assert len(message) < len(str(bad)) + 160, message
    if "kind" not in why:  # only the kind is quoted, and briefly
        assert "SECRET" not in message


def test_train_tokenizer_cli(tmp_path):
    from asrkit.cli import main

    text = tmp_path / "text"
    text.write_text("".join(f"u{i} {t}\n" for i, t in enumerate(TEXTS)))
    assert main(["train-tokenizer", "--text", str(text), "--model-type", "bpe", "--vocab-size", "50",
                 str(tmp_path / "bpe.json")]) == 0
    tok = load_tokenizer(tmp_path / "bpe.json")
    assert tok.decode(tok.encode(TEXTS[2])) == TEXTS[2]
    assert main(["train-tokenizer", "--text", str(text), str(tmp_path / "c.json")]) == 0
    assert load_tokenizer(tmp_path / "c.json").vocab_size == len(CharTokenizer.train(TEXTS).token_list)
