"""Checkpoints load with weights_only: a model dir from a stranger cannot run code, and old formats are named."""
from __future__ import annotations

import os
import pickle

import pytest
import torch

from asrkit.checkpoint import FORMAT_VERSION, load_checkpoint, rng_state, save_atomic, set_rng_state


class RunsCode:
    """Unpickling this calls os.system: the payload a malicious checkpoint would carry."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    with open(path, "wb") as fh:  # a checkpoint-shaped dict with a code-running object inside
        torch.save({"format_version": FORMAT_VERSION, "model": {}, "x": RunsCode(str(marker))}, fh, pickle_protocol=2)
    with pytest.raises(ValueError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()
    with open(path, "wb") as fh:  # a plain pickle (not torch's zip format) too
        pickle.dump(RunsCode(str(marker)), fh, protocol=2)
    with pytest.raises(ValueError):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_model_dir_with_a_crafted_model_pt_loads_nothing(tmp_path):
    """load_model(dir) goes through the same safe loader."""
    import asrkit
    from asrkit.config import ExperimentConfig, save_config
    from asrkit.text.tokenizer import CharTokenizer

    marker = tmp_path / "pwned"
    save_config(ExperimentConfig(), tmp_path / "config.yaml")
    tok_path = tmp_path / ExperimentConfig().tokenizer.path
    tok_path.parent.mkdir(parents=True, exist_ok=True)
    CharTokenizer(list("AB")).save(tok_path)
    with open(tmp_path / "model.pt", "wb") as fh:
        torch.save({"format_version": FORMAT_VERSION, "model": RunsCode(str(marker))}, fh, pickle_protocol=2)
    with pytest.raises(ValueError, match="refused"):
        asrkit.load_model(str(tmp_path))
    assert not marker.exists()


def test_format_1_checkpoints_are_refused_by_name(tmp_path):
    path = tmp_path / "model.pt"
    save_atomic({"format_version": 1, "model": {"ctc_head.weight": torch.zeros(2, 2)}}, path)
    with pytest.raises(ValueError, match=r"format version 1.*before models were composed"):
        load_checkpoint(path)


def test_rng_state_round_trips_through_a_safe_checkpoint(tmp_path):
    """The RNG state is stored as tensors and plain containers (numpy's state would need unsafe loading)."""
    import random

    import numpy as np

    path = tmp_path / "rng.pt"
    save_atomic({"format_version": FORMAT_VERSION, "rng": rng_state()}, path)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    set_rng_state(load_checkpoint(path)["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected


def test_a_format_1_experiment_dir_is_refused_naming_the_format(tmp_path):
    """An experiment dir written before models were composed: its config.yaml has model.name."""
    import asrkit
    from asrkit.config import ConfigError

    (tmp_path / "config.yaml").write_text("model:\n  name: ctc_transformer\n  encoder:\n    d_model: 144\n")
    with pytest.raises(ConfigError, match=r"'model.name' is a key of config format 1.*model.encoder.kind"):
        asrkit.load_model(str(tmp_path))
