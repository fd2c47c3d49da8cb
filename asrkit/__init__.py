"""asrkit: speech recognition toolkit.

Public API: :func:`load_model` (experiment dir -> Transcriber) and ``__version__``.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_model"]


def load_model(model_dir: str, device: str = "cpu", checkpoint: str | None = None):
    """Load a trained model from its experiment directory alone and return a :class:`~asrkit.pipeline.Transcriber`."""
    from asrkit.pipeline import Transcriber

    return Transcriber.from_dir(model_dir, device=device, checkpoint=checkpoint)
