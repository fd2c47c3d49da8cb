"""Attention alignment images: one PNG per utterance, output tokens (rows) against encoder frames (columns).

A healthy attention decoder shows a monotonic diagonal after a few epochs; a blurred or flat image
means the decoder is not yet using the encoder. matplotlib is imported lazily with the Agg backend,
so training on a machine without a display works and nothing is imported when plots are off.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np
import torch

from asrkit.extras import require


def plot_attention(weights: torch.Tensor | np.ndarray, path: str | os.PathLike, title: str = "",
                   tokens: Optional[Sequence[str]] = None, frame_shift: Optional[float] = None) -> None:
    """Write ``weights`` (L, T) as a heat map to ``path`` (PNG).

    ``tokens``: labels of the L rows (shown when there are few enough to read); ``frame_shift``:
    seconds per encoder frame, to label the x axis in seconds instead of frames.
    """
    w = weights.detach().float().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights, dtype=np.float32)
    if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"attention weights must be a non-empty (L, T) matrix, got shape {tuple(w.shape)}")
    matplotlib = require("matplotlib", "plotting attention")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    length, frames = w.shape
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + frames / 25.0), min(12.0, 2.0 + length / 6.0)))
    try:
        extent = None
        if frame_shift:
            extent = (0.0, frames * frame_shift, length - 0.5, -0.5)
        im = ax.imshow(w, aspect="auto", origin="upper", interpolation="nearest", cmap="viridis", extent=extent)
        ax.set_xlabel("encoder time (s)" if frame_shift else "encoder frame")
        ax.set_ylabel("output token")
        if tokens is not None and len(tokens) == length and length <= 60:
            ax.set_yticks(range(length))
            ax.set_yticklabels(list(tokens), fontsize=7)
        if title:
            ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
