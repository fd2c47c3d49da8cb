from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import pytest

from asrkit.config import (ConfigError, DecodeConfig, ExperimentConfig, LMExperimentConfig, ModelConfig, apply_overrides,
                           flatten_dict, from_dict, load_config, load_decode_config, load_lm_config, load_yaml_as,
                           save_config, to_dict)


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


# ---- from_dict's type checks, on a dataclass of every field type a config uses ----

CONF = Path(__file__).resolve().parents[1] / "conf"


@dataclass(frozen=True)
class _Inner:
    kind: str = "inner"
    size: int = 1


@dataclass(frozen=True)
class _Other:
    kind: str = "other"
    rate: float = 0.5


@dataclass(frozen=True)
class _AllTypes:
    flag: bool = False
    count: int = 0
    rate: float = 0.0
    name: str = ""
    maybe: Optional[int] = 3
    pair: Tuple[float, ...] = ()
    names: List[str] = field(default_factory=list)
    table: Dict[str, int] = field(default_factory=dict)
    anything: Any = None
    loose: List = field(default_factory=list)  # no item type: items unchecked
    either: Union[int, str] = 0  # a union of plain types: the first type that takes the value
    inner: _Inner = field(default_factory=_Inner)
    part: Union[_Inner, _Other] = field(default_factory=_Inner)  # a section of two kinds
    piped: "_Inner | _Other | None" = None  # the same written with |


def test_values_of_every_type_convert():
    cfg = from_dict(_AllTypes, {"flag": True, "count": 4, "rate": 2, "name": "x", "maybe": None,
                                "pair": [1, 2.5], "names": ("a", "b"), "table": {"k": 1}, "anything": [1],
                                "inner": {"size": 7}})
    assert cfg.flag is True and cfg.count == 4 and cfg.name == "x" and cfg.maybe is None
    assert cfg.rate == 2.0 and isinstance(cfg.rate, float)
    assert cfg.pair == (1.0, 2.5) and all(isinstance(v, float) for v in cfg.pair)
    assert cfg.names == ["a", "b"] and isinstance(cfg.names, list)
    assert cfg.table == {"k": 1} and cfg.anything == [1] and cfg.inner == _Inner(size=7)
    assert from_dict(_AllTypes, {"maybe": 5}).maybe == 5
    other = from_dict(_AllTypes, {"loose": [1, "a"], "either": 4, "part": {"kind": "other", "rate": 1},
                                  "piped": {"kind": "other"}})
    assert from_dict(_AllTypes, {"either": "x"}).either == "x"
    assert other.loose == [1, "a"] and other.either == 4 and other.part == _Other(rate=1.0) and other.piped == _Other()
    assert from_dict(_AllTypes, {"part": {"size": 2}, "piped": {"size": 3}}).piped == _Inner(size=3)
    assert from_dict(_AllTypes, {"piped": None}).piped is None
    assert to_dict(other)["part"] == {"kind": "other", "rate": 1.0}
    assert to_dict(_AllTypes(table={"k": [1, 2]}, pair=(1.0,)))["table"] == {"k": [1, 2]}


@pytest.mark.parametrize("key,value,message", [
    ("flag", 1, "flag: expected true/false, got 1"),
    ("flag", "yes", "flag: expected true/false, got 'yes'"),
    ("count", True, "count: expected an integer, got True"),
    ("count", 1.5, "count: expected an integer, got 1.5"),
    ("rate", False, "rate: expected a number, got False"),
    ("rate", "fast", "rate: expected a number, got 'fast'"),
    ("name", 3, "name: expected a string, got 3"),
    ("maybe", "x", "maybe: expected an integer, got 'x'"),
    ("pair", 1.0, "pair: expected a list, got 1.0"),
    ("pair", [1.0, "b"], r"pair\[1\]: expected a number, got 'b'"),
    ("names", "a", "names: expected a list, got 'a'"),
    ("table", [1], r"table: expected a mapping, got \[1\]"),
    ("inner", 3, "inner: expected a mapping for section, got 3"),
    ("inner", {"sise": 1}, r"unknown config key 'inner.sise' \(valid keys here: kind, size\)"),
    ("either", [1], r"either: expected an integer or a string, got \[1\]"),
    ("either", True, "either: expected an integer or a string, got True"),
    ("piped", {"kind": "third"}, r"piped.kind 'third' is unknown \(choose from: inner, other\)"),
    ("piped", {"kind": "other", "size": 1}, r"unknown config key 'piped.size' \(valid keys here: kind, rate\)"),
])
def test_a_wrong_value_is_an_error_naming_its_key(key, value, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        from_dict(_AllTypes, {key: value})


def test_a_section_of_several_kinds_is_chosen_by_its_kind_key():
    assert from_dict(ModelConfig, {"decoder": {"kind": "lstm_location", "window": 3}}).decoder.window == 3
    assert from_dict(ModelConfig, {"encoder": {"kind": "conformer"}}).encoder.conv_kernel == 15
    # no kind: the first of the union (the Transformer encoder)
    assert type(from_dict(ModelConfig, {"encoder": {"d_model": 8}}).encoder).__name__ == "TransformerEncoderConfig"
    with pytest.raises(ConfigError, match=r"^model.decoder.kind 'rnn' is unknown \(choose from: transformer, "
                                          r"lstm_location, none\)$"):
        from_dict(ModelConfig, {"decoder": {"kind": "rnn"}}, "model")
    with pytest.raises(ConfigError, match="^encoder: expected a mapping for section, got 'conformer'$"):
        from_dict(ModelConfig, {"encoder": "conformer"})
    # a key of another kind is unknown in this one
    with pytest.raises(ConfigError, match=r"unknown config key 'decoder.window'"):
        from_dict(ModelConfig, {"decoder": {"kind": "transformer", "window": 3}})


def test_a_format_1_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"^'model.lstm_encoder' is a key of config format 1 .*: use model.encoder "
                                          r"with kind: blstm$"):
        from_dict(ExperimentConfig, {"model": {"lstm_encoder": {}}})


def test_flatten_dict_gives_the_set_key_paths():
    tree = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None, "f": {}}
    assert flatten_dict(tree) == {"a.b": 1, "a.c.d": [1, 2], "e": None}
    assert list(flatten_dict(tree)) == ["a.b", "a.c.d", "e"]
    assert flatten_dict({"x": 1}, "p.") == {"p.x": 1}
    flat = flatten_dict(to_dict(ExperimentConfig()))
    assert flat["model.encoder.d_model"] == 256 and flat["cmvn"] is None and "model.encoder" not in flat


def test_overrides_parse_yaml_values_and_make_sections():
    data = {"train": {"epochs": 3}}
    assert apply_overrides(data, ["train.lr=1e-3", "model.encoder.kind=conformer", "x=a=b", " y.z =[1, 2]"]) is data
    assert data == {"train": {"epochs": 3, "lr": 1e-3}, "model": {"encoder": {"kind": "conformer"}}, "x": "a=b",
                    "y": {"z": [1, 2]}}
    with pytest.raises(ConfigError, match="^override 'train.epochs' is not of the form key.path=value$"):
        apply_overrides(data, ["train.epochs"])
    with pytest.raises(ConfigError, match="^override 'train.epochs.x=1': 'epochs' is not a section$"):
        apply_overrides(data, ["train.epochs.x=1"])


def test_loading_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: cannot read config: No such file or directory$"):
        load_config(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1,\n")
    with pytest.raises(ConfigError, match=f"^{bad}: invalid YAML: "):
        load_config(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n")
    with pytest.raises(ConfigError, match=f"^{listing}: top level must be a mapping of keys$"):
        load_config(listing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == ExperimentConfig()
    assert load_config(empty, ["train.epochs=2"]).train.epochs == 2
    with pytest.raises(ConfigError, match=f"^{empty}: unknown config key 'train.epoch' "):
        load_config(empty, ["train.epoch=2"])
    nested = tmp_path / "dup.yaml"
    nested.write_text("train:\n  lr: 1\n  epochs: 2\n  lr: 3\n")
    with pytest.raises(ConfigError, match=f"^{nested}: line 4: duplicate key 'lr' \\(first on line 2\\)$"):
        load_yaml_as(ExperimentConfig, nested)


def test_decode_config_defaults_overrides_and_absolute_lm(tmp_path, monkeypatch):
    assert load_decode_config() == DecodeConfig()
    assert load_decode_config(CONF / "decode_joint.yaml", ["beam=3"]).beam == 3
    assert load_decode_config(None, ["beam=4", "mode=ctc_prefix"]) == DecodeConfig(beam=4, mode="ctc_prefix")
    monkeypatch.chdir(tmp_path)
    save_config(DecodeConfig(lm="lm.arpa", lexicon="words.txt"), tmp_path / "d.yaml")
    cfg = load_decode_config(tmp_path / "d.yaml")
    assert cfg.lm == str(tmp_path / "lm.arpa") and cfg.lexicon == str(tmp_path / "words.txt")
    save_config(DecodeConfig(), tmp_path / "none.yaml")
    assert load_decode_config(tmp_path / "none.yaml") == DecodeConfig()
    save_config(ExperimentConfig(cmvn="cmvn.json"), tmp_path / "e.yaml")  # only a decode config's paths move
    assert load_config(tmp_path / "e.yaml").cmvn == "cmvn.json"


@pytest.mark.parametrize("text,value", [("1e-3", 1e-3), ("2E4", 2e4), ("-1.5e+2", -150.0), (".5e1", 5.0),
                                        ("1_0e1", 100.0), ("1.0e-3", 1e-3), ("0.25", 0.25)])
def test_exponent_floats_read_as_numbers_in_files_and_overrides(tmp_path, text, value):
    p = tmp_path / "c.yaml"
    p.write_text(f"train:\n  lr: {text}\n  seed: 12\n")
    assert load_config(p).train.lr == value and load_config(p).train.seed == 12
    assert load_config(tmp_path / "c.yaml", [f"train.weight_decay={text}"]).train.weight_decay == value


def test_strings_that_only_look_numeric_stay_strings(tmp_path):
    data = apply_overrides({}, ["a=1e", "b=e5", "c=1e-3x", "d='1e-3'", "e=12"])
    assert data == {"a": "1e", "b": "e5", "c": "1e-3x", "d": "1e-3", "e": 12}


def test_a_bad_override_value_is_an_error_naming_the_override():
    with pytest.raises(ConfigError, match=r"^override 'train.lr=\[1,': invalid value: "):
        apply_overrides({}, ["train.lr=[1,"])
    with pytest.raises(ConfigError, match=r"^override 'x=\{a: 1, a: 2\}': invalid value: line 1: duplicate key 'a'"):
        apply_overrides({}, ["x={a: 1, a: 2}"])


def test_lm_config_loads_with_overrides():
    cfg = load_lm_config(CONF / "lm_lstm_small.yaml", ["model.num_layers=3", "train.lr=2e-3"])
    assert isinstance(cfg, LMExperimentConfig) and cfg.model.num_layers == 3 and cfg.train.lr == 2e-3


def test_saved_config_keeps_the_field_order(tmp_path):
    save_config(ExperimentConfig(), tmp_path / "c.yaml")
    sections = [line.rstrip(":") for line in (tmp_path / "c.yaml").read_text().splitlines() if not line[0].isspace()]
    assert sections[:3] == ["frontend", "specaug", "speed_perturb"] and sections[-1].startswith("cmvn")


def test_string_fields_take_an_override_literally():
    # YAML would cut `a #b` at its comment and read `yes` as True; a string field takes the text as written. An
    # optional string is unset by YAML's null, as in the files (`lm: null`); a plain string never is.
    cfg = load_decode_config(None, ["lm=a #b", "lexicon='x'", "lm_units=~", "lm_word_boundary=yes"])
    assert (cfg.lm, cfg.lexicon, cfg.lm_units, cfg.lm_word_boundary) == ("a #b", "'x'", "~", "yes")
    for null in ("", "~", "null", "Null", "NULL"):
        assert load_decode_config(CONF / "decode_ctc_prefix_wordlm.yaml", ["lm=x.arpa", f"lm={null}"]).lm is None
    assert load_decode_config(None, ["lm=null1", "mode=", "lm_units=null"]) == DecodeConfig(lm="null1", mode="",
                                                                                          lm_units="null")
    # Other types still read YAML; a string inside a section of several kinds too.
    cfg = load_decode_config(None, ["token_topk=null", "beam=3", "lm_weight=1e-1"])
    assert (cfg.token_topk, cfg.beam, cfg.lm_weight) == (None, 3, 0.1)
    exp = load_config(CONF / "tiny_ctc.yaml", ["cmvn=a #b", "model.decoder.kind=none", "model.encoder.d_model=8"])
    assert exp.cmvn == "a #b" and type(exp.model.decoder).__name__ == "NoDecoderConfig"
    assert exp.model.encoder.d_model == 8
    with pytest.raises(ConfigError, match=r"model.decoder.kind 'lstm_location #x' is unknown"):  # not cut at '#'
        load_config(CONF / "tiny_ctc.yaml", ["model.decoder.kind=lstm_location #x"])
    # Without a config class (or for a key it lacks) values are YAML, and unknown keys are still refused.
    assert apply_overrides({}, ["lm=null"]) == {"lm": None}
    with pytest.raises(ConfigError, match="unknown config key 'lm_wieght'"):
        load_decode_config(None, ["lm_wieght=null"])
    with pytest.raises(ConfigError, match=r"^lm: expected a string, got \{'x': 1\}$"):
        load_decode_config(None, ["lm.x=1"])


def test_the_cli_lm_option_is_a_literal_path():
    import argparse

    from asrkit.cli.decode_options import add_decode_options, decode_config_from_args

    p = argparse.ArgumentParser()
    add_decode_options(p)
    # --lm is a path, as written: "null" is a file of that name (YAML read it as no LM, silently)
    assert decode_config_from_args(p.parse_args(["--lm", "null"])).lm == "null"
    args = p.parse_args(["--lm", "a #b", "--set", "lm=x", "--mode", "joint", "--beam", "3", "--lm-weight", "0.25"])
    assert decode_config_from_args(args) == DecodeConfig(lm="a #b", mode="joint", beam=3, lm_weight=0.25)


# Every count and interval key and the least value it takes: one below is refused at load, naming the key.
COUNT_KEYS = {"train.epochs": 1, "train.warmup_steps": 0, "train.accum_grad": 1, "train.log_interval": 1,
              "train.save_every_steps": 0, "train.keep_best": 0, "train.max_nonfinite_steps": 1,
              "train.plot_attention": 0, "train.mwer_nbest": 2, "data.max_frames": 1, "data.max_batch_size": 1,
              "data.num_workers": 0, "data.sortagrad_epochs": 0, "data.shard_buffer": 1}
LM_COUNT_KEYS = {"data.max_tokens": 1, "data.max_batch_size": 1, "data.max_len": 1, "data.bucket_width": 1}


@pytest.mark.parametrize("key, least", sorted(COUNT_KEYS.items()))
def test_a_count_or_interval_below_its_least_value_is_refused_at_load(tmp_path, key, least):
    """train.log_interval=0 was a ZeroDivisionError at the first logged step; now every such key is checked."""
    path = tmp_path / "c.yaml"
    path.write_text("{}\n")
    assert load_config(path, [f"{key}={least}"])  # the least value itself is fine
    with pytest.raises(ConfigError, match=f"^{path}: {key} must be at least {least}, got {least - 1}$"):
        load_config(path, [f"{key}={least - 1}"])


@pytest.mark.parametrize("key, least", sorted(LM_COUNT_KEYS.items()))
def test_an_lm_count_below_its_least_value_is_refused_at_load(tmp_path, key, least):
    path = tmp_path / "lm.yaml"
    path.write_text("{}\n")
    assert load_lm_config(path, [f"{key}={least}"])
    with pytest.raises(ConfigError, match=f"^{path}: {key} must be at least {least}, got {least - 1}$"):
        load_lm_config(path, [f"{key}={least - 1}"])


@pytest.mark.parametrize("key, value, message", [
    ("mwer_weight", 1.5, r"train.mwer_weight must be in \[0, 1\], got 1.5"),
    ("mwer_weight", -0.1, r"train.mwer_weight must be in \[0, 1\], got -0.1"),
    ("mwer_ctc_weight", 2.0, r"train.mwer_ctc_weight must be in \[0, 1\], got 2.0"),
])
def test_train_weights_outside_their_range_are_refused(key, value, message):
    from asrkit.config import TrainConfig

    assert TrainConfig(**{key: 1.0}) and TrainConfig(**{key: 0.0})
    with pytest.raises(ConfigError, match=f"^{message}$"):
        TrainConfig(**{key: value})


def test_frontend_window_and_dither_default_by_kind(tmp_path):
    """kaldi_fbank takes Kaldi compute-fbank's window and dither (povey, 1.0) when unset, logmel hann and none; a set
    value (0 included) wins; the loaded config holds the values used."""
    from asrkit.config import FrontendConfig

    assert (FrontendConfig().window, FrontendConfig().dither) == ("hann", 0.0)
    fbank = FrontendConfig(kind="kaldi_fbank")
    assert (fbank.window, fbank.dither) == ("povey", 1.0)
    assert (FrontendConfig(kind="kaldi_fbank", window="hamming", dither=0.0).window,
            FrontendConfig(kind="kaldi_fbank", window="hamming", dither=0.0).dither) == ("hamming", 0.0)
    assert FrontendConfig(window="hamming", dither=2.0).dither == 2.0
    p = tmp_path / "c.yaml"
    p.write_text("frontend:\n  kind: kaldi_fbank\n  window: null\n")
    assert to_dict(load_config(p))["frontend"]["window"] == "povey"
    with pytest.raises(ConfigError, match=r"^frontend.kind 'mfcc' is unknown \(choose from: logmel, kaldi_fbank\)$"):
        FrontendConfig(kind="mfcc")


def test_frontend_utterance_cmn_takes_true_false_or_causal_and_a_prior_weight():
    from asrkit.config import FrontendConfig

    assert FrontendConfig().utterance_cmn is False and FrontendConfig().utterance_cmn_prior_frames == 100.0
    assert FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=0).utterance_cmn_prior_frames == 0
    for bad in ("Causal", 1, None):
        with pytest.raises(ConfigError, match=rf"^frontend.utterance_cmn must be true, false or causal, got {bad!r}$"):
            FrontendConfig(utterance_cmn=bad)
    with pytest.raises(ConfigError, match=r"^frontend.utterance_cmn_prior_frames must be >= 0, got -0.5$"):
        FrontendConfig(utterance_cmn="causal", utterance_cmn_prior_frames=-0.5)


def test_decode_endpoint_rules_are_checked():
    from asrkit.config import EndpointConfig

    cfg = EndpointConfig()
    assert (cfg.silence_no_speech, cfg.trailing_silence, cfg.max_utterance) == (2.4, 1.0, 20.0)
    assert (cfg.vad, cfg.vad_threshold) == ("none", 0.5)
    assert EndpointConfig(silence_no_speech=0, trailing_silence=0, max_utterance=0, vad="energy").vad == "energy"
    for key in ("silence_no_speech", "trailing_silence", "max_utterance"):
        with pytest.raises(ConfigError, match=rf"^decode.endpoint.{key} must be >= 0, got -0.1$"):
            EndpointConfig(**{key: -0.1})
    with pytest.raises(ConfigError, match=r"^decode.endpoint.vad 'x' is unknown \(choose from: none, energy, silero\)$"):
        EndpointConfig(vad="x")
    for bad in (0.0, 1.0):
        with pytest.raises(ConfigError, match=rf"^decode.endpoint.vad_threshold must be in \(0, 1\), got {bad}$"):
            EndpointConfig(vad_threshold=bad)
    assert EndpointConfig(vad_threshold=0.01).vad_threshold == 0.01
    assert load_decode_config(None, ["endpoint.vad=silero"]).endpoint.vad == "silero"


def test_hotword_class_score_default_and_null():
    # -9: measured on the demo's names set (tools/bench/bench_hotwords.py); null (None) keeps <unk> + lm_unk_offset
    assert DecodeConfig().hotword_class_score == -9.0
    assert load_decode_config(None, ["hotword_class_score=null"]).hotword_class_score is None
    assert load_decode_config(None, ["hotword_class_score=-4.5"]).hotword_class_score == -4.5


def test_serve_limits_are_checked_at_their_least_values():
    from asrkit.config import ServeConfig

    cfg = ServeConfig()
    assert (cfg.host, cfg.port, cfg.token, cfg.max_streams) == ("127.0.0.1", 8000, None, 64)
    assert "token" not in repr(ServeConfig(token="s3cret"))  # kept out of logs
    edge = ServeConfig(port=65535, max_streams=1, max_message_bytes=1024, max_upload_bytes=1, max_stream_seconds=0.01,
                       idle_timeout_s=0.01, token="t")
    assert (edge.port, edge.max_streams, edge.max_message_bytes) == (65535, 1, 1024)
    assert ServeConfig(port=0).port == 0  # any free port
    assert ServeConfig().threads == 1
    for key, least in (("port", 0), ("max_streams", 1), ("max_message_bytes", 1024), ("max_upload_bytes", 1),
                       ("threads", 1)):
        with pytest.raises(ConfigError, match=rf"^serve.{key} must be at least {least}, got {least - 1}$"):
            ServeConfig(**{key: least - 1})
    with pytest.raises(ConfigError, match=r"^serve.port must be at most 65535, got 65536$"):
        ServeConfig(port=65536)
    for key in ("max_stream_seconds", "idle_timeout_s"):
        with pytest.raises(ConfigError, match=rf"^serve.{key} must be > 0, got 0.0$"):
            ServeConfig(**{key: 0.0})
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match=r"^serve.token is empty: give a token, or none for no authentication$"):
            ServeConfig(token=empty)
