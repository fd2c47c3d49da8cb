"""Training a neural LM (``asrkit train-lm``) into a self-contained LM dir.

LM dir layout (the ASR experiment dir's format, minus CMVN)::

    config.yaml        resolved LMExperimentConfig (tokenizer.path relative to the dir)
    tokenizer.json     copy of the tokenizer
    model.pt           weights with the best dev perplexity (the last epoch's without --dev-text)
    epoch{E}.pt        end-of-epoch checkpoints: model, optimizer, scheduler, RNG, best dev loss so far
    checkpoints.json   index: the train.keep_best best epochs by dev loss, and the latest one
    train.log, tensorboard/

``load_neural_lm(dir)`` needs config.yaml, tokenizer.json and model.pt only. Re-running into a dir
that holds checkpoints of the same LM (same config up to the keys in experiment.RESUMABLE, same
tokenizer) resumes after the latest epoch; a different LM there is refused (``overwrite`` starts again).

Loss: cross-entropy over every target token (``y1..yn <eos>``), summed over the batches of one update
and divided by their token count, so accumulated batches weigh like one big batch. Dev perplexity is
``exp(total dev NLL / dev tokens)``, per token, <eos> included.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from tqdm import tqdm

from asrkit.config import ConfigError, LMExperimentConfig, load_lm_config
from asrkit.lm.neural import IGNORE_ID, build_lm, check_lm_model_config, make_lm_batch
from asrkit.text.tokenizer import load_tokenizer
from asrkit.checkpoint import (FORMAT_VERSION, MODEL_FILE, CheckpointIndex, load_checkpoint,
                                     rng_state, save_atomic, save_model_weights, set_rng_state)
from asrkit.train.experiment import prepare_experiment, setup_logging
from asrkit.train.lm_data import LMCorpus, check_data_config, load_corpus, sentence_batches
from asrkit.train.optim import OPTIMIZERS, SCHEDULERS, build_optimizer, build_scheduler
from asrkit.train.trainer import AMP_DTYPES, TrainingError, seed_everything

log = logging.getLogger("asrkit.train.lm")


def perplexity(loss: float) -> float:
    """exp(loss per token), capped (exp(50)) so that an untrained model's loss does not overflow."""
    return math.exp(min(loss, 50.0))


def check_lm_train_config(cfg: LMExperimentConfig) -> None:
    """Check every section before anything is written; refuse the TrainConfig settings this trainer does not
    implement (ASR-only or multi-process ones)."""
    t = cfg.train
    check_lm_model_config(cfg.model)
    check_data_config(cfg.data)
    if t.optimizer not in OPTIMIZERS or t.scheduler not in SCHEDULERS or t.lr <= 0:
        raise ConfigError(f"train.optimizer must be one of {', '.join(OPTIMIZERS)}, train.scheduler one of "
                          f"{', '.join(SCHEDULERS)}, train.lr positive (got {t.optimizer}, {t.scheduler}, {t.lr})")
    if t.amp not in ("none", "bf16"):
        raise ConfigError(f"train.amp '{t.amp}': train-lm supports none and bf16")
    if t.best_metric != "valid_loss":
        raise ConfigError(f"train.best_metric '{t.best_metric}': an LM is kept by dev loss (valid_loss, i.e. "
                          f"log perplexity)")
    if t.save_every_steps or t.plot_attention:
        raise ConfigError("train.save_every_steps and train.plot_attention are not supported by train-lm "
                          "(it checkpoints at epoch ends)")
    if t.accum_grad < 1 or t.max_nonfinite_steps < 1 or t.epochs < 0:
        raise ConfigError("train.accum_grad and train.max_nonfinite_steps must be >= 1, train.epochs >= 0")


class LMTrainer:
    """Trains ``build_lm(cfg.model)`` on ``train`` (dev perplexity on ``dev``) into a prepared ``out_dir``."""

    def __init__(self, cfg: LMExperimentConfig, out_dir: str, train: LMCorpus, dev: Optional[LMCorpus],
                 vocab_size: int, device: torch.device):
        self.cfg, self.out_dir, self.train, self.dev, self.device = cfg, out_dir, train, dev, device
        t = cfg.train
        seed_everything(t.seed)
        self.model = build_lm(cfg.model, vocab_size).to(device)
        self.sampler = sentence_batches(train.sentences, cfg.data, shuffle=True, seed=t.seed)
        self.optimizer = build_optimizer(self.model, t)
        updates = math.ceil(len(self.sampler) / t.accum_grad)
        self.scheduler = build_scheduler(self.optimizer, t, total_steps=t.epochs * updates)
        self.amp_dtype = AMP_DTYPES[t.amp]
        self.epoch, self.step, self.nonfinite_in_row = 0, 0, 0
        self.best = math.inf  # best dev loss so far (model.pt)
        self.index = CheckpointIndex(out_dir)
        if self.index.latest:
            self._resume(os.path.join(out_dir, self.index.latest))
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

        self.writer = SummaryWriter(os.path.join(out_dir, "tensorboard"), purge_step=self.step + 1)

    def _resume(self, path: str) -> None:
        ckpt = load_checkpoint(path)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.step, self.best = ckpt["epoch"] + 1, ckpt["step"], ckpt["best_valid_loss"]
        set_rng_state(ckpt["rng"])
        log.info("resumed from %s: continuing with epoch %d (step %d)", path, self.epoch, self.step)

    def _save_epoch(self, metrics: Dict[str, float]) -> None:
        """model.pt first when this epoch is the best: a kill between the two files then re-runs an
        epoch that ends in the same weights (RNG and data order are restored), never loses the best."""
        loss = metrics.get("valid_loss", math.nan)
        if self.dev is None or loss < self.best:
            self.best = loss if self.dev is not None else self.best
            save_model_weights(self.model, os.path.join(self.out_dir, MODEL_FILE), epoch=self.epoch, **metrics)
        name = f"epoch{self.epoch}.pt"
        save_atomic({"format_version": FORMAT_VERSION, "model": self.model.state_dict(),
                     "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                     "epoch": self.epoch, "step": self.step, "best_valid_loss": self.best, "rng": rng_state(),
                     **metrics}, os.path.join(self.out_dir, name))
        entry = {"file": name, "epoch": self.epoch, "step": self.step, "end_of_epoch": True, **metrics}
        self.index.remove_files(self.index.add(entry, self.cfg.train.keep_best, "valid_loss"))

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _nll(self, batch: List[int], corpus: LMCorpus) -> Tuple[torch.Tensor, int]:
        """Summed NLL (float32 scalar) of the sentences ``batch`` of ``corpus`` and their target count."""
        ys_in, ys_out = make_lm_batch([corpus.sentences[i] for i in batch], device=self.device)
        with self._autocast():
            logits = self.model(ys_in)  # (B, L, V)
        nll = F.cross_entropy(logits.float().flatten(0, 1), ys_out.flatten(), ignore_index=IGNORE_ID, reduction="sum")
        return nll, int((ys_out != IGNORE_ID).sum())

    def _update(self, group: List[List[int]]) -> Tuple[float, int]:
        """One optimizer update over the batches of ``group``; returns (summed NLL, tokens)."""
        t = self.cfg.train
        tokens = sum(len(self.train.sentences[i]) + 1 for b in group for i in b)
        total = 0.0
        for batch in group:
            nll, _ = self._nll(batch, self.train)
            (nll / tokens).backward()
            total += float(nll.detach())
        clip = t.grad_clip if t.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_row += 1
            log.warning("epoch %d: non-finite loss or gradient, update skipped (%d in a row)", self.epoch,
                        self.nonfinite_in_row)
            if self.nonfinite_in_row >= t.max_nonfinite_steps:
                raise TrainingError(f"stopping: {self.nonfinite_in_row} updates in a row had a non-finite loss or "
                                    f"gradient (epoch {self.epoch}, step {self.step}); lower train.lr")
            return 0.0, 0
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step, self.nonfinite_in_row = self.step + 1, 0
        if self.step % t.log_interval == 0:
            loss = total / tokens
            for k, v in (("loss", loss), ("ppl", perplexity(loss)), ("lr", lr), ("grad_norm", grad_norm)):
                self.writer.add_scalar(f"train/{k}", v, self.step)
            log.info("epoch %d step %d: loss %.4f lr %.3g grad_norm %.3g", self.epoch, self.step, loss, lr, grad_norm)
        return total, tokens

    def train_epoch(self) -> Dict[str, float]:
        """Epoch ``self.epoch``: its mean training loss per token, tokens/s and updates."""
        t = self.cfg.train
        self.sampler.set_epoch(self.epoch)
        self.model.train()
        start, nll_sum, tokens, group = time.time(), 0.0, 0, []
        batches = list(self.sampler)
        bar = tqdm(batches, desc=f"epoch {self.epoch}", leave=False, dynamic_ncols=True)
        for k, batch in enumerate(bar):
            group.append(batch)
            if len(group) == t.accum_grad or k == len(batches) - 1:
                nll, n = self._update(group)
                nll_sum, tokens, group = nll_sum + nll, tokens + n, []
                bar.set_postfix(loss=f"{nll_sum / max(tokens, 1):.3f}", step=self.step)
        bar.close()
        seconds = time.time() - start
        return {"train_loss": nll_sum / max(tokens, 1), "tokens_per_s": tokens / max(seconds, 1e-9)}

    @torch.no_grad()
    def evaluate(self, corpus: LMCorpus) -> Dict[str, float]:
        """Per-token dev loss and perplexity (<eos> included)."""
        self.model.eval()
        nll_sum, tokens = 0.0, 0
        for batch in sentence_batches(corpus.sentences, self.cfg.data, shuffle=False):
            nll, n = self._nll(batch, corpus)
            nll_sum, tokens = nll_sum + float(nll), tokens + n
        loss = nll_sum / tokens
        return {"valid_loss": loss, "valid_ppl": perplexity(loss)}

    def fit(self) -> Dict[str, float]:
        """Train until ``train.epochs``; returns the last epoch's summary (plus ``best_valid_ppl``)."""
        t = self.cfg.train
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("LM %s: %.2fM parameters, device %s, %d batches per epoch", self.cfg.model.name, n_params / 1e6,
                 self.device, len(self.sampler))
        summary: Dict[str, float] = dict(self.index.latest_entry() or {})
        if self.epoch >= t.epochs:
            log.info("%s: already trained for %d epochs; nothing to do (raise train.epochs to continue)",
                     self.out_dir, t.epochs)
        while self.epoch < t.epochs:
            tr = self.train_epoch()
            metrics = self.evaluate(self.dev) if self.dev is not None else {}
            msg = (f"epoch {self.epoch}: train loss {tr['train_loss']:.4f} (ppl {perplexity(tr['train_loss']):.2f}, "
                   f"step {self.step}, {tr['tokens_per_s']:.0f} tokens/s)")
            if metrics:
                best = " (best)" if metrics["valid_loss"] < self.best else ""
                msg += f", dev loss {metrics['valid_loss']:.4f}, dev ppl {metrics['valid_ppl']:.2f}{best}"
                self.writer.add_scalar("valid/loss", metrics["valid_loss"], self.step)
                self.writer.add_scalar("valid/ppl", metrics["valid_ppl"], self.step)
            log.info(msg)
            self._save_epoch(metrics)
            summary = {"epoch": self.epoch, "step": self.step, "train_loss": tr["train_loss"], **metrics}
            self.epoch += 1
        self.writer.close()
        if self.dev is not None and math.isfinite(self.best):
            summary["best_valid_ppl"] = perplexity(self.best)
        return summary


def train_lm(cfg: LMExperimentConfig, out_dir: str, text: str, dev_text: Optional[str] = None,
             tokenizer: Optional[str] = None, plain_text: bool = False, device: Optional[str] = None,
             resume: str = "auto") -> Dict[str, float]:
    """Check everything, prepare ``out_dir`` (see :func:`asrkit.train.experiment.prepare_experiment`), train; the last epoch's summary.

    Bad inputs (missing or empty text, a tokenizer that does not fit the text) raise before ``out_dir``
    is touched, with messages naming the file.
    """
    check_lm_train_config(cfg)
    tok_path = tokenizer or cfg.tokenizer.path
    if not os.path.isfile(tok_path):
        raise FileNotFoundError(f"tokenizer '{tok_path}' not found: create one with "
                                f"'asrkit train-tokenizer --text DATA/text OUT.json'")
    tok = load_tokenizer(tok_path)
    train = load_corpus(text, tok, tok_path, plain_text, cfg.data.max_len)
    dev = load_corpus(dev_text, tok, tok_path, plain_text) if dev_text else None
    dev_ = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    resolved, _ = prepare_experiment(cfg, out_dir, tok_path, resume=resume, load=load_lm_config)
    setup_logging(out_dir)
    for corpus in (train, dev):
        if corpus is not None:
            log.info("%s", corpus.summary())
    return LMTrainer(resolved, out_dir, train, dev, tok.vocab_size, dev_).fit()
