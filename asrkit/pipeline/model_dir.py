"""An experiment directory (what ``asrkit train`` writes) -> its model, config and tokenizer, ready to run.

Transcription and export both start here; neither imports the other for it.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
from torch import nn

from asrkit.checkpoint import MODEL_FILE, load_checkpoint, load_weights
from asrkit.config import ExperimentConfig, load_config
from asrkit.models.registry import build_model
from asrkit.text.tokenizer import Tokenizer, load_tokenizer


def load_from_dir(exp_dir: str, checkpoint: Optional[str] = None,
                  device: str | torch.device = "cpu") -> Tuple[nn.Module, ExperimentConfig, Tokenizer]:
    """Build the model described by ``exp_dir/config.yaml`` and load ``model.pt`` (or ``checkpoint``) into it."""
    cfg_path = os.path.join(exp_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{exp_dir}: not an experiment directory (no config.yaml)")
    cfg = load_config(cfg_path)
    tokenizer = load_tokenizer(os.path.join(exp_dir, cfg.tokenizer.path))
    cmvn = os.path.join(exp_dir, cfg.cmvn) if cfg.cmvn else None
    model = build_model(cfg, tokenizer.vocab_size, cmvn)
    weights = checkpoint or os.path.join(exp_dir, MODEL_FILE)
    load_weights(model, load_checkpoint(weights, map_location="cpu"), weights)
    return model.to(device).eval(), cfg, tokenizer
