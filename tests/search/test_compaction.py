"""Blank-frame compaction (asrkit.search.compaction) beside what the search tests check of it: its host reads."""
from __future__ import annotations

import pytest
import torch

from asrkit.search.compaction import compact_frames
from host_sync import SYNC_METHODS
from test_ctc_prefix import peaky_log_probs


@pytest.mark.parametrize("threshold, skipped", [(0.999, True), (None, False), (0.9999999, False)])
def test_one_host_read_per_batch(monkeypatch: pytest.MonkeyPatch, threshold, skipped: bool) -> None:
    # On a GPU each read back waits for the device: whether any frame is skipped and the width are read together.
    lp = peaky_log_probs(3, 30, 7, torch.Generator().manual_seed(2), dtype=torch.float32)
    lengths = torch.tensor([30, 22, 0])
    reads = []
    for name in SYNC_METHODS:
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _m=method, _n=name, **k: reads.append(_n) or _m(
            self, *a, **k))
    frame, skip, offset, identity = compact_frames(lp, lengths, 0, threshold)
    monkeypatch.undo()
    assert len(reads) == 1, reads
    keep = torch.arange(30) < lengths[:, None]
    if skipped:
        keep &= lp[..., 0] <= torch.tensor(0.999).log()
    assert (skip is not None) == skipped and frame.shape[1] == int(keep.sum(1).max())
    assert [frame[b][frame[b] >= 0].tolist() for b in range(3)] == [keep[b].nonzero()[:, 0].tolist() for b in range(3)]
