"""Training a neural LM (``asrkit train-lm``) into a self-contained LM dir: the :class:`LMTask` the one trainer
(:mod:`asrkit.train.trainer`) drives, and :func:`train_lm`.

LM dir layout (the ASR experiment dir's format, minus CMVN)::

    config.yaml        resolved LMExperimentConfig (tokenizer.path relative to the dir)
    tokenizer.json     copy of the tokenizer
    model.pt           weights with the best dev perplexity (the last epoch's without --dev-text)
    epoch{E}.pt        end-of-epoch checkpoints (step{S}.pt mid-epoch with train.save_every_steps)
    checkpoints.json   index: the train.keep_best best epochs by dev loss, and the latest one
    steps.tsv, train.log, tensorboard/

``load_neural_lm(dir)`` needs config.yaml, tokenizer.json and model.pt only; ``asrkit average``
averages the best epochs into model.pt. Re-running into a dir that holds checkpoints of the
same LM (same config up to the keys in experiment.RESUMABLE, same tokenizer) resumes from the latest
checkpoint; a different LM there is refused (``overwrite`` starts again).

Loss: cross-entropy per target token (``y1..yn <eos>``). A batch is weighed by its token count, so
accumulated (or distributed) batches weigh like one big batch. Dev perplexity is
``exp(total dev NLL / dev tokens)``, per token, <eos> included.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, Optional, Tuple

from torch import nn
from torch.utils.data import DataLoader

from asrkit.config import ConfigError, LMExperimentConfig, load_lm_config
from asrkit.lm.neural import build_lm, check_lm_model_config
from asrkit.text.tokenizer import load_tokenizer
from asrkit.train.experiment import prepare_experiment
from asrkit.train.lm_data import LMCorpus, check_data_config, lm_loader, load_corpus
from asrkit.train.optim import OPTIMIZERS, SCHEDULERS
from asrkit.train.trainer import run_experiment

log = logging.getLogger("asrkit.train.lm")


def perplexity(loss: float) -> float:
    """exp(loss per token), capped (exp(50)) so that an untrained model's loss does not overflow."""
    return math.exp(min(loss, 50.0))


def check_lm_train_config(cfg: LMExperimentConfig) -> None:
    """Check every section before anything is written; refuse the TrainConfig settings that mean nothing
    for an LM. (The trainer's own checks, e.g. train.amp against the device, follow in train_lm.)"""
    t = cfg.train
    check_lm_model_config(cfg.model)
    check_data_config(cfg.data)
    if t.optimizer not in OPTIMIZERS or t.scheduler not in SCHEDULERS or t.lr <= 0:
        raise ConfigError(f"train.optimizer must be one of {', '.join(OPTIMIZERS)}, train.scheduler one of "
                          f"{', '.join(SCHEDULERS)}, train.lr positive (got {t.optimizer}, {t.scheduler}, {t.lr})")
    if t.best_metric != "valid_loss":
        raise ConfigError(f"train.best_metric '{t.best_metric}': an LM is kept by dev loss (valid_loss, i.e. "
                          f"log perplexity)")
    if t.mwer_weight:
        raise ConfigError("train.mwer_weight: word error training is for speech recognizers, not LMs")
    if t.plot_attention:
        raise ConfigError("train.plot_attention: an LM has no attention over audio to plot")
    if t.accum_grad < 1 or t.max_nonfinite_steps < 1 or t.epochs < 0:
        raise ConfigError("train.accum_grad and train.max_nonfinite_steps must be >= 1, train.epochs >= 0")


class LMTask:
    """``build_lm(cfg.model)`` on the tokenised ``train`` text, dev perplexity on ``dev``. Units are target
    tokens; model.pt holds the epoch with the best dev loss."""

    unit, amount, best_model = "tokens", "tokens", True

    def __init__(self, cfg: LMExperimentConfig, train: LMCorpus, dev: Optional[LMCorpus], vocab_size: int):
        self.cfg, self.train, self.dev, self.vocab_size = cfg, train, dev, vocab_size
        self.name = f"LM {cfg.model.name}"

    def build_model(self) -> nn.Module:
        return build_lm(self.cfg.model, self.vocab_size)

    def build_loaders(self, model: nn.Module, pin_memory: bool) -> Tuple[DataLoader, Optional[DataLoader]]:
        seed = self.cfg.train.seed
        train = lm_loader(self.train, self.cfg.data, train=True, seed=seed, pin_memory=pin_memory)
        dev = lm_loader(self.dev, self.cfg.data, train=False, seed=seed, pin_memory=pin_memory) if self.dev else None
        return train, dev

    def forward(self, model: nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        return model(batch)

    def count(self, batch: Dict[str, Any]) -> int:
        return batch["num_tokens"]

    def measure(self, batch: Dict[str, Any]) -> float:
        return float(batch["num_tokens"])

    def loss_figures(self, loss: float) -> Dict[str, float]:
        return {"ppl": perplexity(loss)}

    def plot_validation(self, model: nn.Module, batch: Dict[str, Any], out: Dict[str, Any], limit: int,
                        epoch: int) -> int:
        return 0  # nothing to plot (check_lm_train_config refuses train.plot_attention)


def train_lm(cfg: LMExperimentConfig, out_dir: str, text: str, dev_text: Optional[str] = None,
             tokenizer: Optional[str] = None, plain_text: bool = False, device: Optional[str] = None,
             resume: str = "auto") -> Dict[str, float]:
    """Check everything, prepare ``out_dir`` (see :func:`asrkit.train.experiment.prepare_experiment`), train;
    the last epoch's summary, with ``best_valid_ppl`` when there is dev text. Runs under ``torchrun`` unchanged.

    Bad inputs (missing or empty text, a tokenizer that does not fit the text, settings the trainer cannot
    run) raise before ``out_dir`` is touched, with messages naming the file or the key.
    """
    check_lm_train_config(cfg)
    tok_path = tokenizer or cfg.tokenizer.path
    if not os.path.isfile(tok_path):
        raise FileNotFoundError(f"tokenizer '{tok_path}' not found: create one with "
                                f"'asrkit train-tokenizer --text DATA/text OUT.json'")
    tok = load_tokenizer(tok_path)
    train = load_corpus(text, tok, tok_path, plain_text, cfg.data.max_len)
    dev = load_corpus(dev_text, tok, tok_path, plain_text) if dev_text else None

    def prepare(write: bool) -> LMExperimentConfig:
        return prepare_experiment(cfg, out_dir, tok_path, resume=resume, write=write, load=load_lm_config)[0]

    def make_task(resolved: LMExperimentConfig) -> LMTask:
        for corpus in (train, dev):
            if corpus is not None:
                log.info("%s", corpus.summary())
        return LMTask(resolved, train, dev, tok.vocab_size)

    summary = run_experiment(cfg.train, out_dir, prepare, make_task, device)
    if "best_valid_loss" in summary:
        summary["best_valid_ppl"] = perplexity(summary["best_valid_loss"])
    return summary
