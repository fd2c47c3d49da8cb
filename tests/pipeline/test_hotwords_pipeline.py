"""Hotwords through every interface: decode.hotwords / decode.hotword_weight (typed, checked), the CLI's --hotwords
and --hotword-weight, load_model(..., hotwords=...), per call transcribe(..., hotwords=...), and decode_ctc."""
from __future__ import annotations

import argparse
from dataclasses import replace
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
pytestmark = pytest.mark.filterwarnings("ignore:1 of 16 tokens have letters")  # the word LM tests' Z: no LM word has it


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
    # every token a candidate, a phrase of letters the untrained model ranks high (the first two of a phrase hold
    # no bonus: asrkit.search.hotwords.HELD_TOKENS), and a bonus that outweighs the model
    decode = DecodeConfig(mode="ctc_prefix", beam=32, hotword_weight=30.0, token_topk=None, token_min_logp=None)
    plain = asrkit.load_model(str(tiny_exp), decode=decode, segmenter="none")
    assert "CJD" not in plain.transcribe(wav).text
    biased = asrkit.load_model(str(tiny_exp), decode=decode, segmenter="none", hotwords=["CJD"])
    assert "CJD" in biased.transcribe(wav).text
    assert "CJD" in plain.transcribe(wav, hotwords=["CJD"]).text  # per call
    assert "CJD" not in biased.transcribe(wav, hotwords=["KLM"]).text  # a call's list replaces the model's
    assert "CJD" not in biased.transcribe(wav, hotword_weight=0.0).text
    listed = tmp_path / "hot.txt"
    listed.write_text("CJD\n")
    assert "CJD" in plain.transcribe(wav, hotwords=str(listed)).text  # a file, the DecodeConfig key


def test_cli_transcribe_with_a_hotwords_file(tiny_exp: Path, tmp_path: Path, capsys) -> None:
    import soundfile as sf

    from asrkit.cli import main

    wav = (0.3 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    sf.write(tmp_path / "a.wav", wav, 16000)
    listed = tmp_path / "hot.txt"
    listed.write_text("CJD\t2\n")  # as in test_load_model_and_per_call_hotwords
    base = ["transcribe", "--model", str(tiny_exp), "--segmenter", "none", "--no-progress", "--mode", "ctc_prefix",
            "--set", "token_topk=null", "--set", "token_min_logp=null",
            str(tmp_path / "a.wav")]
    assert main(base + ["--hotwords", str(listed), "--hotword-weight", "15"]) == 0
    assert "CJD" in capsys.readouterr().out
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


# ---------------------------------------------------------------- hotwords outside decode.lexicon and the word LM
WORD_ARPA = Path(__file__).parents[1] / "lm" / "fixtures" / "words_3gram.arpa"  # THE CAT SAT ON MAT A DOG
LM_TOK = CharTokenizer.train(["THE CAT SAT ON MAT A DOG ZOE"])


def _spoken(text: str, tok=LM_TOK) -> torch.Tensor:
    """(1, T, V) log-probs that read ``text`` clearly: per token a frame (0.9) then a blank frame."""
    ids = tok.encode(text)
    p = torch.full((2 * len(ids) + 1, tok.vocab_size), 0.1 / tok.vocab_size)
    for k, i in enumerate(ids):
        p[2 * k, i] += 0.9
        p[2 * k + 1, 0] += 0.9
    p[-1, 0] += 0.9
    return (p / p.sum(-1, keepdim=True)).log()[None]


def _word_lm_cfg(tmp_path: Path, **kw) -> DecodeConfig:
    words = tmp_path / "words.txt"
    words.write_text("THE\nCAT\nSAT\nON\nMAT\nA\nDOG\n")
    return DecodeConfig(mode="ctc_prefix", beam=16, lm=str(WORD_ARPA), lm_weight=0.5, lexicon=str(words),
                        token_topk=None, token_min_logp=None, **kw)


def _best(searcher: Searcher, lp: torch.Tensor):
    return searcher.search(None, None, torch.tensor([lp.shape[1]]), log_probs=lp).to_lists()[0][0]


def _ref_lm(words: list, unk_offset: float, class_score=None) -> float:
    """ln P of a sentence by the reference LM (tests/lm): ZOE, outside the LM, as <unk> + offset or a class score
    that the history skips."""
    from tests.lm.test_ngram import RefLM

    ref = RefLM(WORD_ARPA)
    if class_score is not None:
        return ref.sentence([w for w in words if w != "ZOE"]) + class_score * words.count("ZOE")
    return ref.sentence(words) + unk_offset * words.count("ZOE")


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("class_score", [None, -3.0])
def test_an_oov_hotword_joins_the_lexicon_for_that_search(tmp_path: Path, monkeypatch, native, class_score) -> None:
    # ZOE is in neither the lexicon nor the LM: only the hotword list lets the search output it, and its LM score is
    # <unk>'s + lm_unk_offset (or the stated class score); the hotword bonus is 1.5 per letter.
    monkeypatch.setenv("ASRKIT_NATIVE", native)
    cfg = _word_lm_cfg(tmp_path, hotword_class_score=class_score)
    lp = _spoken("THE ZOE SAT")
    plain = Searcher(cfg, None, LM_TOK, torch.device("cpu"))
    assert "ZOE" not in LM_TOK.decode(_best(plain, lp).tokens)
    biased = plain.with_hotwords(["ZOE"])
    best = _best(biased, lp)
    assert LM_TOK.decode(best.tokens) == "THE ZOE SAT"
    lm = _ref_lm(["THE", "ZOE", "SAT"], cfg.lm_unk_offset, class_score)
    assert best.score - best.ctc_score == pytest.approx(0.5 * lm + 1.5 * 3, abs=1e-3)
    # the decode config's own search is unchanged (the addition is that search's), and copies are cached
    assert "ZOE" not in LM_TOK.decode(_best(plain, lp).tokens)
    assert plain.with_hotwords(["ZOE"]).lm is biased.lm and biased.lm is not plain.lm
    assert Searcher(cfg, None, LM_TOK, torch.device("cpu"), ["ZOE"]).lm is not plain.lm


def test_oov_hotwords_in_the_torch_and_native_loops_are_equal(tmp_path: Path, monkeypatch) -> None:
    from asrkit.search import native_build

    if native_build.load() is None:
        pytest.skip("no C++ compiler: the native loop cannot build")
    one, two = _spoken("THE ZOE SAT"), _spoken("A ZOE DOG SAT")
    lp = torch.cat([torch.cat([one, two[:, -1:].expand(1, two.shape[1] - one.shape[1], -1)], 1), two])
    found = {}
    for native in ("1", "0"):
        monkeypatch.setenv("ASRKIT_NATIVE", native)
        searcher = Searcher(_word_lm_cfg(tmp_path, nbest=4), None, LM_TOK, torch.device("cpu"), ["ZOE", "DOG"])
        found[native] = searcher.search(None, None, torch.tensor([one.shape[1], two.shape[1]]), log_probs=lp).to_lists()
    for want, got in zip(found["0"], found["1"]):
        assert [h.tokens for h in got] == [h.tokens for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-3)
    assert LM_TOK.decode(found["1"][1][0].tokens) == "A ZOE DOG SAT"


def test_an_oov_hotword_joins_a_lexicon_without_a_word_lm(tmp_path: Path) -> None:
    cfg = replace(_word_lm_cfg(tmp_path), lm=None)
    lp = _spoken("THE ZOE SAT")
    plain = Searcher(cfg, None, LM_TOK, torch.device("cpu"))
    assert "ZOE" not in LM_TOK.decode(_best(plain, lp).tokens)
    assert LM_TOK.decode(_best(plain.with_hotwords(["ZOE"]), lp).tokens) == "THE ZOE SAT"
    assert "ZOE" not in LM_TOK.decode(_best(plain, lp).tokens)


def test_the_class_score_default_is_the_measured_one() -> None:
    # -9: measured with tools/bench/bench_hotwords.py on the demo (docs/decoding.md); like lm_unk_offset it is read
    # by a word LM only, so a token-LM or LM-free config keeps it unread
    assert DecodeConfig().hotword_class_score == -9.0
    assert _search(DecodeConfig(mode="ctc_prefix", beam=4, lm_units="token"), hotwords=["AC"]) == "AC"
