"""asrkit train: automatic resume, --resume/--overwrite, refusing to overwrite a different experiment."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from asrkit.cli.train import main  # noqa: E402
from asrkit.text.tokenizer import CharTokenizer  # noqa: E402
from asrkit.train.steplog import read_step_log  # noqa: E402
from trainkit import WORDS, cli_args, make_data_dir  # noqa: E402


@pytest.fixture
def data(tmp_path):
    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(WORDS).save(tok)
    return {"train": make_data_dir(tmp_path / "train", 4, seed=1), "dev": make_data_dir(tmp_path / "dev", 2, seed=2),
            "tokenizer": tok}


def steps(exp: Path) -> list:
    return [int(r["step"]) for r in read_step_log(str(exp / "steps.tsv"))]


def test_rerun_is_a_no_op_more_epochs_continue_and_other_configs_are_refused(data, tmp_path, capsys):
    exp = tmp_path / "exp"
    assert main(cli_args(data, exp, ["train.epochs=1"])) == 0
    assert steps(exp) == [1, 2]
    first = (exp / "epoch0.pt").read_bytes()

    assert main(cli_args(data, exp, ["train.epochs=1"])) == 0  # finished: nothing to do
    assert "already trained for 1 epochs" in (exp / "train.log").read_text()
    assert steps(exp) == [1, 2] and (exp / "epoch0.pt").read_bytes() == first

    capsys.readouterr()
    assert main(cli_args(data, exp, ["train.epochs=1", "model.encoder.d_model=48"])) == 2
    err = capsys.readouterr().err
    assert "already holds a different experiment" in err and "model.encoder.d_model: 32 -> 48" in err
    assert "--overwrite" in err and (exp / "epoch0.pt").read_bytes() == first
    assert "d_model: 32" in (exp / "config.yaml").read_text()

    other_tok = tmp_path / "other.json"
    CharTokenizer.train(WORDS + ["XYZ"]).save(other_tok)
    args = cli_args(data, exp, ["train.epochs=1"])
    args[args.index(str(data["tokenizer"]))] = str(other_tok)
    assert main(args) == 2
    assert "tokenizer:" in capsys.readouterr().err

    assert main(cli_args(data, exp, ["train.epochs=2"]) + ["--resume"]) == 0  # more epochs: continues
    assert steps(exp) == [1, 2, 3, 4]
    assert "resumed from" in (exp / "train.log").read_text()

    assert main(cli_args(data, exp, ["train.epochs=1", "model.encoder.d_model=48"]) + ["--overwrite"]) == 0
    assert steps(exp) == [1, 2] and not (exp / "epoch1.pt").exists()
    assert "d_model: 48" in (exp / "config.yaml").read_text()


def test_option_errors(data, tmp_path, capsys):
    assert main(cli_args(data, tmp_path / "new", []) + ["--resume"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(cli_args(data, tmp_path / "x", []) + ["--resume", "--overwrite"])
    assert exc.value.code == 2
    assert main(cli_args(data, tmp_path / "fp16", ["train.amp=fp16"])) == 2
    assert "fp16 needs a CUDA device" in capsys.readouterr().err
    assert main(cli_args(data, tmp_path / "y", ["train.best_metric=wer"])) == 2
    assert "train.best_metric 'wer'" in capsys.readouterr().err


def test_a_zero_log_interval_is_one_line_before_anything_is_written(data, tmp_path, capsys):
    exp = tmp_path / "exp"
    assert main(cli_args(data, exp, ["train.log_interval=0"])) == 2
    err = capsys.readouterr().err
    assert err.endswith("train.log_interval must be at least 1, got 0\n") and err.count("\n") == 1
    assert not exp.exists()
