import pytest

from asrkit.config import ConfigError, ExperimentConfig, load_config, save_config, to_dict


def test_unknown_key_is_an_error_naming_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  encoder:\n    num_layer: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml.*'model.encoder.num_layer'"):
        load_config(p)


def test_wrong_type_is_an_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epochs: many\n")
    with pytest.raises(ConfigError, match="train.epochs.*integer"):
        load_config(p)


def test_overrides_and_round_trip(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epochs: 3\n")
    cfg = load_config(p, ["train.epochs=7", "model.encoder.d_model=64", "speed_perturb.factors=[0.9, 1.1]"])
    assert cfg.train.epochs == 7 and cfg.model.encoder.d_model == 64
    assert cfg.speed_perturb.factors == (0.9, 1.1)
    save_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg
    with pytest.raises(ConfigError, match="train.epoch'"):
        load_config(p, ["train.epoch=1"])


def test_defaults_are_complete():
    # every section of the default config survives a dict round trip
    d = to_dict(ExperimentConfig())
    assert set(d) >= {"frontend", "specaug", "data", "model", "train", "tokenizer"}


def test_duplicate_key_is_an_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  epochs: 3\ntrain:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: duplicate key 'train' \(first on line 1\)"):
        load_config(p)
