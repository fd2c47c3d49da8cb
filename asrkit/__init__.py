"""asrkit: speech recognition toolkit.

Public API: :func:`load_model` (experiment dir or exported model -> Transcriber) and ``__version__``.
"""
from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_model"]


def load_model(model: str | os.PathLike, device: str = "cpu", checkpoint: str | None = None, decode: Any = None,
               *, trust_torchscript: bool = False, **options: Any):
    """Load a trained model and return a :class:`~asrkit.pipeline.Transcriber`.

    ``model``: an experiment directory (it alone is enough) or a file written by ``asrkit export``
    (ONNX or TorchScript: CTC searches only). Loading TorchScript runs code stored in the file: it loads only with
    ``trust_torchscript=True``, for files whose author you trust (ONNX needs no trust). ``decode``: an
    :class:`asrkit.config.DecodeConfig` or the path of a ``conf/decode_*.yaml`` choosing the search; greedy CTC
    when None. ``options``: ``segmenter`` (vad | fixed | none), ``vad`` (:class:`asrkit.audio.vad.VadConfig`),
    ``batch_seconds``, ``hotwords`` (phrases, or (phrase, weight factor) pairs, that a beam search is biased
    toward, beside ``decode.hotwords``; weighted by ``decode.hotword_weight``).

    :meth:`~asrkit.pipeline.Transcriber.transcribe` takes one input (a path, a waveform tensor or numpy array)
    and returns one Result, or a list of inputs and returns a list; keyword arguments other than its own are
    decoding settings for that call (``beam=8``):

    >>> model = asrkit.load_model("exp/tiny_ctc")                      # doctest: +SKIP
    >>> model.transcribe("a.wav").text                                 # doctest: +SKIP
    >>> model.transcribe(samples_8k, sample_rate=8000, mode="ctc_prefix", beam=8)  # doctest: +SKIP
    >>> model.transcribe("a.wav", mode="ctc_prefix", hotwords=["ZANZIBAR", ("ANNA KARENINA", 2.0)])  # doctest: +SKIP
    >>> for r in model.transcribe(["a.wav", waveform, "long.flac"]):    # doctest: +SKIP
    ...     print(r.text, [(w.text, w.start, w.end, w.confidence) for w in r.words])

    Live audio: :meth:`~asrkit.pipeline.Transcriber.stream` (one stream) and
    :meth:`~asrkit.pipeline.Transcriber.streaming_recognizer` (many, batched; :mod:`asrkit.pipeline.streaming`):

    >>> s = model.stream(chunk_ms=640)                                  # doctest: +SKIP
    >>> s.accept_waveform(samples); s.partial; s.pop_finals(); s.finish().text  # doctest: +SKIP
    """
    from asrkit.config import load_decode_config
    from asrkit.pipeline import Transcriber

    if isinstance(decode, (str, os.PathLike)):
        decode = load_decode_config(decode)
    path = os.fspath(model)
    if os.path.isfile(path):
        if checkpoint is not None:
            raise ValueError(f"{path}: checkpoint applies to an experiment dir, not to an exported model")
        return Transcriber.from_exported(path, device=device, decode=decode, trust_torchscript=trust_torchscript,
                                         **options)
    return Transcriber.from_dir(path, device=device, checkpoint=checkpoint, decode=decode, **options)
