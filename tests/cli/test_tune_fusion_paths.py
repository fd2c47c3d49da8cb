"""Paths written into decode configs work from any directory (issue 8: tune-fusion wrote ``lm:`` relative to its cwd).

The rule (asrkit.config.save_config): a DecodeConfig's ``lm`` is written absolute; a relative path read from a
config or the command line is relative to the working directory.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from asrkit.checkpoint import save_model_weights
from asrkit.cli import main
from asrkit.config import DecodeConfig, load_config, load_decode_config, save_config
from asrkit.data.table import read_table
from asrkit.models.registry import build_model
from asrkit.pipeline import load_lm_scorer
from asrkit.text.tokenizer import CharTokenizer

REPO = Path(__file__).resolve().parents[2]


def _unigram_arpa(path: Path, tok: CharTokenizer) -> None:
    """A token-unit unigram ARPA LM over the tokenizer's tokens (all equally likely)."""
    words = list(tok.token_list[3:]) + ["</s>", "<unk>"]
    lines = ["\\data\\", f"ngram 1={len(words) + 1}", "", "\\1-grams:", "-99\t<s>"]
    lines += [f"-1.0\t{w}" for w in words] + ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def test_saved_decode_config_finds_a_relative_lm_from_another_directory(tmp_path, monkeypatch):
    tok = CharTokenizer.train(["THE CAT SAT", "A DOG"])
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "lm").mkdir(parents=True)
    elsewhere.mkdir()
    _unigram_arpa(work / "lm" / "uni.arpa", tok)
    monkeypatch.chdir(work)
    save_config(DecodeConfig(mode="ctc_prefix", lm="lm/uni.arpa", lm_units="token"), "decode.yaml")
    assert load_decode_config("decode.yaml").lm == str(work / "lm" / "uni.arpa")  # written absolute
    monkeypatch.chdir(elsewhere)
    cfg = load_decode_config(work / "decode.yaml")
    assert os.path.isabs(cfg.lm) and os.path.samefile(cfg.lm, work / "lm" / "uni.arpa")
    assert load_lm_scorer(cfg, tok, torch.device("cpu")) is not None  # the searcher's LM loads from here
    # Without an LM nothing is invented; a relative path given on the command line is the cwd's.
    save_config(DecodeConfig(), "plain.yaml")
    assert load_decode_config("plain.yaml").lm is None
    assert load_decode_config(None, ["lm=lm/x.arpa"]).lm == "lm/x.arpa"


@pytest.fixture(scope="module")
def tiny_exp(tiny_corpus, tmp_path_factory):
    """An untrained pure-CTC experiment dir (decoding only needs its weights to be deterministic)."""
    torch.manual_seed(0)
    cfg = load_config(REPO / "conf" / "tiny_ctc.yaml", [
        "model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
        "model.encoder.num_layers=1", "tokenizer.path=tokenizer.json", "cmvn=null"])
    tok = CharTokenizer.train(read_table(tiny_corpus / "train" / "text").values())
    exp = tmp_path_factory.mktemp("paths_exp")
    save_config(cfg, exp / "config.yaml")
    tok.save(exp / "tokenizer.json")
    save_model_weights(build_model(cfg, tok.vocab_size).eval(), exp / "model.pt")
    return exp, tok


def test_tune_fusion_and_decode_write_decode_yaml_usable_from_anywhere(tiny_exp, tiny_corpus, tmp_path, monkeypatch,
                                                                        capsys):
    exp, tok = tiny_exp
    work, elsewhere = tmp_path / "recipe", tmp_path / "elsewhere"
    (work / "exp" / "lm").mkdir(parents=True)
    elsewhere.mkdir()
    _unigram_arpa(work / "exp" / "lm" / "uni.arpa", tok)
    shutil.copytree(tiny_corpus / "dev", work / "data" / "dev")
    monkeypatch.chdir(work)  # a recipe dir: every path relative, as run.sh passes them
    assert main(["tune-fusion", "--model", str(exp), "--data", "data/dev", "--out", "exp/tune", "--mode",
                 "ctc_prefix", "--beam", "2", "--lm", "exp/lm/uni.arpa", "--set", "lm_units=token", "--lm-weights",
                 "0.3", "0.6"]) == 0
    assert main(["decode", "--model", str(exp), "--data", "data/dev", "--out", "exp/dec", "--mode", "ctc_prefix",
                 "--beam", "2", "--lm", "exp/lm/uni.arpa", "--set", "lm_units=token"]) == 0
    lm = str(work / "exp" / "lm" / "uni.arpa")
    for written in ("exp/tune/decode.yaml", "exp/dec/decode.yaml"):
        assert f"lm: {lm}\n" in Path(written).read_text(encoding="utf-8"), written
    expected = read_table("exp/dec/text")
    capsys.readouterr()

    monkeypatch.chdir(elsewhere)
    for written in ("tune", "dec"):
        out = elsewhere / f"again_{written}"
        assert main(["decode", "--model", str(exp), "--data", str(work / "data" / "dev"), "--out", str(out),
                     "--decode-config", str(work / "exp" / written / "decode.yaml"),
                     "--set", "lm_weight=0.5"]) == 0, capsys.readouterr().err
        assert load_decode_config(out / "decode.yaml").lm == lm
        assert read_table(out / "text").keys() == expected.keys()
