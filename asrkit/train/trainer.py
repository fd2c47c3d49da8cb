"""Training loop: data loading, optimisation, validation, logging and checkpoints for any registered model."""
from __future__ import annotations

import logging
import math
import os
import random
import shutil
import time
from dataclasses import replace
from typing import Dict, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from asrkit.config import ExperimentConfig, save_config
from asrkit.data.datadir import read_data_dir
from asrkit.data.dataset import AsrDataset, collate
from asrkit.data.sampler import BucketBatchSampler
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import Tokenizer, load_tokenizer
from asrkit.train.checkpoint import MODEL_FILE, save_atomic, save_model_weights
from asrkit.train.optim import build_optimizer, warmup_inverse_sqrt

log = logging.getLogger("asrkit.train")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_logging(exp_dir: str) -> None:
    """Log to ``exp_dir/train.log`` and the console (once per process)."""
    root = logging.getLogger("asrkit")
    root.setLevel(logging.INFO)
    log_path = os.path.abspath(os.path.join(exp_dir, "train.log"))
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler):
            root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(log_path)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if not any(type(h) is logging.StreamHandler for h in root.handlers):
        sh = logging.StreamHandler()
        sh.setFormatter(fmt)
        root.addHandler(sh)


def prepare_experiment(cfg: ExperimentConfig, exp_dir: str, tokenizer_path: Optional[str] = None,
                       cmvn_path: Optional[str] = None) -> ExperimentConfig:
    """Copy the tokenizer and CMVN stats into ``exp_dir`` and write the resolved ``config.yaml``.

    The saved config refers to them by paths relative to ``exp_dir`` so the
    directory is self-contained and can be moved.
    """
    os.makedirs(exp_dir, exist_ok=True)
    tok_src = tokenizer_path or cfg.tokenizer.path
    if not os.path.isfile(tok_src):
        raise FileNotFoundError(
            f"tokenizer '{tok_src}' not found: create one with 'asrkit train-tokenizer --text DATA/text OUT.json'")
    tok_dst = os.path.join(exp_dir, "tokenizer.json")
    if os.path.abspath(tok_src) != os.path.abspath(tok_dst):
        shutil.copyfile(tok_src, tok_dst)
    cmvn_rel = None
    cmvn_src = cmvn_path or cfg.cmvn
    if cmvn_src:
        if not os.path.isfile(cmvn_src):
            raise FileNotFoundError(f"CMVN stats '{cmvn_src}' not found: create them with 'asrkit compute-cmvn'")
        cmvn_rel = "cmvn.json"
        if os.path.abspath(cmvn_src) != os.path.abspath(os.path.join(exp_dir, cmvn_rel)):
            shutil.copyfile(cmvn_src, os.path.join(exp_dir, cmvn_rel))
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, path="tokenizer.json"), cmvn=cmvn_rel)
    save_config(cfg, os.path.join(exp_dir, "config.yaml"))
    return cfg


class Trainer:
    """Trains ``model`` on a Kaldi data dir; writes checkpoints, logs and tensorboard scalars into ``exp_dir``."""

    def __init__(self, cfg: ExperimentConfig, exp_dir: str, train_dir: str, valid_dir: Optional[str],
                 device: Optional[str] = None):
        self.cfg, self.exp_dir = cfg, exp_dir
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        seed_everything(cfg.train.seed)
        self.tokenizer: Tokenizer = load_tokenizer(os.path.join(exp_dir, cfg.tokenizer.path))
        cmvn = os.path.join(exp_dir, cfg.cmvn) if cfg.cmvn else None
        self.model = build_model(cfg, self.tokenizer.vocab_size, cmvn_path=cmvn).to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.train)
        self.scheduler = warmup_inverse_sqrt(self.optimizer, cfg.train.warmup_steps)
        self.train_loader = self._loader(train_dir, shuffle=True)
        self.valid_loader = self._loader(valid_dir, shuffle=False) if valid_dir else None
        self.step = 0
        self.epoch = 0
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(exp_dir, "tensorboard"))

    def _loader(self, data_dir: str, shuffle: bool) -> DataLoader:
        dcfg, fcfg = self.cfg.data, self.cfg.frontend
        dataset = AsrDataset(read_data_dir(data_dir), fcfg.sample_rate, tokenizer=self.tokenizer,
                             min_duration=dcfg.min_duration, max_duration=dcfg.max_duration)
        sampler = BucketBatchSampler(dataset.durations(), max_frames=dcfg.max_frames,
                                     max_batch_size=dcfg.max_batch_size, shuffle=shuffle, seed=self.cfg.train.seed,
                                     bucket_width=dcfg.bucket_width)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=dcfg.num_workers)

    def _to_device(self, batch: Dict) -> Dict:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def train_epoch(self) -> Dict[str, float]:
        self.model.train()
        sampler = self.train_loader.batch_sampler
        sampler.set_epoch(self.epoch)
        totals = {"loss": 0.0, "batches": 0, "skipped_utts": 0, "nonfinite": 0, "frames": 0}
        start = time.time()
        bar = tqdm(self.train_loader, desc=f"epoch {self.epoch}", leave=False, dynamic_ncols=True)
        for batch in bar:
            totals["skipped_utts"] += int(batch.get("num_skipped", 0))
            if len(batch["utts"]) == 0:
                continue
            batch = self._to_device(batch)
            out = self.model(batch)
            loss = out["loss"]
            self.optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                totals["nonfinite"] += 1
                log.warning("step %d: non-finite loss, batch skipped (utts %s...)", self.step, batch["utts"][:3])
                continue
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
            if not torch.isfinite(grad_norm):
                totals["nonfinite"] += 1
                log.warning("step %d: non-finite gradient norm, update skipped", self.step)
                continue
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            totals["loss"] += float(loss)
            totals["batches"] += 1
            totals["frames"] += int(batch["wav_lens"].sum()) // max(1, self.cfg.frontend.hop_length)
            if self.step % self.cfg.train.log_interval == 0:
                lr = self.scheduler.get_last_lr()[0]
                for k, v in out.items():
                    if k.startswith("loss") or k == "acc":
                        self.writer.add_scalar(f"train/{k}", float(v), self.step)
                self.writer.add_scalar("train/lr", lr, self.step)
                self.writer.add_scalar("train/grad_norm", float(grad_norm), self.step)
                self.writer.add_scalar("train/frames_per_s", totals["frames"] / (time.time() - start), self.step)
            bar.set_postfix(loss=f"{float(loss):.3f}", step=self.step)
        n = max(totals["batches"], 1)
        return {"loss": totals["loss"] / n, "skipped_utts": totals["skipped_utts"],
                "nonfinite": totals["nonfinite"], "seconds": time.time() - start}

    @torch.no_grad()
    def validate(self) -> Dict[str, float]:
        self.model.eval()
        total, count = 0.0, 0
        for batch in self.valid_loader:
            if len(batch["utts"]) == 0:
                continue
            out = self.model(self._to_device(batch))
            b = len(batch["utts"])
            total += float(out["loss"]) * b
            count += b
        return {"loss": total / count if count else math.nan}

    def fit(self) -> Dict[str, float]:
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("model %s: %.2fM parameters, device %s", self.cfg.model.name, n_params / 1e6, self.device)
        summary: Dict[str, float] = {}
        for epoch in range(self.cfg.train.epochs):
            self.epoch = epoch
            tr = self.train_epoch()
            summary = {"epoch": epoch, "train_loss": tr["loss"]}
            msg = (f"epoch {epoch}: train loss {tr['loss']:.4f} ({tr['seconds']:.1f}s, step {self.step}, "
                   f"{tr['skipped_utts']} unreadable utts skipped, {tr['nonfinite']} non-finite steps skipped)")
            if self.valid_loader is not None:
                va = self.validate()
                summary["valid_loss"] = va["loss"]
                self.writer.add_scalar("valid/loss", va["loss"], self.step)
                msg += f", valid loss {va['loss']:.4f}"
            log.info(msg)
            save_atomic({"format_version": 1, "model": self.model.state_dict(),
                         "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                         "epoch": epoch, "step": self.step, **summary},
                        os.path.join(self.exp_dir, f"epoch{epoch}.pt"))
            save_model_weights(self.model, os.path.join(self.exp_dir, MODEL_FILE), epoch=epoch)
        self.writer.close()
        return summary
