"""Data layer: Kaldi data dirs (:mod:`~asrkit.data.datadir`), the dataset and collate
(:mod:`~asrkit.data.dataset`), the length-bucketing batch sampler (:mod:`~asrkit.data.sampler`)
and Kaldi table files (:mod:`~asrkit.data.table`).

The names below are imported on first use (PEP 562), so the data-dir tools,
which only need :mod:`~asrkit.data.datadir`, do not pay for importing torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DataDir": "datadir", "DataDirError": "datadir", "Segment": "datadir", "Utterance": "datadir",
    "read_data_dir": "datadir", "write_data_dir": "datadir",
    "AsrDataset": "dataset", "collate": "dataset",
    "BucketBatchSampler": "sampler",
    "TableError": "table",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'asrkit.data' has no attribute '{name}'")
    return getattr(importlib.import_module(f"asrkit.data.{_EXPORTS[name]}"), name)
