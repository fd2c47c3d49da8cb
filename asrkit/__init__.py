"""asrkit: speech recognition toolkit.

Public API: :func:`load_model` (experiment dir -> Transcriber) and ``__version__``.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_model"]


def load_model(model_dir: str, device: str = "cpu", checkpoint: str | None = None, decode=None):
    """Load a trained model from its experiment directory alone and return a :class:`~asrkit.pipeline.Transcriber`.

    ``decode``: an :class:`asrkit.config.DecodeConfig` (or the path of a ``conf/decode_*.yaml``) choosing
    the search; greedy CTC when None.
    """
    from asrkit.config import load_decode_config
    from asrkit.pipeline import Transcriber

    if isinstance(decode, str):
        decode = load_decode_config(decode)
    return Transcriber.from_dir(model_dir, device=device, checkpoint=checkpoint, decode=decode)
