"""Every YAML asrkit reads from users (configs, decode configs, an experiment's config.yaml) goes through one loader:
aliases, which let a few bytes expand to gigabytes, are refused, and no error quotes more than a short excerpt."""
from __future__ import annotations

import pytest

from asrkit.config import ConfigError, load_config, load_decode_config, load_lm_config, read_yaml

LONGEST_ERROR = 400  # characters: a message names file, line and key, and quotes a short excerpt


def _alias_bomb(levels: int) -> str:
    """One value (a list where a section belongs, so its error quotes it), each level a list of ten aliases to the
    one before: 10**levels leaves from a file of ~70 bytes a level."""
    lines = ["model:", "  - &l0 [xxxxxxxxxxxxxxxx]"]
    for k in range(1, levels + 1):
        lines.append(f"  - &l{k} [{', '.join([f'*l{k - 1}'] * 10)}]")
    return "\n".join(lines + [""])


@pytest.mark.parametrize("load", [load_config, load_decode_config, load_lm_config])
def test_nested_aliases_are_refused_before_they_expand(tmp_path, load):
    path = tmp_path / "config.yaml"
    path.write_text(_alias_bomb(6), encoding="utf-8")  # a million leaves; 7 levels were 80 MB of message
    assert path.stat().st_size < 1000
    with pytest.raises(ConfigError) as err:
        load(path)
    message = str(err.value)
    assert len(message) < LONGEST_ERROR and "\n" not in message
    assert message.startswith(f"{path}: line 3: a YAML alias (*l0)") and "write the value out" in message


def test_a_single_alias_is_refused_in_overrides_and_in_merge_keys(tmp_path):
    path = tmp_path / "decode.yaml"
    path.write_text("base: &b {beam: 4}\n<<: *b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"decode.yaml: line 2: a YAML alias \(\*b\)"):
        load_decode_config(path)
    with pytest.raises(ConfigError, match=r"override 'beam=\*b'"):
        load_decode_config(None, ["beam=*b"])


def test_long_values_are_quoted_short_in_errors(tmp_path):
    path = tmp_path / "c.yaml"
    long_value = "9" * 20 + "x" * 100_000
    long_key = long_value[:1000]  # YAML's longest plain key is 1024 characters
    for text in (f"model:\n  ctc_weight: '{long_value}'\n",  # a wrong type quotes the value
                 f"model:\n  {long_key}: 1\n",  # an unknown key names the key
                 f"model:\n  encoder:\n    kind: {long_value}\n",  # an unknown kind names it
                 f"frontend:\n  kind: {long_value}\n",
                 f"train:\n  {long_key}: 1\n  {long_key}: 2\n",  # a duplicated key
                 f"model:\n  ctc_weight: [{', '.join([long_value[:50]] * 2000)}]\n"):  # a long list
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as err:
            load_config(path)
        message = str(err.value)
        assert len(message) < LONGEST_ERROR and "\n" not in message, message[:200]
        assert "99999" in message  # the excerpt still shows where the value starts


def test_read_yaml_is_the_one_loader(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("a: 1e-3\nb: [1, 2]\n", encoding="utf-8")
    assert read_yaml(path) == {"a": 1e-3, "b": [1, 2]}  # YAML 1.2 exponent floats, as the config loader reads
    path.write_text("a: &x 1\nb: *x\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"x.yaml: line 2: a YAML alias \(\*x\)"):
        read_yaml(path)
    path.write_text("a: 1\na: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"x.yaml: line 2: duplicate key 'a' \(first on line 1\)"):
        read_yaml(path)
    path.write_text("a: 1\nb: [1\nc: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"x.yaml: invalid YAML: line 3: expected ',' or ']', but got ':'$"):
        read_yaml(path)
    path.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"x.yaml: not a YAML file \(not UTF-8 text\)$"):
        read_yaml(path)


@pytest.mark.parametrize("value,excerpt", [
    ("9" * 20 + "x" * 100_000, "'99999999999999999...xxxxxxxxxxxxxxxxxx'"),  # a string: 40 characters, both ends
    ([[[[1]]]], "[[[...]]]"),  # two levels of nesting
    ([1, 2, 3, 4, 5, 6], "[1, 2, 3, 4, ...]"),  # four items of a list
    ({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, "{'a': 1, 'b': 2, 'c': 3, 'd': 4, ...}"),  # and of a mapping
    (["a" * 36, "b" * 36], repr(["a" * 36, "b" * 36])),  # 80 characters: whole
    (["a" * 37, "b" * 36], repr(["a" * 37, "b" * 36])[:77] + "..."),  # 81: cut to 80
])
def test_the_excerpt_of_a_value(tmp_path, value, excerpt):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"ctc_weight": value}}, width=1_000_000), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: model.ctc_weight: expected a number, got {excerpt}"


def test_an_alias_name_and_a_reader_error_are_cut_and_escaped(tmp_path):
    path = tmp_path / "c.yaml"
    anchor = "a" * 100
    path.write_text(f"model: &{anchor} {{}}\nspecaug: *{anchor}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: line 2: a YAML alias (*{'a' * 77}...) is not accepted: write the value out"
    path.write_text("model: \x07\n", encoding="utf-8")  # a control character: PyYAML's reader error has no line mark
    with pytest.raises(ConfigError) as err:
        load_config(path)
    prefix = f"{path}: invalid YAML: "
    excerpt = str(err.value)[len(prefix):]
    assert str(err.value).startswith(prefix) and len(excerpt) == 80 and excerpt.endswith("...")
    assert excerpt.startswith("unacceptable character #x0007: special characters are not allowed\\n  in ")
