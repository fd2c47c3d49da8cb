"""tools/config_matches.py: whether an experiment config already holds a set of overrides."""
from __future__ import annotations

from pathlib import Path

from tool_loader import load_tool

from asrkit.config import load_config, save_config

config_matches = load_tool("config_matches")

REPO_CONF = Path(__file__).resolve().parents[2] / "conf"


def _saved(tmp_path, overrides=()):
    """An experiment dir's config.yaml as training writes it: the medium config plus overrides, resolved."""
    path = tmp_path / "config.yaml"
    save_config(load_config(REPO_CONF / "mini_medium.yaml", list(overrides)), path)
    return str(path)


def test_held_settings_match(tmp_path, capsys):
    path = _saved(tmp_path, ["train.seed=2"])
    assert config_matches.main([path, "--set", "train.seed=2", "--set", "model.encoder.num_layers=12"]) == 0
    assert config_matches.main([path]) == 0
    assert capsys.readouterr().err == ""


def test_each_differing_key_is_named(tmp_path, capsys):
    path = _saved(tmp_path)  # InterCTC at layer 6, weight 0.3 (the medium recipe's default)
    plain = ["--set", "model.encoder.interctc_layers=[]", "--set", "model.interctc_weight=0.0"]
    assert config_matches.main([path, *plain, "--set", "train.seed=1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"config_matches: model.interctc_weight: 0.3 in {path}, 0.0 wanted",
                   f"config_matches: model.encoder.interctc_layers: [6] in {path}, [] wanted"]


def test_a_config_or_override_that_does_not_load_is_status_2(tmp_path, capsys):
    path = _saved(tmp_path)
    assert config_matches.main([path, "--set", "model.encoder.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err
    assert config_matches.main([str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert config_matches.main([path, "--set", "train.seed"]) == 2
    assert "not of the form key.path=value" in capsys.readouterr().err
