"""asrkit train-ngram: a real lmplz run when one is installed, and the missing-binary message always."""
import math

import pytest
import torch

from asrkit.cli import train_ngram as cli
from asrkit.lm import load_ngram, read_arpa

TEXT = "u1 THE CAT SAT\nu2 A DOG SAT ON THE MAT\nu3 THE CAT\nu4 THE DOG RAN\nu5\n"


def _lmplz_or_skip():
    try:
        return cli.find_kenlm_binary("lmplz")
    except cli.KenlmNotFoundError:
        pytest.skip("lmplz not built (tools/install/install_kenlm.sh)")


def test_missing_lmplz_names_the_install_script(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ASRKIT_KENLM_BIN", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(cli, "DEFAULT_KENLM_DIR", tmp_path / "nothing")
    text = tmp_path / "text"
    text.write_text(TEXT, encoding="utf-8")
    assert cli.main(["--order", "3", "--text", str(text), str(tmp_path / "lm.arpa")]) == 1
    err = capsys.readouterr().err
    assert "lmplz was not found" in err and "tools/install/install_kenlm.sh" in err
    assert not (tmp_path / "lm.arpa").exists()


def test_env_var_binary_is_preferred(tmp_path, monkeypatch):
    fake = tmp_path / "lmplz"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ASRKIT_KENLM_BIN", str(tmp_path))
    assert cli.find_kenlm_binary("lmplz") == str(fake)


@pytest.mark.parametrize("argv,message", [
    (["--order", "3", "--units", "token"], "--units token needs --tokenizer"),
    (["--order", "0"], "--order must be >= 1"),
    (["--order", "2", "--prune", "0", "1", "1"], "--prune has 3 thresholds for an order-2 model"),
])
def test_bad_arguments(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--text", str(tmp_path / "text"), str(tmp_path / "lm.arpa")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_empty_text_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "find_kenlm_binary", lambda name: "/bin/false")
    text = tmp_path / "text"
    text.write_text("u1\nu2\n", encoding="utf-8")
    assert cli.main(["--order", "2", "--text", str(text), str(tmp_path / "lm.arpa")]) == 1
    assert f"{text}: no non-empty sentences" in capsys.readouterr().err


def test_word_lm_with_real_lmplz_is_normalised(tmp_path, capsys):
    _lmplz_or_skip()
    text = tmp_path / "text"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "lm.arpa.gz"
    assert cli.main(["--order", "3", "--text", str(text), "--memory", "100M", str(out)]) == 0
    assert "3-gram" in capsys.readouterr().out
    arpa = read_arpa(out)
    assert arpa.order == 3
    assert set(arpa.vocab) == {"<s>", "</s>", "<unk>", "THE", "CAT", "SAT", "A", "DOG", "ON", "MAT", "RAN"}
    # Kneser-Ney from lmplz is a proper distribution: P(. | h) sums to 1 over the vocabulary
    # (less <s>) for seen and unseen histories, computed through the tensor back-off lookup.
    lm = load_ngram(out)
    words = torch.tensor([[i for i, w in enumerate(lm.vocab) if w != "<s>"]])
    for history in (["<s>"], ["<s>", "THE"], ["THE", "CAT"], ["DOG", "MAT"], ["<unk>", "SAT"]):
        hist = torch.tensor([[lm.pad_id] * (2 - len(history)) + [lm.index(w) for w in history]])
        total = lm.logprob(hist, lm.backoff_sums(hist), words).exp().sum().item()
        assert total == pytest.approx(1.0, abs=1e-4), history


def test_token_lm_over_char_pieces(tmp_path):
    _lmplz_or_skip()
    from asrkit.text.tokenizer import CharTokenizer

    text = tmp_path / "plain.txt"
    text.write_text("THE CAT SAT\nA DOG\n\nTHE DOG SAT\n", encoding="utf-8")
    tok = CharTokenizer.train(["THE CAT SAT", "A DOG"])
    tok_path = tmp_path / "tok.json"
    tok.save(tok_path)
    out = tmp_path / "chars.arpa"
    counts = cli.train_ngram(str(text), str(out), 4, units="token", tokenizer_path=str(tok_path),
                             plain_text=True, memory="100M")
    arpa = read_arpa(out)
    assert counts == {k + 1: n for k, n in enumerate(arpa.counts())}
    assert set(arpa.vocab) == set(tok.token_list[3:]) | {"<s>", "</s>", "<unk>"}
    # "▁" is a word of the token LM: the 2-gram "E ▁" (THE_) was seen, "▁ E" never was
    assert ("E", "\u2581") in arpa.ngrams[1] and ("\u2581", "E") not in arpa.ngrams[1]
    assert math.isclose(sum(10 ** p for (w,), (p, _) in arpa.ngrams[0].items() if w != "<s>"), 1.0, abs_tol=1e-4)


def test_decode_configs_default_to_the_units_train_ngram_writes():
    # conf/decode_ctc_prefix_lm.yaml said lm_units: token while train-ngram writes word LMs by default: the
    # README's LM example decoded a word 3-gram as tokens. Every shipped decode config (and the default) agrees.
    import inspect
    from pathlib import Path

    from asrkit.config import DecodeConfig, load_decode_config

    units = inspect.signature(cli.train_ngram).parameters["units"].default
    assert units == "word" and DecodeConfig().lm_units == units
    confs = sorted((Path(__file__).resolve().parents[2] / "conf").glob("decode_*.yaml"))
    assert len(confs) >= 8
    for path in confs:
        assert load_decode_config(path).lm_units == units, path.name
