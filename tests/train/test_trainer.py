"""The training loop: reproducibility, gradient accumulation, non-finite steps, unreadable and too-short
utterances, bf16 autocast on CPU, attention plots."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from asrkit.config import ConfigError
from asrkit.extras import MissingExtraError
from asrkit.models.asr import AsrModel
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.experiment import prepare_experiment
from asrkit.train.loader import alignable
from asrkit.train.steplog import read_step_log
from asrkit.train.task import AsrTask
from asrkit.train.trainer import Trainer, TrainingError, train
from trainkit import EXACT, first_moment, make_data_dir, tiny_config

def run(corpus, exp, extra=(), valid=True):
    cfg = tiny_config(list(extra))
    return train(cfg, str(exp), str(corpus["train"]), str(corpus["dev"]) if valid else None,
                 str(corpus["tokenizer"]), device="cpu")


def test_same_seed_same_losses_other_seed_other_losses(corpus, tmp_path):
    run(corpus, tmp_path / "a", ["train.epochs=1"], valid=False)
    run(corpus, tmp_path / "b", ["train.epochs=1"], valid=False)
    run(corpus, tmp_path / "c", ["train.epochs=1", "train.seed=7"], valid=False)
    a, b, c = (read_step_log(str(tmp_path / x / "steps.tsv")) for x in "abc")
    assert len(a) == 4 and all(math.isfinite(r["loss"]) for r in a)
    assert a == b  # dropout and SpecAugment are on: the RNG streams must match exactly
    assert [r["loss"] for r in a] != [r["loss"] for r in c]


def test_accumulating_unequal_batches_equals_one_big_batch(equal_lengths, tmp_path):
    run(equal_lengths, tmp_path / "big", EXACT + ["data.max_batch_size=4"], valid=False)
    # Batches of 3 and 1 utterances accumulated into one update: weights 3/4 and 1/4, not 1/2 each.
    run(equal_lengths, tmp_path / "acc", EXACT + ["data.max_batch_size=3", "train.accum_grad=2"], valid=False)
    big, acc = first_moment(tmp_path / "big"), first_moment(tmp_path / "acc")
    for k in big:  # float32 sums in another order: relative error of each parameter's whole gradient
        assert float((acc[k] - big[k]).norm()) <= 1e-5 * float(big[k].norm()) + 1e-9, k
    loss_big = read_step_log(str(tmp_path / "big" / "steps.tsv"))[0]["loss"]
    assert read_step_log(str(tmp_path / "acc" / "steps.tsv"))[0]["loss"] == pytest.approx(loss_big, rel=1e-6)


def make_trainer(corpus, exp, extra=()):
    cfg, _ = prepare_experiment(tiny_config(list(extra)), str(exp), str(corpus["tokenizer"]))
    return Trainer(cfg.train, AsrTask(cfg, str(exp), str(corpus["train"]), None), str(exp), device="cpu")


def spoil_forward(monkeypatch, spoil) -> None:
    """AsrModel.forward with ``spoil(call number from 1, model, output)`` applied to each output."""
    calls = {"n": 0}
    forward = AsrModel.forward

    def spoiled(self, batch):
        out = forward(self, batch)
        calls["n"] += 1
        spoil(calls["n"], self, out)
        return out

    monkeypatch.setattr(AsrModel, "forward", spoiled)


def nan_gradient(model) -> torch.Tensor:
    """A term worth 0 whose gradient is NaN: d sqrt(u)/du is infinite at u = 0."""
    return torch.sqrt(model.ctc.proj.bias.sum() * 0.0)


def test_non_finite_loss_or_gradient_skips_the_update(corpus, tmp_path, monkeypatch, caplog):
    def flaky(n, model, out):
        if n == 2:  # NaN loss
            out["loss"] = out["loss"] * float("nan")
        if n == 3:  # finite loss, NaN gradient
            out["loss"] = out["loss"] + nan_gradient(model)

    spoil_forward(monkeypatch, flaky)
    caplog.set_level(logging.WARNING, logger="asrkit.train")
    trainer = make_trainer(corpus, tmp_path / "exp", ["train.epochs=1"])
    summary = trainer.fit()
    assert summary["nonfinite"] == 2 and trainer.step == 2  # 4 batches, 2 updates skipped
    messages = [r.getMessage() for r in caplog.records]
    assert any("non-finite loss, update skipped" in m for m in messages)
    assert any("non-finite gradient, update skipped" in m for m in messages)
    assert all(torch.isfinite(p).all() for p in trainer.raw_model.parameters())
    assert [r["step"] for r in read_step_log(str(tmp_path / "exp" / "steps.tsv"))] == [1, 2]


def test_fp16_overflows_are_counted_and_reported_apart_from_failures(corpus, tmp_path, monkeypatch, caplog):
    # With train.amp=fp16 (CUDA only) the gradient scaler skips an update whose scaled gradient overflowed
    # and halves its scale: several times at the start of a run. Here the same scaler on the CPU, and two
    # batches with a NaN gradient: skipped as overflows, not as failures, and the epoch summary says so.
    def overflowing(n, model, out):
        if n <= 2:  # finite loss, NaN gradient
            out["loss"] = out["loss"] + nan_gradient(model)

    spoil_forward(monkeypatch, overflowing)
    caplog.set_level(logging.INFO, logger="asrkit.train")
    trainer = make_trainer(corpus, tmp_path / "exp", ["train.epochs=1"])
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)  # what train.amp=fp16 builds on CUDA
    summary = trainer.fit()
    assert summary["overflows"] == 2 and summary["nonfinite"] == 0 and trainer.step == 2
    assert trainer.scaler.get_scale() == 2.0 ** 14
    messages = [r.getMessage() for r in caplog.records]
    assert any("2 updates to step 2" in m and "0 non-finite updates skipped, 2 fp16 overflows skipped (loss "
               "scale lowered)" in m for m in messages), messages
    assert not any("update skipped (" in m for m in messages)


def test_too_many_non_finite_steps_in_a_row_stop_training(corpus, tmp_path, monkeypatch):
    forward = AsrModel.forward
    monkeypatch.setattr(AsrModel, "forward",
                        lambda self, batch: {**forward(self, batch), "loss": torch.tensor(float("inf"),
                                                                                        requires_grad=True)})
    trainer = make_trainer(corpus, tmp_path / "exp", ["train.max_nonfinite_steps=3"])
    with pytest.raises(TrainingError, match="3 updates in a row had a non-finite loss"):
        trainer.fit()
    assert trainer.step == 0


def test_unreadable_utterance_is_skipped_and_counted(corpus, tmp_path, caplog):
    bad = corpus["train"] / "train_003.wav"
    bad.write_bytes(b"RIFF not really a wav file" * 10)  # utt2dur still lists it, so it is loaded
    caplog.set_level(logging.INFO, logger="asrkit")
    summary = run(corpus, tmp_path / "exp", valid=False)
    assert summary["skipped_utts"] == 1 and summary["epoch"] == 1  # counted per epoch, training went on
    log = (tmp_path / "exp" / "train.log").read_text()
    assert "epoch 0: train loss" in log and "1 unreadable utts skipped" in log
    assert any("train_003" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_alignable_counts_a_blank_between_repeated_labels():
    class Model(torch.nn.Module):
        def __init__(self, ctc=True):
            super().__init__()
            self.ctc = torch.nn.Identity() if ctc else None

        def output_lengths(self, wav_lens):  # 1000 samples per encoder frame
            return wav_lens // 1000

    ok = alignable([0.25, 0.25, 0.25], [[3, 4, 5, 6], [3, 3, 4, 4], [3, 3, 4]], Model(), 16000)
    assert ok == [True, False, True]  # 4 frames: 4 distinct labels fit, 3 3 4 4 needs 6, 3 3 4 needs 4
    ok = alignable([0.25, 0.375], [[3, 3, 4, 4], [3, 3, 4, 4]], Model(), 16000)  # 4 and 6 frames
    assert ok == [False, True]
    assert alignable([0.25], [[3, 3, 4, 4]], Model(ctc=False), 16000) == [True]  # attention: a frame per label
    assert alignable([0.375], [[3, 3, 4, 4]], Model(), 16000, speed_factor=1.5) == [False]  # 4 frames


def test_utterances_too_short_for_their_transcript_are_dropped_with_a_report(tmp_path, caplog):
    data = make_data_dir(tmp_path / "train", 5, seed=3, durations=[0.9, 0.9, 0.9, 0.9, 0.35],
                         texts=["AB", "BA", "CAB", "AD", "ABCDEF ABCDEF ABCDEF"])
    tok = tmp_path / "tok.json"
    CharTokenizer.train(["ABCDEF "]).save(tok)
    caplog.set_level(logging.WARNING, logger="asrkit.train")
    trainer = make_trainer({"train": data, "tokenizer": tok}, tmp_path / "exp", ["train.epochs=1"])
    report = [r.getMessage() for r in caplog.records if "shorter than their label sequence" in r.getMessage()]
    assert len(report) == 1 and "dropped 1 of 5" in report[0] and "train_004" in report[0]
    assert len(trainer.train_loader.dataset) == 4
    trainer.fit()
    assert all(math.isfinite(r["loss"]) for r in read_step_log(str(tmp_path / "exp" / "steps.tsv")))


def test_bf16_autocast_on_cpu_trains_close_to_fp32(corpus, tmp_path):
    run(corpus, tmp_path / "fp32", ["train.epochs=1"], valid=False)
    run(corpus, tmp_path / "bf16", ["train.epochs=1", "train.amp=bf16"], valid=False)
    fp32, bf16 = (read_step_log(str(tmp_path / x / "steps.tsv"))[0]["loss"] for x in ("fp32", "bf16"))
    assert fp32 != bf16 and bf16 == pytest.approx(fp32, rel=0.05)  # autocast is on, and sane


def test_fp16_needs_cuda(corpus, tmp_path):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        make_trainer(corpus, tmp_path / "exp", ["train.amp=fp16"])


def test_attention_plots_without_the_plot_extra_fail_before_training(corpus, tmp_path, not_installed):
    not_installed("matplotlib")
    with pytest.raises(MissingExtraError,
                       match=r"^train.plot_attention needs matplotlib, .*'\.\[plot\]' \(in the asrkit checkout\)$"):
        make_trainer(corpus, tmp_path / "exp", ["train.plot_attention=3"])
    make_trainer(corpus, tmp_path / "exp2", ["train.plot_attention=0"])  # no plots: no matplotlib needed


def test_attention_outputs_are_plotted_for_validation_utterances(corpus, tmp_path, monkeypatch):
    forward = AsrModel.forward

    def with_attention(self, batch):  # stand-in for an attention model: a uniform (B, L+1, T) alignment
        out = forward(self, batch)
        b, length = batch["tokens"].shape
        out["attention"] = torch.full((b, length + 1, 30), 1.0 / 30)
        return out

    monkeypatch.setattr(AsrModel, "forward", with_attention)
    run(corpus, tmp_path / "exp", ["train.epochs=1", "train.plot_attention=3"])
    pngs = sorted((tmp_path / "exp" / "attention" / "epoch0").glob("*.png"))
    assert len(pngs) == 3 and all(p.stem.startswith("dev_") for p in pngs)
