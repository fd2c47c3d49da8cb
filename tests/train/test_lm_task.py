"""Neural LMs trained by the one Trainer (LMTask): token-weighted gradient accumulation, keep-best model.pt,
checkpoint averaging with asrkit average."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict

import pytest
import torch

from asrkit.checkpoint import MODEL_FILE, load_checkpoint
from asrkit.cli.average import main as average_main
from asrkit.config import load_lm_config
from asrkit.lm import NeuralLMScorer, build_lm, load_neural_lm, make_lm_batch, sentence_log_likelihood
from asrkit.text.tokenizer import CharTokenizer, load_tokenizer
from asrkit.train.lm_task import train_lm
from asrkit.train.steplog import read_step_log
from asrkit.train.trainer import Trainer, seed_everything
from trainkit import REPO

LSTM = REPO / "conf" / "tiny_lm_lstm.yaml"
# Targets 3, 9 and 17: however two batches split them, token weights differ from sentence weights.
SHORT = ["AB", "CAB DAB", "BAD CAB DAD ACE"]
PHRASES = ["THE CAT SAT", "A DOG RAN", "THE MAT", "A CAT RAN TO THE MAT", "THE DOG SAT ON A CAT"]


def write(path: Path, lines) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def run(tmp_path: Path, name: str, text, dev=None, overrides=()) -> Dict[str, float]:
    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(list(text) + list(dev or [])).save(tok)
    cfg = load_lm_config(LSTM, ["train.log_interval=1", *overrides])
    return train_lm(cfg, str(tmp_path / name), write(tmp_path / f"{name}.txt", text),
                    write(tmp_path / f"{name}.dev", dev) if dev else None, str(tok), plain_text=True, device="cpu")


def test_accumulated_batches_weigh_by_tokens_like_one_big_batch(tmp_path):
    exact = ["model.dropout=0.0", "train.grad_clip=0", "train.epochs=1", "data.max_tokens=400"]
    run(tmp_path, "big", SHORT, overrides=exact + ["data.max_batch_size=3"])
    run(tmp_path, "acc", SHORT, overrides=exact + ["data.max_batch_size=2", "train.accum_grad=2"])
    assert "2 batches per epoch" in (tmp_path / "acc" / "train.log").read_text(encoding="utf-8")
    big, acc = (load_checkpoint(tmp_path / d / "epoch0.pt") for d in ("big", "acc"))
    assert big["step"] == acc["step"] == 1

    # Reference: the gradient of total NLL / total target tokens at the initial weights, by hand.
    cfg = load_lm_config(LSTM, exact)
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    seed_everything(cfg.train.seed)  # as the trainer does before building the model
    lm = build_lm(cfg.model, tok.vocab_size)
    sentences = [tok.encode(s) for s in SHORT]
    nll = -sentence_log_likelihood(lm, *make_lm_batch(sentences)).sum()
    loss = nll / sum(len(s) + 1 for s in sentences)
    loss.backward()
    params = [p for p in lm.parameters() if p.ndim > 1] + [p for p in lm.parameters() if p.ndim <= 1]  # optimizer order
    for i, p in enumerate(params):
        want = 0.1 * p.grad  # Adam's first moment after one update
        assert float(want.norm()) > 0, i
        for ckpt in (big, acc):
            got = ckpt["optimizer"]["state"][i]["exp_avg"]
            assert float((got - want).norm()) <= 1e-5 * float(want.norm()) + 1e-9, i
    logged = [read_step_log(str(tmp_path / d / "steps.tsv"))[0]["loss"] for d in ("big", "acc")]
    assert logged == pytest.approx([float(loss.detach())] * 2, rel=1e-6)


def test_model_pt_is_the_best_epoch_and_asrkit_average_makes_a_loadable_lm(tmp_path, capsys, monkeypatch):
    # Dev losses scripted so that the last epoch is not the best: 2.0, 1.0, 3.0 (the real ones only fall).
    validate, scripted = Trainer.validate, [2.0, 1.0, 3.0]

    def scripted_validate(self):
        real = validate(self)
        assert math.isfinite(real["valid_loss"])
        return {"valid_loss": scripted[self.epoch], "valid_ppl": math.exp(scripted[self.epoch])}

    monkeypatch.setattr(Trainer, "validate", scripted_validate)
    summary = run(tmp_path, "lm", PHRASES * 8, PHRASES[:3], ["train.epochs=3", "train.keep_best=2",
                                                             "data.max_tokens=200"])
    assert summary["best_valid_loss"] == 1.0 and summary["best_valid_ppl"] == pytest.approx(math.e)
    lm_dir = tmp_path / "lm"
    assert sorted(p.name for p in lm_dir.glob("epoch*.pt")) == ["epoch0.pt", "epoch1.pt", "epoch2.pt"]
    assert "valid loss 1.0000, valid ppl 2.7183 (best)" in (lm_dir / "train.log").read_text(encoding="utf-8")
    model = load_checkpoint(lm_dir / MODEL_FILE)  # the best dev loss, not the last epoch
    assert model["epoch"] == 1 and all(torch.equal(v, load_checkpoint(lm_dir / "epoch1.pt")["model"][k])
                                       for k, v in model["model"].items())
    best = ["epoch1.pt", "epoch0.pt"]

    capsys.readouterr()
    assert average_main(["--model", str(lm_dir), "--best", "2"]) == 0  # the metric from the LM config
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    chosen = [load_checkpoint(lm_dir / f)["model"] for f in best]
    lm, tok = load_neural_lm(lm_dir)
    for name, tensor in lm.state_dict().items():
        torch.testing.assert_close(tensor, (chosen[0][name] + chosen[1][name]) / 2, rtol=1e-6, atol=1e-7)
    assert not torch.equal(chosen[0]["output.bias"], chosen[1]["output.bias"])
    scorer = NeuralLMScorer(lm)
    state = scorer.select_state(scorer.init_state(1, 1, torch.device("cpu")), torch.tensor([0]),
                                torch.tensor(tok.encode("A")))
    assert torch.isfinite(scorer.final_score(state)).all()
