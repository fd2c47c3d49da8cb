"""Hotwords through every interface: decode.hotwords / decode.hotword_weight (typed, checked), the CLI's --hotwords
and --hotword-weight, load_model(..., hotwords=...), per call transcribe(..., hotwords=...), and decode_ctc."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

import asrkit
from asrkit.cli.decode_options import add_decode_options, decode_config_from_args
from asrkit.config import ConfigError, DecodeConfig, load_decode_config
from asrkit.pipeline.searcher import Searcher
from asrkit.search import decode_ctc
from asrkit.text.tokenizer import CharTokenizer
from tests.pipeline.tiny_exp import make_tiny_exp

TOK = CharTokenizer.train(["ABCDE FGH"])


def _two_readings(tok=TOK) -> torch.Tensor:
    """(1, 6, V) log-probs of "A D" vs (less likely) "A C" ... one frame apart: A, blank, D 0.6 / C 0.4, blank."""
    ids = {t: i for i, t in enumerate(tok.token_list)}
    p = torch.full((6, tok.vocab_size), 1e-4)
    p[0, ids["A"]] = p[1, 0] = p[3, 0] = p[4, 0] = p[5, 0] = 1.0
    p[2, ids["D"]], p[2, ids["C"]] = 0.6, 0.4
    return (p / p.sum(-1, keepdim=True)).log()[None]


def _search(cfg: DecodeConfig, hotwords=None) -> str:
    searcher = Searcher(cfg, None, TOK, torch.device("cpu"), hotwords)
    nbest = searcher.search(None, None, torch.tensor([6]), log_probs=_two_readings())
    return TOK.decode(nbest.to_lists()[0][0].tokens)


def test_searcher_biases_from_the_file_and_from_a_list(tmp_path: Path) -> None:
    cfg = DecodeConfig(mode="ctc_prefix", beam=4)
    assert _search(cfg) == "AD"
    listed = tmp_path / "hot.txt"
    listed.write_text("AC\t1.0\n7 8\n")
    assert _search(DecodeConfig(mode="ctc_prefix", beam=4, hotwords=str(listed))) == "AC"
    assert _search(DecodeConfig(mode="ctc_prefix", beam=4, hotwords=str(listed), hotword_weight=0.0)) == "AD"
    assert _search(cfg, hotwords=["AC"]) == "AC" and _search(cfg, hotwords=[("AC", 0.01)]) == "AD"


def test_unspellable_phrases_are_logged_by_line_and_bad_lists_named(tmp_path: Path, caplog) -> None:
    listed = tmp_path / "hot.txt"
    listed.write_text("AC\n99\n")
    with caplog.at_level("WARNING", logger="asrkit.pipeline"):
        _search(DecodeConfig(mode="ctc_prefix", hotwords=str(listed)))
    assert f"hotword '99' ({listed} line 2) skipped" in caplog.text
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=f"decode.hotwords {empty}: hotwords file {empty}: no phrases"):
        _search(DecodeConfig(mode="ctc_prefix", hotwords=str(empty)))
    with pytest.raises(ConfigError, match="no phrase can be spelled"):
        _search(DecodeConfig(mode="ctc_prefix"), hotwords=["99"])
    with pytest.raises(ConfigError, match="decode.mode is greedy"):
        _search(DecodeConfig(), hotwords=["AC"])


@pytest.mark.parametrize("change,match", [
    (dict(mode="greedy", hotwords="x"), "decode.hotwords is set but decode.mode is greedy"),
    (dict(mode="ctc_prefix", hotwords="/no/such/file"), "decode.hotwords /no/such/file: no such file"),
    (dict(mode="ctc_prefix", hotword_weight=-1.0), "decode.hotword_weight must be >= 0"),
    (dict(mode="ctc_prefix", hotword_weight=float("nan")), "decode.hotword_weight must be a finite number"),
])
def test_bad_settings_are_named(change: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Searcher(DecodeConfig(**change), None, TOK, torch.device("cpu"))


def test_config_keys_are_typed_and_the_cli_options_set_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="hotword_weight"):
        load_decode_config(None, ["hotword_weight=much"])
    assert load_decode_config(None, ["hotwords=h.txt", "hotword_weight=2"]).hotword_weight == 2.0
    p = argparse.ArgumentParser()
    add_decode_options(p)
    cfg = decode_config_from_args(p.parse_args(["--hotwords", "h.txt", "--hotword-weight", "0.5", "--set",
                                                "hotword_weight=3"]))
    assert (cfg.hotwords, cfg.hotword_weight) == ("h.txt", 0.5)
    assert decode_config_from_args(p.parse_args([])).hotwords is None


@pytest.fixture(scope="module")
def tiny_exp(tmp_path_factory) -> Path:
    return make_tiny_exp(tmp_path_factory.mktemp("tiny") / "exp")


def test_load_model_and_per_call_hotwords(tiny_exp: Path, tmp_path: Path) -> None:
    wav = (0.3 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    # every token a candidate (the untrained model ranks I and J low), and a bonus that outweighs the model
    decode = DecodeConfig(mode="ctc_prefix", beam=4, hotword_weight=30.0, token_topk=None, token_min_logp=None)
    plain = asrkit.load_model(str(tiny_exp), decode=decode, segmenter="none")
    assert "HIJ" not in plain.transcribe(wav).text
    biased = asrkit.load_model(str(tiny_exp), decode=decode, segmenter="none", hotwords=["HIJ"])
    assert "HIJ" in biased.transcribe(wav).text
    assert "HIJ" in plain.transcribe(wav, hotwords=["HIJ"]).text  # per call
    assert "HIJ" not in biased.transcribe(wav, hotwords=["KLM"]).text  # a call's list replaces the model's
    assert "HIJ" not in biased.transcribe(wav, hotword_weight=0.0).text
    listed = tmp_path / "hot.txt"
    listed.write_text("HIJ\n")
    assert "HIJ" in plain.transcribe(wav, hotwords=str(listed)).text  # a file, the DecodeConfig key


def test_cli_transcribe_with_a_hotwords_file(tiny_exp: Path, tmp_path: Path, capsys) -> None:
    import soundfile as sf

    from asrkit.cli import main

    wav = (0.3 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    sf.write(tmp_path / "a.wav", wav, 16000)
    listed = tmp_path / "hot.txt"
    listed.write_text("HIJ\t2\n")
    base = ["transcribe", "--model", str(tiny_exp), "--segmenter", "none", "--no-progress", "--mode", "ctc_prefix",
            "--set", "token_topk=null", "--set", "token_min_logp=null",
            str(tmp_path / "a.wav")]
    assert main(base + ["--hotwords", str(listed), "--hotword-weight", "15"]) == 0
    assert "HIJ" in capsys.readouterr().out
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(base + ["--hotwords", str(empty)]) != 0
    assert f"hotwords file {empty}: no phrases" in capsys.readouterr().err


def test_decode_ctc_hotwords() -> None:
    tok = CharTokenizer.train(["ABCD"])
    tokens = list(tok.token_list)
    lp = _two_readings(tok)
    assert decode_ctc(lp, tokens=tokens)[0][0].text == "AD"
    assert decode_ctc(lp, tokens=tokens, hotwords=["AC"])[0][0].text == "AC"
    assert decode_ctc(lp, tokens=tokens, hotwords=["AC"], native=False)[0][0].text == "AC"
    assert decode_ctc(lp, tokens=tokens, hotwords=["AC"], hotword_weight=0.1)[0][0].text == "AD"
    # the blank elsewhere: the phrases are spelled with the search's ids
    moved = tokens[1:] + tokens[:1]
    lp_moved = torch.cat([lp[..., 1:], lp[..., :1]], -1)
    assert decode_ctc(lp_moved, tokens=moved, hotwords=["AC"])[0][0].text == "AC"
    with pytest.warns(UserWarning, match="hotword '42'"):
        assert decode_ctc(lp, tokens=tokens, hotwords=["AC", "42"])[0][0].text == "AC"
    with pytest.raises(ValueError, match="no phrase can be spelled"), pytest.warns(UserWarning, match="'42'"):
        decode_ctc(lp, tokens=tokens, hotwords=["42"])
