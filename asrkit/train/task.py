"""What a training run is of: the :class:`TrainTask` protocol, and :class:`AsrTask` (``asrkit train``).

:class:`~asrkit.train.trainer.Trainer` drives any model whose ``forward(batch)`` returns a dict with
``"loss"``, the mean over the batch's units of some per-unit loss. Everything that differs between
tasks is here: how to build the model and the loaders, what a unit is (the trainer weighs batches by
their unit count, so accumulated or distributed batches weigh like one big batch), the throughput
figure, the figures derived from a loss, and which epoch model.pt holds. The LM task is
:class:`asrkit.train.lm_task.LMTask`.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Protocol, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from asrkit.config import ExperimentConfig
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import load_tokenizer
from asrkit.train.loader import build_loader
from asrkit.train.mwer import mwer_forward

Batch = Dict[str, Any]


class TrainTask(Protocol):
    """What the trainer needs to know about a task (met structurally: ``AsrTask``, ``LMTask``)."""

    name: str  # the model in the log: "model conformer+transformer", "LM lstm"
    unit: str  # what a batch's loss is a mean over, and batches are weighed by: "utts" | "tokens"
    amount: str  # the throughput figure (train/{amount}_per_s, "{x} {amount}/s"): "audio_s" | "tokens"
    best_model: bool  # model.pt: the best epoch by train.best_metric (True) or the last one (False)

    def build_model(self) -> nn.Module:
        """A new model on the CPU (the trainer seeds first, so every rank builds the same weights)."""
        ...

    def build_loaders(self, model: nn.Module, pin_memory: bool) -> Tuple[DataLoader, Optional[DataLoader]]:
        """Train and validation loaders (None: no validation). Their ``batch_sampler`` is a
        :class:`~asrkit.data.sampler.BucketBatchSampler` sharded over the process group, and each has a
        ``generator`` of its own (the trainer reseeds it every epoch)."""
        ...

    def forward(self, model: nn.Module, batch: Batch) -> Dict[str, torch.Tensor]:
        """The training loss terms of a batch (``loss`` first of all); usually ``model(batch)``."""
        ...

    def count(self, batch: Batch) -> int:
        """The batch's units (0: nothing in it could be read)."""
        ...

    def measure(self, batch: Batch) -> float:
        """The batch's ``amount``."""
        ...

    def loss_figures(self, loss: float) -> Dict[str, float]:
        """Figures derived from a loss per unit, logged beside it as train_*/valid_* (an LM's ``ppl``)."""
        ...

    def plot_validation(self, model: nn.Module, batch: Batch, out: Dict[str, Any], limit: int, epoch: int) -> int:
        """Images of up to ``limit`` items of a validation batch from the model's outputs ``out`` (when
        ``train.plot_attention`` asks for them); the number drawn."""
        ...


class AsrTask:
    """A speech recognizer (``build_model(cfg)``) on the Kaldi data dirs ``train_dir`` and ``valid_dir``, in the
    prepared experiment dir ``exp_dir``. Units are utterances; model.pt is the last epoch's weights (the
    recipes then average the best epochs into it with ``asrkit average``)."""

    unit, amount, best_model = "utts", "audio_s", False

    def __init__(self, cfg: ExperimentConfig, exp_dir: str, train_dir: str, valid_dir: Optional[str]):
        self.cfg, self.exp_dir, self.train_dir, self.valid_dir = cfg, exp_dir, train_dir, valid_dir
        self.tokenizer = load_tokenizer(os.path.join(exp_dir, cfg.tokenizer.path))
        self.name = f"model {cfg.model.encoder.kind}+{cfg.model.decoder.kind}"

    def build_model(self) -> nn.Module:
        cmvn = os.path.join(self.exp_dir, self.cfg.cmvn) if self.cfg.cmvn else None
        return build_model(self.cfg, self.tokenizer.vocab_size, cmvn_path=cmvn)

    def build_loaders(self, model: nn.Module, pin_memory: bool) -> Tuple[DataLoader, Optional[DataLoader]]:
        train = build_loader(self.train_dir, self.cfg, self.tokenizer, model, train=True, pin_memory=pin_memory)
        valid = (build_loader(self.valid_dir, self.cfg, self.tokenizer, model, train=False, pin_memory=pin_memory)
                 if self.valid_dir else None)
        return train, valid

    def forward(self, model: nn.Module, batch: Batch) -> Dict[str, torch.Tensor]:
        """``model(batch)``, and with ``train.mwer_weight`` w: ``(1 - w) * loss + w * loss_mwer``, both terms on
        one draw of the batch's features (:func:`~asrkit.train.mwer.mwer_forward`)."""
        t = self.cfg.train
        if t.mwer_weight == 0:
            return model(batch)
        w = t.mwer_weight
        out = mwer_forward(model, batch, self.tokenizer, t.mwer_nbest, t.mwer_ctc_weight)
        return {**out, "loss_mwer": out["loss_mwer"].detach(), "loss": (1.0 - w) * out["loss"] + w * out["loss_mwer"]}

    def count(self, batch: Batch) -> int:
        return len(batch["utts"])

    def measure(self, batch: Batch) -> float:
        return float(batch["wav_lens"].sum()) / self.cfg.frontend.sample_rate

    def loss_figures(self, loss: float) -> Dict[str, float]:
        return {}

    def plot_validation(self, model: nn.Module, batch: Batch, out: Dict[str, Any], limit: int, epoch: int) -> int:
        """Attention images (``out["attention"]`` (B, L, T), from a model with an attention decoder) under
        ``exp_dir/attention/epoch{E}/``."""
        if "attention" not in out:
            return 0
        from asrkit.train.plot import plot_attention  # matplotlib: only when plotting

        attention = out["attention"]
        frames = model.output_lengths(batch["wav_lens"].cpu()).tolist()
        eos = int(attention.size(1) == batch["tokens"].size(1) + 1)  # a row for <eos>
        count = min(limit, attention.size(0))
        for b in range(count):
            rows = int(batch["token_lens"][b]) + eos
            cols = min(int(frames[b]), attention.size(2))
            ids = batch["tokens"][b, : int(batch["token_lens"][b])].tolist()
            labels = [self.tokenizer.token_list[i] for i in ids] + ["<eos>"] * eos
            utt = batch["utts"][b]
            plot_attention(attention[b, :rows, :cols],
                           os.path.join(self.exp_dir, "attention", f"epoch{epoch}", f"{utt}.png"),
                           title=f"{utt} (epoch {epoch})", tokens=labels)
        return count
