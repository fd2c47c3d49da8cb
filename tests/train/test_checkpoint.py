"""Atomic writes, the checkpoint index's keep-best pruning, and checkpoint averaging (asrkit average)."""
from __future__ import annotations

import re

import pytest
import torch

from asrkit.cli.average import main as average_main
from asrkit.checkpoint import (MODEL_FILE, CheckpointIndex, average_state_dicts, load_checkpoint, save_atomic)
from asrkit.train.trainer import train
from trainkit import tiny_config


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle")


def test_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_atomic({"x": 1}, path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_atomic({"x": Unpicklable()}, path)
    assert torch.load(path) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_index_keeps_the_best_k_by_metric_and_the_latest(tmp_path):
    index = CheckpointIndex(str(tmp_path))
    dropped = []
    losses = [3.0, 1.0, 2.0, 5.0]
    for epoch, loss in enumerate(losses):
        dropped += index.add({"file": f"step{epoch * 10 + 5}.pt", "epoch": epoch, "step": epoch * 10 + 5,
                              "end_of_epoch": False}, keep_best=2, best_metric="valid_loss")
        dropped += index.add({"file": f"epoch{epoch}.pt", "epoch": epoch, "step": epoch * 10 + 10,
                              "end_of_epoch": True, "valid_loss": loss, "valid_acc": -loss},
                             keep_best=2, best_metric="valid_loss")
    # epoch0 (3.0) was among the best two until epoch2 (2.0) came; epoch3 (5.0) is kept as the latest.
    assert sorted(e["file"] for e in index.entries) == ["epoch1.pt", "epoch2.pt", "epoch3.pt"]
    assert sorted(dropped) == ["epoch0.pt", "step15.pt", "step25.pt", "step35.pt", "step5.pt"]
    reread = CheckpointIndex(str(tmp_path))
    assert reread.latest == "epoch3.pt" and reread.entries == index.entries
    assert [e["file"] for e in reread.best(2, "valid_loss")] == ["epoch1.pt", "epoch2.pt"]
    assert [e["file"] for e in reread.best(1, "valid_acc")] == ["epoch1.pt"]  # higher is better


def test_average_of_state_dicts_is_the_elementwise_mean():
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(7)},
              {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(9)},
              {"w": torch.tensor([2.0, 1.0]), "n": torch.tensor(8)}]
    avg = average_state_dicts(states)
    assert torch.equal(avg["w"], torch.tensor([2.0, 3.0])) and int(avg["n"]) == 7
    with pytest.raises(ValueError, match="different keys"):
        average_state_dicts([{"w": torch.zeros(1)}, {"v": torch.zeros(1)}])


def test_average_cli_averages_the_best_checkpoints_by_validation_loss(corpus, tmp_path, capsys):
    exp = tmp_path / "exp"
    cfg = tiny_config(["train.epochs=3", "train.keep_best=2", "data.max_batch_size=4"])
    train(cfg, str(exp), str(corpus["train"]), str(corpus["dev"]), str(corpus["tokenizer"]), device="cpu")
    # Independent record of the validation losses: the epoch lines of train.log.
    valid = {int(e): float(v) for e, v in re.findall(r"epoch (\d+): train loss .*valid loss ([\d.]+)",
                                                     (exp / "train.log").read_text())}
    assert sorted(valid) == [0, 1, 2]
    best = sorted(valid, key=valid.get)[:2]
    kept = sorted(int(p.stem[5:]) for p in exp.glob("epoch*.pt"))
    assert kept == sorted(set(best) | {2})  # the best two plus the latest (for resuming)

    out = tmp_path / "avg.pt"
    assert average_main(["--model", str(exp), "--best", "2", "--out", str(out)]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    chosen = [load_checkpoint(exp / f"epoch{e}.pt")["model"] for e in best]
    averaged = load_checkpoint(out)
    assert sorted(averaged["epochs"]) == sorted(best)
    for name, tensor in averaged["model"].items():
        if torch.is_floating_point(tensor):
            torch.testing.assert_close(tensor, (chosen[0][name] + chosen[1][name]) / 2, rtol=1e-6, atol=1e-7)
    assert not torch.equal(chosen[0]["ctc.proj.weight"], chosen[1]["ctc.proj.weight"])
    # Default output: model.pt, which the decoder loads.
    assert average_main(["--model", str(exp), "--best", "1"]) == 0
    assert torch.equal(load_checkpoint(exp / MODEL_FILE)["model"]["ctc.proj.weight"],
                       chosen[0]["ctc.proj.weight"])
    assert average_main(["--model", str(tmp_path / "nothing"), "--best", "1"]) == 2


@pytest.mark.parametrize("entry, latest, what", [
    ({"file": "../victim.txt", "epoch": 0, "step": 1}, "epoch9.pt", "'../victim.txt'"),
    ({"file": "/tmp/epoch1.pt", "epoch": 0, "step": 1}, "epoch9.pt", "'/tmp/epoch1.pt'"),
    ({"file": "epoch1.pt/../../x.pt", "epoch": 0, "step": 1}, "epoch9.pt", "'epoch1.pt/../../x.pt'"),
    ({"file": "epoch1.pt", "epoch": 0, "step": 1}, "../model.pt", "'../model.pt'"),
    ({"file": "epoch1.pt", "epoch": 0, "step": "1"}, "epoch9.pt", "step"),
    ("epoch1.pt", "epoch9.pt", "entry 0"),
])
def test_an_index_naming_files_the_trainer_does_not_write_is_refused(tmp_path, entry, latest, what):
    """checkpoints.json is data: a crafted one must not make pruning delete files outside the checkpoints."""
    import json

    fake = [{"file": f"epoch{e}.pt", "epoch": e, "step": e, "end_of_epoch": True, "valid_loss": 0.1}
            for e in range(5, 10)]
    (tmp_path / "checkpoints.json").write_text(json.dumps({"latest": latest, "checkpoints": [entry] + fake}))
    with pytest.raises(ValueError) as err:
        CheckpointIndex(str(tmp_path))
    msg = str(err.value)
    assert str(tmp_path / "checkpoints.json") in msg and what in msg and "\n" not in msg


def test_a_crafted_index_does_not_make_a_resumed_run_delete_a_file(corpus, tmp_path, capsys):
    """The attack of issue 28: '../victim.txt' beside five better fake epochs, then a resumed `asrkit train`."""
    import json

    from asrkit.cli.train import main as train_main
    from trainkit import cli_args

    exp = tmp_path / "exp"
    assert train_main(cli_args(corpus, exp, ["train.epochs=1", "data.max_batch_size=8"], valid=False)) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    index = json.loads((exp / "checkpoints.json").read_text())
    index["checkpoints"] = [{"file": "../victim.txt", "epoch": 0, "step": 0, "end_of_epoch": True,
                             "valid_loss": 9.0}] + [
        {"file": f"epoch{e}.pt", "epoch": 0, "step": 0, "end_of_epoch": True, "valid_loss": 0.1}
        for e in range(5, 10)] + index["checkpoints"]
    (exp / "checkpoints.json").write_text(json.dumps(index))
    capsys.readouterr()
    rc = train_main(cli_args(corpus, exp, ["train.epochs=2", "data.max_batch_size=8"], valid=False))
    assert victim.read_text() == "keep me"
    assert rc == 2
    err = capsys.readouterr().err
    assert "checkpoints.json" in err and "../victim.txt" in err


def test_weights_of_another_structure_or_shape_are_one_line_naming_the_file_and_the_mismatch(tmp_path):
    from asrkit.checkpoint import load_weights

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    state = {"0.weight": torch.zeros(5, 4), "0.bias": torch.zeros(3), "2.weight": torch.zeros(2, 3)}
    with pytest.raises(ValueError) as err:
        load_weights(model, {"model": state}, tmp_path / "model.pt")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'model.pt'}: ") and "\n" not in msg
    assert "0.weight: (5, 4) in the file, (3, 4) in the model" in msg
    assert "missing 2 (1.weight, 1.bias)" in msg and "unexpected 1 (2.weight)" in msg
    many = {f"extra{i}": torch.zeros(1) for i in range(9)}
    with pytest.raises(ValueError, match=r"unexpected 9 \(extra0, extra1, extra2, \.\.\.\)"):
        load_weights(model, {"model": {**model.state_dict(), **many}}, "m.pt")
    for bad in ({}, {"model": [1, 2]}, {"model": {"0.weight": "x"}}):
        with pytest.raises(ValueError, match=r"^m.pt: no model weights in it \(expected 'model': names to tensors\)$"):
            load_weights(model, bad, "m.pt")
    fitting = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}
    load_weights(model, {"model": fitting}, "m.pt")
    assert all(torch.equal(v, fitting[k]) for k, v in model.state_dict().items())


def test_training_from_weights_or_a_checkpoint_that_do_not_fit_is_one_line(corpus, tmp_path, capsys):
    from asrkit.checkpoint import FORMAT_VERSION
    from asrkit.cli.train import main as train_main
    from trainkit import cli_args

    other = tmp_path / "other.pt"
    save_atomic({"format_version": FORMAT_VERSION, "model": {"ctc.proj.weight": torch.zeros(3, 3)}}, other)
    capsys.readouterr()
    assert train_main(cli_args(corpus, tmp_path / "a", ["train.epochs=1", f"train.init_from={other}"], False)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(other) in err and "ctc.proj.weight: (3, 3) in the file" in err

    exp = tmp_path / "b"
    assert train_main(cli_args(corpus, exp, ["train.epochs=1", "data.max_batch_size=8"], valid=False)) == 0
    ckpt = load_checkpoint(exp / "epoch0.pt")
    del ckpt["optimizer"]
    save_atomic(ckpt, exp / "epoch0.pt")
    capsys.readouterr()
    assert train_main(cli_args(corpus, exp, ["train.epochs=2", "data.max_batch_size=8"], valid=False)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{exp / 'epoch0.pt'}: cannot resume from it: no optimizer" in err


def test_a_model_dir_whose_weights_do_not_fit_its_config_is_one_line(corpus, tmp_path):
    from asrkit.pipeline.transcriber import load_from_dir

    exp = tmp_path / "exp"
    train(tiny_config(["train.epochs=1", "data.max_batch_size=8"]), str(exp), str(corpus["train"]),
          tokenizer=str(corpus["tokenizer"]), device="cpu")
    config = (exp / "config.yaml").read_text()
    (exp / "config.yaml").write_text(config.replace("d_model: 32", "d_model: 48"))
    with pytest.raises(ValueError) as err:
        load_from_dir(str(exp))
    assert str(err.value).startswith(f"{exp / MODEL_FILE}: ") and "\n" not in str(err.value)
    assert "(32,) in the file, (48,) in the model" in str(err.value)
