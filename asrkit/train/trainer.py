"""One training loop for every model (ASR models and LMs): accumulation, mixed precision, DDP, validation,
checkpoints, logging. What differs between tasks comes from a :class:`~asrkit.train.task.TrainTask`.

One optimizer update consumes ``train.accum_grad`` batches. Each batch's loss (a mean over its units:
utterances for ASR, target tokens for an LM) is weighted by ``world_size * units_in_batch /
units_in_update`` (units counted over all ranks), so after DDP's gradient averaging the update is
exactly that of one batch holding all the units. Validation loss is likewise the mean per unit over
the whole validation set (an LM's: total dev NLL / dev tokens). Gradients are clipped to
``train.grad_clip`` (<= 0: no clipping, the norm is still logged). An update whose loss or gradient
is not finite is skipped with a warning and counted;
``train.max_nonfinite_steps`` of them in a row stop training with :class:`TrainingError`. (With fp16,
an overflow the gradient scaler handles by lowering its scale is not counted there; the epoch summary
reports how many updates it skipped, several at the start while the scale settles.)

Checkpoints (see :mod:`asrkit.checkpoint`) are written at every epoch end and every
``train.save_every_steps`` updates; training resumes from the latest one with the model, optimizer,
scheduler, scaler, sampler position, epoch totals and every rank's RNG state, so the loss curve
(``steps.tsv``) continues exactly as if it had never stopped. model.pt is written before the epoch's
checkpoint (a kill between the two re-runs an epoch that ends in the same weights): the last epoch's
weights, or the best epoch's by ``train.best_metric`` for a task with ``best_model`` (without
validation data, the last one's).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from asrkit.audio.waveaug import KINDS, check_sources
from asrkit.config import ConfigError, ExperimentConfig, TrainConfig
from asrkit.rundir_lock import RunDirBusy, RunDirLock
from asrkit.extras import require
from asrkit.train import distributed as dist_util
from asrkit.checkpoint import (FORMAT_VERSION, METRICS, MODEL_FILE, CheckpointIndex, load_checkpoint, load_weights,
                               rng_state, save_atomic, save_model_weights, set_rng_state)
from asrkit.train.distributed import DistContext, all_reduce_sum, gather_objects
from asrkit.train.experiment import STEP_LOG, ExperimentError, prepare_experiment, setup_logging
from asrkit.train.optim import build_optimizer, build_scheduler
from asrkit.train.steplog import StepLog
from asrkit.train.task import AsrTask, TrainTask

log = logging.getLogger("asrkit.train")
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# What _save writes and _resume reads ("scaler" and "best" are read if present).
AUGMENTED = "augmented_"  # epoch totals of waveform augmentation, by kind ("augmented_utts": utterances through it)
# The batch counts summed over the ranks with each update's unit count (one collective), in a fixed order.
RANK_COUNTS = ("skipped_utts", *(AUGMENTED + k for k in ("utts", *KINDS)))
RESUME_KEYS = ("model", "optimizer", "scheduler", "step", "epoch", "batches_done", "end_of_epoch", "totals",
               "nonfinite_in_row", "rng", "sampler")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many non-finite steps in a row); the message says why."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_train_config(t: TrainConfig, device: torch.device) -> None:
    """The ``train.*`` settings that depend on the device or on the trainer's tables (counts and ranges are checked
    as the config is built); checked before an experiment dir is written."""
    if t.amp not in AMP_DTYPES:
        raise ConfigError(f"train.amp '{t.amp}' is unknown (choose from: {', '.join(AMP_DTYPES)})")
    if t.amp == "fp16" and device.type != "cuda":
        raise ConfigError("train.amp fp16 needs a CUDA device; use bf16 (or none) on CPU")
    if t.best_metric not in METRICS:
        raise ConfigError(f"train.best_metric '{t.best_metric}' is unknown (choose from: {', '.join(METRICS)})")
    if t.init_from is not None and not os.path.isfile(t.init_from):
        raise ConfigError(f"train.init_from: {t.init_from}: no such file")


def _new_totals() -> Dict[str, float]:
    """An epoch's running totals: loss * units, units, updates, unreadable utterances, non-finite updates
    skipped, fp16 overflows (updates the gradient scaler skipped), and the task's throughput amount."""
    return {"loss_sum": 0.0, "count": 0.0, "updates": 0, "skipped_utts": 0, "nonfinite": 0, "overflows": 0,
            "amount": 0.0}


class Trainer:
    """Trains ``task``'s model with the settings ``cfg`` into ``exp_dir`` (prepared by :func:`prepare_experiment`);
    resumes from the latest checkpoint there if any."""

    def __init__(self, cfg: TrainConfig, task: TrainTask, exp_dir: str, device: Optional[str] = None,
                 ctx: Optional[DistContext] = None):
        self.cfg, self.task, self.exp_dir, t = cfg, task, exp_dir, cfg
        self.ctx = ctx or dist_util.init_distributed(device)
        self.device = self.ctx.device
        check_train_config(t, self.device)
        if t.plot_attention:  # at the start, not at the first validation
            require("matplotlib", "train.plot_attention")
        seed_everything(t.seed)  # same initial weights on every rank
        self.raw_model = task.build_model().to(self.device)
        self.train_loader, self.valid_loader = task.build_loaders(self.raw_model, self.device.type == "cuda")
        self.model: torch.nn.Module = self.raw_model
        if t.init_from is not None and not CheckpointIndex(exp_dir).latest:
            self._init_from(t.init_from)
        if self.ctx.distributed:
            if t.mwer_weight > 0:
                raise ConfigError("train.mwer_weight: MWER fine-tuning runs in one process (its N-best search and "
                                  "rescoring run outside DistributedDataParallel's forward)")
            # Every part a model has is in its loss graph (a zero-weight part is never built).
            cuda = self.device.type == "cuda"
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
        self.best: Optional[float] = None  # train.best_metric of the best epoch so far
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
    def _init_from(self, path: str) -> None:
        try:
            load_weights(self.raw_model, load_checkpoint(path), path)
        except ValueError as exc:
            raise ExperimentError(f"train.init_from: {exc}") from None
        log.info("initialised the model from %s", path)

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
                     "nonfinite_in_row": self.nonfinite_in_row, "best": self.best, "rng": rngs,
                     "world_size": self.ctx.world_size,
                     "sampler": sampler.state_dict(batches_consumed=self.batches_done), **(metrics or {})},
                    os.path.join(self.exp_dir, name))
        entry = {"file": name, "epoch": self.epoch, "step": self.step, "end_of_epoch": end_of_epoch, **(metrics or {})}
        stale = self.index.add(entry, self.cfg.keep_best, self.cfg.best_metric)
        self.index.remove_files(stale)

    def _resume(self, path: str) -> None:
        ckpt = load_checkpoint(path)
        missing = [k for k in RESUME_KEYS if k not in ckpt]
        if missing:
            raise ExperimentError(f"{path}: cannot resume from it: no {', '.join(missing)} (not a training checkpoint)")
        load_weights(self.raw_model, ckpt, path)
        try:
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
            if ckpt.get("scaler"):
                self.scaler.load_state_dict(ckpt["scaler"])
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # written for other parameters or settings
            raise ExperimentError(f"{path}: cannot resume from it: its optimizer state does not fit "
                                  f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        self.step, self.nonfinite_in_row, self.best = ckpt["step"], ckpt["nonfinite_in_row"], ckpt.get("best")
        if ckpt["end_of_epoch"]:
            self.epoch, self.batches_done = ckpt["epoch"] + 1, 0
        else:
            self.epoch, self.batches_done = ckpt["epoch"], ckpt["batches_done"]
            self.totals = {**_new_totals(), **ckpt["totals"]}  # a total added since the checkpoint starts at 0
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
            seed_everything(self.cfg.seed + self.step + 1_000_003 * self.ctx.rank)
        log.info("resumed from %s: continuing with epoch %d at step %d, %d batches into it", path, self.epoch,
                 self.step, self.batches_done)

    # ---------------------------------------------------------------- training
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _to_device(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _update(self, group: List[Dict[str, Any]]) -> None:
        """One optimizer update over the batches of ``group`` (see the module docstring)."""
        t, world = self.cfg, self.ctx.world_size
        counts = [self.task.count(b) for b in group]
        # unreadable audio, and waveform augmentation in the loader (augment:): what was applied, for train.log
        mine = dict.fromkeys(RANK_COUNTS, 0.0)
        for b in group:
            mine["skipped_utts"] += int(b.get("num_skipped", 0))
            for kind, n in b.get("augmented", {}).items():
                mine[AUGMENTED + kind] += n
        total, *summed = all_reduce_sum([float(sum(counts)), *mine.values()], self.ctx)  # every rank's
        for k, v in zip(RANK_COUNTS, summed):
            if v:  # a kind never applied stays out of train.log's list
                self.totals[k] = self.totals.get(k, 0) + int(v)
        if total == 0:
            log.warning("epoch %d: %d batches with nothing readable skipped", self.epoch, len(group))
            return
        loss_sum, amount, out = 0.0, 0.0, {}
        for i, (batch, n) in enumerate(zip(group, counts)):
            weight = n * world / total
            if n == 0:
                if not self.ctx.distributed:
                    continue
                if self._last_batch is None:
                    raise TrainingError("a batch with nothing readable came before any readable one on rank "
                                        f"{self.ctx.rank}; DDP cannot skip it (fix the data: see the warnings)")
                batch, weight = self._last_batch, 0.0  # keeps the ranks' collectives in step; adds nothing
            else:
                self._last_batch = batch
            sync = i == len(group) - 1 or not self.ctx.distributed
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with self._autocast():
                    out = self.task.forward(self.model, self._to_device(batch))
                self.scaler.scale(out["loss"] * weight).backward()
            if n:
                loss_sum += float(out["loss"].detach()) * n
                amount += self.task.measure(batch)
        self.scaler.unscale_(self.optimizer)
        clip = t.grad_clip if t.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip))
        loss_sum, amount = all_reduce_sum([loss_sum, amount], self.ctx)
        loss = loss_sum / total
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # with fp16: lowers the scale after an overflow
            if self.scaler.is_enabled() and math.isfinite(loss):
                # Expected while the scale settles (it starts at 2**16): counted and reported per epoch.
                self.totals["overflows"] += 1
                log.debug("step %d: fp16 gradient overflow, loss scale lowered", self.step)
                return
            self.nonfinite_in_row += 1
            self.totals["nonfinite"] += 1
            what = "loss" if not math.isfinite(loss) else "gradient"
            utts = group[-1].get("utts")  # an ASR batch names its utterances
            where = f"; utts {', '.join(utts[:3])}" if utts else ""
            log.warning("epoch %d batch %d: non-finite %s, update skipped (%d in a row%s)", self.epoch,
                        self.batches_done, what, self.nonfinite_in_row, where)
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
        for k, v in (("loss_sum", loss_sum), ("count", total), ("updates", 1), ("amount", amount)):
            self.totals[k] += v
        self._log_step(loss, lr, grad_norm, out)
        if t.save_every_steps > 0 and self.step % t.save_every_steps == 0:
            self._save(end_of_epoch=False)

    def _log_step(self, loss: float, lr: float, grad_norm: float, out: Dict[str, Any]) -> None:
        if not self.ctx.is_main:
            return
        self.steplog.write(self.step, self.epoch, loss, lr, grad_norm)
        if self.step % self.cfg.log_interval:
            return
        speed = self._speed()
        for k, v in out.items():
            if (k.startswith("loss") or k == "acc") and k != "loss":
                self.writer.add_scalar(f"train/{k}", float(v), self.step)
        figures = self.task.loss_figures(loss)
        for k, v in (("loss", loss), *figures.items(), ("lr", lr), ("grad_norm", grad_norm),
                     (f"{self.task.amount}_per_s", speed)):
            self.writer.add_scalar(f"train/{k}", v, self.step)
        log.info("epoch %d step %d: loss %.4f%s lr %.3g grad_norm %.3g, %.1f %s/s", self.epoch, self.step, loss,
                 "".join(f" {k} {v:.4g}" for k, v in figures.items()), lr, grad_norm, speed, self.task.amount)

    def _speed(self) -> float:
        """The task's amount per second in this epoch so far (all ranks)."""
        return (self.totals["amount"] - self._amount_at_start) / max(time.time() - self._epoch_start, 1e-9)

    def train_epoch(self) -> Dict[str, float]:
        """The rest of epoch ``self.epoch`` (all of it unless resumed mid-epoch); returns its totals."""
        t = self.cfg
        sampler = self.train_loader.batch_sampler
        sampler.set_epoch(self.epoch)  # after a resume, the same epoch keeps the sampler's position
        self.train_loader.generator.manual_seed(t.seed * 1000 + self.epoch)  # workers' seeds, per epoch
        total = self.batches_done + len(sampler)
        self.model.train()
        self._epoch_start, self._amount_at_start = time.time(), self.totals["amount"]
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
                bar.set_postfix({"loss": f"{self.totals['loss_sum'] / max(self.totals['count'], 1):.3f}",
                                 "step": self.step, f"{self.task.amount}_per_s": f"{self._speed():.1f}"})
        bar.close()
        n = max(self.totals["count"], 1)
        return {"loss": self.totals["loss_sum"] / n, "seconds": time.time() - self._epoch_start,
                "speed": self._speed(),
                **{k: self.totals[k] for k in ("updates", "skipped_utts", "nonfinite", "overflows")},
                "augmented": {k[len(AUGMENTED):]: int(v) for k, v in self.totals.items() if k.startswith(AUGMENTED)}}

    # ---------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> Dict[str, float]:
        """``valid_loss`` (and ``valid_acc``, if the model reports one) per unit over all ranks' validation
        data, and the task's figures derived from the loss (an LM's ``valid_ppl``)."""
        self.raw_model.eval()
        sums = [0.0, 0.0, 0.0, 0.0]  # loss * n, n, acc * n, n with acc (n: the batch's units)
        plotted, limit = 0, self.cfg.plot_attention
        for batch in self.valid_loader:
            n = self.task.count(batch)
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
            if self.ctx.is_main and plotted < limit:
                plotted += self.task.plot_validation(self.raw_model, batch, out, limit - plotted, self.epoch)
        loss_sum, count, acc_sum, acc_count = all_reduce_sum(sums, self.ctx)
        result = {"valid_loss": loss_sum / count if count else math.nan}
        if acc_count:
            result["valid_acc"] = acc_sum / acc_count
        result.update({f"valid_{k}": v for k, v in self.task.loss_figures(result["valid_loss"]).items()})
        return result

    def _improves(self, metrics: Dict[str, float]) -> bool:
        """Is this epoch the best so far by ``train.best_metric``? Without that metric (no validation data)
        every epoch is; a non-finite value only when nothing better was seen."""
        value = metrics.get(self.cfg.best_metric)
        if self.best is None:
            return True
        if value is None or not math.isfinite(value):
            return False
        return value < self.best if METRICS[self.cfg.best_metric] == "min" else value > self.best

    # ---------------------------------------------------------------- driver
    def fit(self) -> Dict[str, float]:
        """Train until ``train.epochs``, validating and checkpointing every epoch; the last epoch's summary."""
        t = self.cfg
        n_params = sum(p.numel() for p in self.raw_model.parameters())
        log.info("%s: %.2fM parameters, device %s, %d process(es), %d batches per epoch per process",
                 self.task.name, n_params / 1e6, self.device, self.ctx.world_size,
                 len(self.train_loader.batch_sampler) + self.batches_done)
        summary: Dict[str, float] = dict(self.index.latest_entry() or {})
        if self.epoch >= t.epochs:
            log.info("%s: already trained for %d epochs; nothing to do (raise train.epochs to continue)",
                     self.exp_dir, t.epochs)
        while self.epoch < t.epochs:
            tr = self.train_epoch()
            metrics = self.validate() if self.valid_loader is not None else {}
            train_figures = {"train_loss": tr["loss"], **{f"train_{k}": v for k, v in
                                                          self.task.loss_figures(tr["loss"]).items()}}
            summary = {"epoch": self.epoch, "step": self.step, **train_figures, **metrics,
                       "skipped_utts": tr["skipped_utts"], "nonfinite": tr["nonfinite"], "overflows": tr["overflows"]}
            skipped = f"{tr['skipped_utts']} unreadable utts skipped, " if tr["skipped_utts"] else ""
            msg = (f"epoch {self.epoch}: {_figures(train_figures)} ({tr['updates']} updates to step {self.step}, "
                   f"{tr['seconds']:.1f}s, {tr['speed']:.1f} {self.task.amount}/s, {skipped}{tr['nonfinite']} "
                   f"non-finite updates skipped"
                   + (f", {tr['overflows']} fp16 overflows skipped (loss scale lowered)" if tr["overflows"] else "")
                   + ")" + _augmented(tr["augmented"]))
            best = self._improves(metrics)
            if metrics:
                msg += f", {_figures(metrics)}" + (" (best)" if best else "")
                if self.ctx.is_main:
                    for k, v in metrics.items():
                        self.writer.add_scalar(f"valid/{k[6:]}", v, self.step)
            value = metrics.get(t.best_metric)
            if best and value is not None and math.isfinite(value):
                self.best = value
            log.info(msg)
            if self.ctx.is_main and (best or not self.task.best_model):
                save_model_weights(self.raw_model, os.path.join(self.exp_dir, MODEL_FILE), epoch=self.epoch,
                                   **metrics)
            self._save(end_of_epoch=True, metrics=metrics)
            self.epoch, self.batches_done, self.totals = self.epoch + 1, 0, _new_totals()
        if self.ctx.is_main:
            self.writer.close()
            self.steplog.close()
        if self.best is not None:
            summary[f"best_{t.best_metric}"] = self.best
        return summary


def _augmented(counts: Dict[str, int]) -> str:
    """``{"utts": 8, "noise": 5, "reverb": 3}`` -> ``, augmented 8 utts (noise 5, reverb 3)`` (for the epoch line)."""
    if not counts:
        return ""
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "utts")
    return f", augmented {counts.get('utts', 0)} utts ({kinds or 'nothing applied'})"


def _figures(values: Dict[str, float]) -> str:
    """``{"valid_loss": 1.5, "valid_ppl": 4.48}`` -> ``valid loss 1.5000, valid ppl 4.4817`` (for the log)."""
    return ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in values.items())


def run_experiment(train_cfg: TrainConfig, exp_dir: str, prepare: Callable[[bool], Any],
                   make_task: Callable[[Any], TrainTask], device: Optional[str] = None) -> Dict[str, float]:
    """Check, prepare ``exp_dir``, train; the last epoch's summary. The driver of ``asrkit train`` and
    ``asrkit train-lm`` alike, which run under ``torchrun`` unchanged: every rank checks the experiment dir
    with ``prepare(False)``, rank 0 writes it with ``prepare(True)``; both return the resolved config, from
    which ``make_task`` makes the task (after logging is set up, so it may log). Rank 0 holds ``exp_dir``'s
    :class:`~asrkit.rundir_lock.RunDirLock` throughout: another run into it is refused (:class:`RunDirBusy`)."""
    ctx = dist_util.init_distributed(device)
    lock = RunDirLock(exp_dir, enabled=ctx.is_main)  # the ranks of one run share rank 0's lock
    try:
        check_train_config(train_cfg, ctx.device)  # before anything is written
        _acquire_on_every_rank(lock, ctx)
        # Every rank checks first (same verdict everywhere, so no rank waits for a failed one); rank 0 writes.
        resolved = prepare(False)
        dist_util.barrier(ctx)
        if ctx.is_main:
            prepare(True)
        dist_util.barrier(ctx)
        setup_logging(exp_dir, ctx.is_main)
        # The Trainer (and its DistributedDataParallel wrapper) is dropped here, so that cleanup() frees the
        # process group and joins gloo's threads (see asrkit.train.distributed.init_distributed).
        summary = Trainer(resolved.train, make_task(resolved), exp_dir, ctx=ctx).fit()
        # No rank tears down its process group while a peer may still use it. Only on success: after an error
        # a peer may never arrive.
        dist_util.barrier(ctx)
        return summary
    finally:
        lock.release()
        dist_util.cleanup()


def _acquire_on_every_rank(lock: RunDirLock, ctx: DistContext) -> None:
    """Rank 0 takes ``lock``; every rank raises :class:`RunDirBusy` if it could not (so none waits for it)."""
    refused = None
    try:
        lock.acquire()
    except RunDirBusy as exc:
        refused = str(exc)
    refused = gather_objects(refused, ctx)[0]
    if refused is not None:
        raise RunDirBusy(refused)


def train(cfg: ExperimentConfig, exp_dir: str, train_dir: str, valid_dir: Optional[str] = None,
          tokenizer: Optional[str] = None, cmvn: Optional[str] = None, device: Optional[str] = None,
          resume: str = "auto") -> Dict[str, float]:
    """Prepare ``exp_dir`` (see :func:`prepare_experiment`), train an ASR model on the Kaldi data dirs, return
    the last epoch's summary (see :func:`run_experiment`)."""
    check_sources(cfg.augment)  # the files waveform augmentation reads, before the experiment dir is written

    def prepare(write: bool) -> ExperimentConfig:
        return prepare_experiment(cfg, exp_dir, tokenizer, cmvn, resume, write=write)[0]

    def make_task(resolved: ExperimentConfig) -> AsrTask:
        return AsrTask(resolved, exp_dir, train_dir, valid_dir)

    return run_experiment(cfg.train, exp_dir, prepare, make_task, device)
