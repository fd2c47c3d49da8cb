"""asrkit train-lm end to end: a self-contained LM dir, resuming (after an epoch or mid-epoch), refusing
another LM, clear input errors."""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import List

import pytest
import torch

from asrkit.cli import main
from asrkit.config import load_lm_config
from asrkit.lm import NeuralLMScorer, load_neural_lm
from asrkit.text.tokenizer import CharTokenizer
from asrkit.checkpoint import CheckpointIndex, load_checkpoint
from asrkit.train.lm_data import read_text
from asrkit.train.steplog import read_step_log
from asrkit.train.trainer import Trainer

CONF = Path(__file__).resolve().parents[2] / "conf"
WORDS = ["THE CAT", "A DOG", "SAT ON", "RAN TO", "THE MAT", "A TREE"]


def sentences(n: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(WORDS[:2])} {rng.choice(WORDS[2:4])} {rng.choice(WORDS[4:])}" for _ in range(n)]


@pytest.fixture
def data(tmp_path: Path) -> dict:
    """Kaldi texts (with an empty line and an id-only line in train) and a char tokenizer."""
    train = [f"tr{i:03d} {s}" for i, s in enumerate(sentences(80, 0))] + ["tr_empty", ""]
    (tmp_path / "text").write_text("\n".join(train) + "\n", encoding="utf-8")
    (tmp_path / "dev").write_text("\n".join(f"dv{i} {s}" for i, s in enumerate(sentences(10, 1))) + "\n",
                                  encoding="utf-8")
    CharTokenizer.train(sentences(80, 0)).save(tmp_path / "tokenizer.json")
    return {"text": tmp_path / "text", "dev": tmp_path / "dev", "tokenizer": tmp_path / "tokenizer.json"}


def args(data: dict, out: Path, *overrides: str, config: str = "tiny_lm_lstm") -> List[str]:
    argv = ["train-lm", "--config", str(CONF / f"{config}.yaml"), "--text", str(data["text"]), "--dev-text",
            str(data["dev"]), "--tokenizer", str(data["tokenizer"]), "--out", str(out), "--device", "cpu",
            "--set", "data.max_tokens=400"]  # several batches per epoch
    for o in overrides:
        argv += ["--set", o]
    return argv


def lm_scores(lm_dir: Path) -> torch.Tensor:
    """Scorer log-probs of every token after a few prefixes, and the final scores."""
    lm, tok = load_neural_lm(lm_dir)
    scorer = NeuralLMScorer(lm)
    state = scorer.init_state(1, 2, torch.device("cpu"))
    vocab = torch.arange(tok.vocab_size).expand(2, -1)
    out = [scorer.score(state, vocab)]
    for a, b in zip(tok.encode("THE CAT"), tok.encode("A DOG R")):
        state = scorer.select_state(state, torch.tensor([0, 1]), torch.tensor([a, b]))
        out.append(scorer.score(state, vocab))
    return torch.cat(out + [scorer.final_score(state)[:, None]], dim=1)


@pytest.mark.parametrize("config", ["tiny_lm_lstm", "tiny_lm_transformer"])
def test_train_lm_writes_a_self_contained_dir(data, tmp_path, capsys, config):
    out = tmp_path / "lm"
    assert main(args(data, out, "train.epochs=2", config=config)) == 0
    assert "best dev perplexity" in capsys.readouterr().out
    for name in ("config.yaml", "tokenizer.json", "model.pt", "epoch1.pt", "checkpoints.json", "train.log",
                 "steps.tsv"):
        assert (out / name).is_file(), name
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    saved = load_lm_config(out / "config.yaml")  # every hyperparameter, the tokenizer path relative
    assert saved.tokenizer.path == "tokenizer.json" and saved.train.epochs == 2 and saved.data.max_tokens == 400
    assert saved.model == load_lm_config(CONF / f"{config}.yaml").model
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "80 sentences" in log and "2 empty lines skipped" in log and "valid ppl" in log

    before = lm_scores(out)
    moved = tmp_path / "elsewhere" / "lm"
    shutil.move(str(out), str(moved))
    data["tokenizer"].unlink()  # the dir alone is enough
    assert torch.equal(lm_scores(moved), before)
    assert torch.isfinite(before).all()


def test_rerun_resumes_like_an_uninterrupted_run(data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(args(data, straight, "train.epochs=3")) == 0
    assert main(args(data, resumed, "train.epochs=2")) == 0
    assert main(args(data, resumed, "train.epochs=3")) == 0
    log = (resumed / "train.log").read_text(encoding="utf-8")
    assert "resumed from" in log and "epoch1.pt" in log and "continuing with epoch 2" in log
    a, b = load_checkpoint(straight / "epoch2.pt"), load_checkpoint(resumed / "epoch2.pt")
    assert a["step"] == b["step"] and a["valid_loss"] == b["valid_loss"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])

    model = (resumed / "model.pt").read_bytes()
    assert main(args(data, resumed, "train.epochs=3")) == 0  # finished: nothing to do
    assert "already trained for 3 epochs" in (resumed / "train.log").read_text(encoding="utf-8")
    assert (resumed / "model.pt").read_bytes() == model


def test_crash_mid_epoch_then_rerun_resumes_from_the_step_checkpoint(data, tmp_path, monkeypatch):
    """train.save_every_steps (the shared trainer's) works for LMs: a run that dies mid-epoch continues from
    its latest step checkpoint with the same batches and random streams as an uninterrupted run."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    settings = ("train.epochs=2", "train.save_every_steps=3")
    assert main(args(data, straight, *settings)) == 0
    per_epoch = len(read_step_log(str(straight / "steps.tsv"))) // 2
    assert per_epoch > 3  # so that step 6 falls inside epoch 1

    calls, update = [0], Trainer._update

    def dying_update(self, group):
        calls[0] += 1
        if calls[0] == 7:
            raise KeyboardInterrupt  # not caught by the CLI: the process would end here
        return update(self, group)

    monkeypatch.setattr(Trainer, "_update", dying_update)
    with pytest.raises(KeyboardInterrupt):
        main(args(data, resumed, *settings))
    monkeypatch.setattr(Trainer, "_update", update)
    assert CheckpointIndex(str(resumed)).latest == "step6.pt"
    assert load_checkpoint(resumed / "step6.pt")["batches_done"] == 6 - per_epoch

    assert main(args(data, resumed, *settings)) == 0
    assert "resumed from" in (resumed / "train.log").read_text(encoding="utf-8")
    assert read_step_log(str(resumed / "steps.tsv")) == read_step_log(str(straight / "steps.tsv"))
    a, b = load_checkpoint(straight / "epoch1.pt"), load_checkpoint(resumed / "epoch1.pt")
    assert a["valid_loss"] == b["valid_loss"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_another_lm_or_tokenizer_in_the_dir_is_refused_unless_overwrite(data, tmp_path, capsys):
    out = tmp_path / "lm"
    assert main(args(data, out, "train.epochs=1")) == 0
    other = tmp_path / "other.json"
    CharTokenizer.train(sentences(80, 0) + ["XYZ"]).save(other)
    argv = args(data, out, "train.epochs=1")
    argv[argv.index(str(data["tokenizer"]))] = str(other)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a different experiment" in err and str(other) in err and "--overwrite" in err
    assert main(args(data, out, "train.epochs=1", "model.hidden_size=64", "model.embed_dim=64")) == 2
    assert "model.hidden_size: 128 -> 64" in capsys.readouterr().err
    assert main(argv + ["--overwrite"]) == 0
    assert (out / "tokenizer.json").read_bytes() == other.read_bytes()


def test_bad_inputs_give_errors_naming_the_file(data, tmp_path, capsys):
    out = tmp_path / "lm"
    missing = tmp_path / "nope"
    argv = args(data, out)
    argv[argv.index(str(data["text"]))] = str(missing)
    assert main(argv) == 2
    assert f"{missing}: text file not found" in capsys.readouterr().err

    empty = tmp_path / "empty"
    empty.write_text("u1\n\nu2   \n", encoding="utf-8")
    argv = args(data, out)
    argv[argv.index(str(data["dev"]))] = str(empty)
    assert main(argv) == 2
    assert f"{empty}: no non-empty sentences" in capsys.readouterr().err

    lower = tmp_path / "lower.json"  # a tokenizer made for another text
    CharTokenizer.train([s.lower() for s in sentences(80, 0)]).save(lower)
    argv = args(data, out)
    argv[argv.index(str(data["tokenizer"]))] = str(lower)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{data['text']}:" in err and "<unk>" in err and str(lower) in err

    argv[argv.index(str(lower))] = str(missing)
    assert main(argv) == 2
    assert f"tokenizer '{missing}' not found" in capsys.readouterr().err

    assert main(args(data, out, "model.hiden_size=3")) == 2
    assert "'model.hiden_size'" in capsys.readouterr().err
    assert main(args(data, out, "train.amp=fp16")) == 2  # --device cpu
    assert "train.amp fp16 needs a CUDA device" in capsys.readouterr().err
    assert main(args(data, out, "train.amp=fp8")) == 2
    assert "train.amp 'fp8' is unknown" in capsys.readouterr().err
    assert main(args(data, out, "train.plot_attention=2")) == 2
    assert "train.plot_attention" in capsys.readouterr().err
    assert main(args(data, out, "model.name=gru")) == 2
    assert "model.name 'gru' is not a neural LM" in capsys.readouterr().err
    assert not out.exists()  # nothing was written for any of these


def test_kaldi_text_drops_the_utterance_ids_and_plain_text_keeps_every_word(tmp_path):
    path = tmp_path / "text"
    path.write_text("u1 THE CAT\nu2\n\nu3 A  DOG\n", encoding="utf-8")
    assert read_text(str(path)) == (["THE CAT", "A DOG"], 2)
    assert read_text(str(path), plain_text=True) == (["u1 THE CAT", "u2", "u3 A DOG"], 1)
