"""Training loop for any registered model: accumulation, mixed precision, DDP, validation, checkpoints.

One optimizer update consumes ``train.accum_grad`` batches. Each batch's loss (a mean over its
utterances) is weighted by ``world_size * utts_in_batch / utts_in_update`` (utterances counted over
all ranks), so after DDP's gradient averaging the update is exactly that of one batch holding all
the utterances. Gradients are clipped to ``train.grad_clip`` (<= 0: no clipping, the norm is still
logged). An update whose loss or gradient is not finite is skipped with a warning and counted;
``train.max_nonfinite_steps`` of them in a row stop training with :class:`TrainingError`. (With fp16,
an overflow the gradient scaler handles by lowering its scale is not counted.)

Checkpoints (see :mod:`asrkit.checkpoint`) are written at every epoch end and every
``train.save_every_steps`` updates; training resumes from the latest one with the model, optimizer,
scheduler, scaler, sampler position, epoch totals and every rank's RNG state, so the loss curve
(``steps.tsv``) continues exactly as if it had never stopped.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from asrkit.config import ConfigError, ExperimentConfig
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import load_tokenizer
from asrkit.train import distributed as dist_util
from asrkit.checkpoint import (FORMAT_VERSION, METRICS, MODEL_FILE, CheckpointIndex, load_checkpoint, rng_state,
                                     save_atomic, save_model_weights, set_rng_state)
from asrkit.train.distributed import DistContext, all_reduce_sum, gather_objects
from asrkit.train.experiment import STEP_LOG, ExperimentError, prepare_experiment, setup_logging
from asrkit.train.loader import build_loader
from asrkit.train.optim import build_optimizer, build_scheduler
from asrkit.train.steplog import StepLog

log = logging.getLogger("asrkit.train")
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many non-finite steps in a row); the message says why."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _new_totals() -> Dict[str, float]:
    return {"loss_sum": 0.0, "utts": 0.0, "updates": 0, "skipped_utts": 0, "nonfinite": 0, "audio_s": 0.0}


class Trainer:
    """Trains on the Kaldi data dir ``train_dir`` into ``exp_dir`` (prepared by :func:`prepare_experiment`);
    resumes from the latest checkpoint there if any."""

    def __init__(self, cfg: ExperimentConfig, exp_dir: str, train_dir: str, valid_dir: Optional[str],
                 device: Optional[str] = None, ctx: Optional[DistContext] = None):
        self.cfg, self.exp_dir, t = cfg, exp_dir, cfg.train
        self.ctx = ctx or dist_util.init_distributed(device)
        self.device = self.ctx.device
        if t.amp not in AMP_DTYPES:
            raise ConfigError(f"train.amp '{t.amp}' is unknown (choose from: {', '.join(AMP_DTYPES)})")
        if t.amp == "fp16" and self.device.type != "cuda":
            raise ConfigError("train.amp fp16 needs a CUDA device; use bf16 (or none) on CPU")
        if t.accum_grad < 1 or t.max_nonfinite_steps < 1:
            raise ConfigError("train.accum_grad and train.max_nonfinite_steps must be at least 1")
        if t.best_metric not in METRICS:
            raise ConfigError(f"train.best_metric '{t.best_metric}' is unknown (choose from: {', '.join(METRICS)})")
        seed_everything(t.seed)  # same initial weights on every rank
        self.tokenizer = load_tokenizer(os.path.join(exp_dir, cfg.tokenizer.path))
        cmvn = os.path.join(exp_dir, cfg.cmvn) if cfg.cmvn else None
        self.raw_model = build_model(cfg, self.tokenizer.vocab_size, cmvn_path=cmvn).to(self.device)
        cuda = self.device.type == "cuda"
        self.train_loader = build_loader(train_dir, cfg, self.tokenizer, self.raw_model, train=True, pin_memory=cuda)
        self.valid_loader = (build_loader(valid_dir, cfg, self.tokenizer, self.raw_model, train=False,
                                          pin_memory=cuda) if valid_dir else None)
        self.model: torch.nn.Module = self.raw_model
        if self.ctx.distributed:
            # Every part a model has is in its loss graph (a zero-weight part is never built).
            self.model = DistributedDataParallel(self.raw_model, device_ids=[self.device] if cuda else None)
        if self.ctx.rank > 0:  # rank 0 draws exactly what a single process draws
            seed_everything(t.seed + 1_000_003 * self.ctx.rank)
        self.optimizer = build_optimizer(self.raw_model, t)
        updates = math.ceil(len(self.train_loader.batch_sampler) / t.accum_grad)
        self.scheduler = build_scheduler(self.optimizer, t, total_steps=t.epochs * updates)
        self.scaler = torch.amp.GradScaler("cuda", enabled=t.amp == "fp16")
        self.amp_dtype = AMP_DTYPES[t.amp]
        self.step, self.epoch, self.batches_done = 0, 0, 0
        self.totals, self.nonfinite_in_row = _new_totals(), 0
        self._last_batch: Optional[Dict[str, Any]] = None
        self.index = CheckpointIndex(exp_dir)
        if self.index.latest:
            self._resume(os.path.join(exp_dir, self.index.latest))
        self.writer = self.steplog = None
        if self.ctx.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(os.path.join(exp_dir, "tensorboard"), purge_step=self.step + 1)
            self.steplog = StepLog(os.path.join(exp_dir, STEP_LOG), resume_step=self.step)

    # ---------------------------------------------------------------- checkpoints
    def _save(self, end_of_epoch: bool, metrics: Optional[Dict[str, float]] = None) -> None:
        rngs = gather_objects(rng_state(), self.ctx)  # a collective: every rank takes part
        if not self.ctx.is_main:
            return
        sampler = self.train_loader.batch_sampler
        name = f"epoch{self.epoch}.pt" if end_of_epoch else f"step{self.step}.pt"
        save_atomic({"format_version": FORMAT_VERSION, "model": self.raw_model.state_dict(),
                     "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                     "scaler": self.scaler.state_dict(), "step": self.step, "epoch": self.epoch,
                     "batches_done": self.batches_done, "end_of_epoch": end_of_epoch, "totals": dict(self.totals),
                     "nonfinite_in_row": self.nonfinite_in_row, "rng": rngs, "world_size": self.ctx.world_size,
                     "sampler": sampler.state_dict(batches_consumed=self.batches_done), **(metrics or {})},
                    os.path.join(self.exp_dir, name))
        entry = {"file": name, "epoch": self.epoch, "step": self.step, "end_of_epoch": end_of_epoch, **(metrics or {})}
        stale = self.index.add(entry, self.cfg.train.keep_best, self.cfg.train.best_metric)
        self.index.remove_files(stale)

    def _resume(self, path: str) -> None:
        ckpt = load_checkpoint(path)
        self.raw_model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.step, self.nonfinite_in_row = ckpt["step"], ckpt["nonfinite_in_row"]
        if ckpt["end_of_epoch"]:
            self.epoch, self.batches_done = ckpt["epoch"] + 1, 0
        else:
            self.epoch, self.batches_done, self.totals = ckpt["epoch"], ckpt["batches_done"], dict(ckpt["totals"])
            try:
                self.train_loader.batch_sampler.load_state_dict(ckpt["sampler"])
            except ValueError as exc:
                raise ExperimentError(f"{path}: {exc}; resume with the same number of processes") from None
        rngs = ckpt["rng"]
        if len(rngs) == self.ctx.world_size:
            set_rng_state(rngs[self.ctx.rank])
        else:
            log.warning("%s was written by %d processes, now %d: random streams restart from the seed",
                        path, len(rngs), self.ctx.world_size)
            seed_everything(self.cfg.train.seed + self.step + 1_000_003 * self.ctx.rank)
        log.info("resumed from %s: epoch %d, step %d, %d batches into the epoch", path, self.epoch, self.step,
                 self.batches_done)

    # ---------------------------------------------------------------- training
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _to_device(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _update(self, group: List[Dict[str, Any]]) -> None:
        """One optimizer update over the batches of ``group`` (see the module docstring)."""
        t, world = self.cfg.train, self.ctx.world_size
        counts = [len(b["utts"]) for b in group]
        self.totals["skipped_utts"] += sum(int(b.get("num_skipped", 0)) for b in group)
        total_utts = all_reduce_sum([float(sum(counts))], self.ctx)[0]
        if total_utts == 0:
            log.warning("epoch %d: %d batches with no readable utterance skipped", self.epoch, len(group))
            return
        loss_sum, audio_s, out = 0.0, 0.0, {}
        for i, (batch, n) in enumerate(zip(group, counts)):
            weight = n * world / total_utts
            if n == 0:
                if not self.ctx.distributed:
                    continue
                if self._last_batch is None:
                    raise TrainingError("a batch with no readable utterance came before any readable one on rank "
                                        f"{self.ctx.rank}; DDP cannot skip it (fix the data: see the warnings)")
                batch, weight = self._last_batch, 0.0  # keeps the ranks' collectives in step; adds nothing
            else:
                self._last_batch = batch
            sync = i == len(group) - 1 or not self.ctx.distributed
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with self._autocast():
                    out = self.model(self._to_device(batch))
                self.scaler.scale(out["loss"] * weight).backward()
            if n:
                loss_sum += float(out["loss"].detach()) * n
                audio_s += float(batch["wav_lens"].sum()) / self.cfg.frontend.sample_rate
        self.scaler.unscale_(self.optimizer)
        clip = t.grad_clip if t.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip))
        loss_sum, audio_s = all_reduce_sum([loss_sum, audio_s], self.ctx)
        loss = loss_sum / total_utts
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # with fp16: lowers the scale after an overflow
            if self.scaler.is_enabled() and math.isfinite(loss):
                log.debug("step %d: fp16 gradient overflow, loss scale lowered", self.step)
                return
            self.nonfinite_in_row += 1
            self.totals["nonfinite"] += 1
            what = "loss" if not math.isfinite(loss) else "gradient"
            log.warning("epoch %d batch %d: non-finite %s, update skipped (%d in a row; utts %s)", self.epoch,
                        self.batches_done, what, self.nonfinite_in_row, ", ".join(group[-1]["utts"][:3]))
            if self.nonfinite_in_row >= t.max_nonfinite_steps:
                raise TrainingError(
                    f"stopping: {self.nonfinite_in_row} updates in a row had a non-finite {what} (epoch "
                    f"{self.epoch}, step {self.step}); lower train.lr, check the data, or try train.amp none")
            return
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this update uses
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.nonfinite_in_row = 0
        for k, v in (("loss_sum", loss_sum), ("utts", total_utts), ("updates", 1), ("audio_s", audio_s)):
            self.totals[k] += v
        self._log_step(loss, lr, grad_norm, out)
        if t.save_every_steps > 0 and self.step % t.save_every_steps == 0:
            self._save(end_of_epoch=False)

    def _log_step(self, loss: float, lr: float, grad_norm: float, out: Dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        self.steplog.write(self.step, self.epoch, loss, lr, grad_norm)
        if self.step % self.cfg.train.log_interval:
            return
        elapsed = max(time.time() - self._epoch_start, 1e-9)
        speed = (self.totals["audio_s"] - self._audio_at_start) / elapsed  # s of audio per s, all ranks
        for k, v in out.items():
            if (k.startswith("loss") or k == "acc") and k != "loss":
                self.writer.add_scalar(f"train/{k}", float(v), self.step)
        for k, v in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm), ("audio_s_per_s", speed),
                     ("frames_per_s", speed * self.cfg.frontend.sample_rate / self.cfg.frontend.hop_length)):
            self.writer.add_scalar(f"train/{k}", v, self.step)
        log.info("epoch %d step %d: loss %.4f lr %.3g grad_norm %.3g, %.1f s audio/s", self.epoch, self.step, loss,
                 lr, grad_norm, speed)

    def train_epoch(self) -> Dict[str, float]:
        """The rest of epoch ``self.epoch`` (all of it unless resumed mid-epoch); returns its totals."""
        t = self.cfg.train
        sampler = self.train_loader.batch_sampler
        sampler.set_epoch(self.epoch)  # after a resume, the same epoch keeps the sampler's position
        self.train_loader.generator.manual_seed(t.seed * 1000 + self.epoch)  # workers' seeds, per epoch
        total = self.batches_done + len(sampler)
        self.model.train()
        self._epoch_start, self._audio_at_start = time.time(), self.totals["audio_s"]
        bar = tqdm(total=total, initial=self.batches_done, desc=f"epoch {self.epoch}", leave=False,
                   dynamic_ncols=True, disable=not self.ctx.is_main)
        group: List[Dict[str, Any]] = []
        for batch in self.train_loader:
            self.batches_done += 1
            group.append(batch)
            bar.update(1)
            if len(group) == t.accum_grad or self.batches_done == total:
                self._update(group)
                group = []
                speed = (self.totals["audio_s"] - self._audio_at_start) / max(time.time() - self._epoch_start, 1e-9)
                bar.set_postfix(loss=f"{self.totals['loss_sum'] / max(self.totals['utts'], 1):.3f}",
                                step=self.step, audio_s_per_s=f"{speed:.1f}")
        bar.close()
        n = max(self.totals["utts"], 1)
        return {"loss": self.totals["loss_sum"] / n, "seconds": time.time() - self._epoch_start,
                **{k: self.totals[k] for k in ("updates", "skipped_utts", "nonfinite", "audio_s")}}

    # ---------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> Dict[str, float]:
        """Loss (and decoder accuracy, if the model reports one) averaged over utterances of all ranks."""
        self.raw_model.eval()
        sums = [0.0, 0.0, 0.0, 0.0]  # loss * B, B, acc * B, B with acc
        plotted = 0
        for batch in self.valid_loader:
            n = len(batch["utts"])
            if n == 0:
                continue
            batch = self._to_device(batch)
            with self._autocast():
                out = self.raw_model(batch)
            sums[0] += float(out["loss"]) * n
            sums[1] += n
            if "acc" in out:
                sums[2] += float(out["acc"]) * n
                sums[3] += n
            if self.ctx.is_main and plotted < self.cfg.train.plot_attention and "attention" in out:
                plotted += self._plot(batch, out["attention"], self.cfg.train.plot_attention - plotted)
        loss_sum, count, acc_sum, acc_count = all_reduce_sum(sums, self.ctx)
        result = {"valid_loss": loss_sum / count if count else math.nan}
        if acc_count:
            result["valid_acc"] = acc_sum / acc_count
        return result

    def _plot(self, batch: Dict[str, Any], attention: torch.Tensor, limit: int) -> int:
        """Attention images of up to ``limit`` utterances of ``batch``; ``attention`` is (B, L, T)."""
        from asrkit.train.plot import plot_attention

        frames = self.raw_model.output_lengths(batch["wav_lens"].cpu()).tolist()
        eos = int(attention.size(1) == batch["tokens"].size(1) + 1)  # a row for <eos>
        count = min(limit, attention.size(0))
        for b in range(count):
            rows = int(batch["token_lens"][b]) + eos
            cols = min(int(frames[b]), attention.size(2))
            ids = batch["tokens"][b, : int(batch["token_lens"][b])].tolist()
            labels = [self.tokenizer.token_list[i] for i in ids] + ["<eos>"] * eos
            utt = batch["utts"][b]
            plot_attention(attention[b, :rows, :cols], os.path.join(self.exp_dir, "attention", f"epoch{self.epoch}",
                                                                    f"{utt}.png"),
                           title=f"{utt} (epoch {self.epoch})", tokens=labels)
        return count

    # ---------------------------------------------------------------- driver
    def fit(self) -> Dict[str, float]:
        """Train until ``train.epochs``, validating and checkpointing every epoch; the last epoch's summary."""
        t = self.cfg.train
        n_params = sum(p.numel() for p in self.raw_model.parameters())
        log.info("model %s: %.2fM parameters, device %s, %d process(es), %d batches per epoch per process",
                 f"{self.cfg.model.encoder.kind}+{self.cfg.model.decoder.kind}", n_params / 1e6, self.device, self.ctx.world_size,
                 len(self.train_loader.batch_sampler) + self.batches_done)
        summary: Dict[str, float] = dict(self.index.latest_entry() or {})
        if self.epoch >= t.epochs:
            log.info("%s: already trained for %d epochs; nothing to do (raise train.epochs to continue)",
                     self.exp_dir, t.epochs)
        while self.epoch < t.epochs:
            tr = self.train_epoch()
            metrics = self.validate() if self.valid_loader is not None else {}
            summary = {"epoch": self.epoch, "step": self.step, "train_loss": tr["loss"], **metrics,
                       "skipped_utts": tr["skipped_utts"], "nonfinite": tr["nonfinite"]}
            msg = (f"epoch {self.epoch}: train loss {tr['loss']:.4f} ({tr['updates']} updates to step {self.step}, "
                   f"{tr['seconds']:.1f}s, {tr['skipped_utts']} unreadable utts skipped, {tr['nonfinite']} "
                   f"non-finite updates skipped)")
            if metrics:
                msg += f", valid loss {metrics['valid_loss']:.4f}"
                msg += f", valid acc {metrics['valid_acc']:.4f}" if "valid_acc" in metrics else ""
                if self.ctx.is_main:
                    for k, v in metrics.items():
                        self.writer.add_scalar(f"valid/{k[6:]}", v, self.step)
            log.info(msg)
            self._save(end_of_epoch=True, metrics=metrics)
            if self.ctx.is_main:
                save_model_weights(self.raw_model, os.path.join(self.exp_dir, MODEL_FILE), epoch=self.epoch)
            self.epoch, self.batches_done, self.totals = self.epoch + 1, 0, _new_totals()
        if self.ctx.is_main:
            self.writer.close()
            self.steplog.close()
        return summary


def train(cfg: ExperimentConfig, exp_dir: str, train_dir: str, valid_dir: Optional[str] = None,
          tokenizer: Optional[str] = None, cmvn: Optional[str] = None, device: Optional[str] = None,
          resume: str = "auto") -> Dict[str, float]:
    """Prepare ``exp_dir`` (see :func:`prepare_experiment`), train, return the last epoch's summary.

    Runs under ``torchrun`` unchanged: every rank checks the experiment dir, rank 0 writes it.
    """
    ctx = dist_util.init_distributed(device)
    try:
        # Every rank checks first (same verdict everywhere, so no rank waits for a failed one); rank 0 writes.
        resolved, _ = prepare_experiment(cfg, exp_dir, tokenizer, cmvn, resume, write=False)
        dist_util.barrier(ctx)
        if ctx.is_main:
            prepare_experiment(cfg, exp_dir, tokenizer, cmvn, resume, write=True)
        dist_util.barrier(ctx)
        setup_logging(exp_dir, ctx.is_main)
        return Trainer(resolved, exp_dir, train_dir, valid_dir, ctx=ctx).fit()
    finally:
        dist_util.cleanup()
