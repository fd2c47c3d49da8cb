"""index_rows: reordering decoder states, and leaving their memory-only fields alone inside a beam search."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

import asrkit.search.scorers as scorers
from asrkit.config import load_config
from asrkit.models.registry import build_model
from asrkit.search import joint_beam_search
from asrkit.search.scorers import index_rows

CONF = Path(__file__).resolve().parents[2] / "conf"


class State(NamedTuple):
    h: torch.Tensor
    keys: torch.Tensor
    memory_fields = ("keys",)


def test_memory_fields_are_kept_only_when_asked():
    state = {"a": State(torch.arange(4.0), torch.arange(4.0) * 10), "b": [torch.arange(4)]}
    index = torch.tensor([1, 1, 0, 3])
    full = index_rows(state, index)
    assert full["a"].h.tolist() == [1, 1, 0, 3] and full["a"].keys.tolist() == [10, 10, 0, 30]
    assert full["b"][0].tolist() == [1, 1, 0, 3]
    kept = index_rows(state, index, keep_memory_fields=True)
    assert kept["a"].h.tolist() == [1, 1, 0, 3] and kept["a"].keys is state["a"].keys


def test_keeping_memory_fields_changes_no_search_result(monkeypatch):
    for conf in ("tiny_transformer.yaml", "tiny_blstm_location_attention.yaml"):
        torch.manual_seed(0)
        model = build_model(load_config(CONF / conf, ["model.ctc_weight=0.3"]), 12).eval()
        wav = 0.1 * torch.randn(3, 9600, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            enc, lens = model.encode(wav, torch.tensor([9600, 8000, 5000]))
            lp = model.ctc_log_probs(enc)
            fast = joint_beam_search(model, enc, lens, lp, ctc_weight=0.3, beam=4, max_len_ratio=0.3)
            real = scorers.index_rows
            monkeypatch.setattr(scorers, "index_rows", lambda tree, index, keep_memory_fields=False: real(tree, index))
            slow = joint_beam_search(model, enc, lens, lp, ctc_weight=0.3, beam=4, max_len_ratio=0.3)
            monkeypatch.undo()
        assert torch.equal(fast.tokens, slow.tokens), conf
        torch.testing.assert_close(fast.scores, slow.scores, rtol=0, atol=1e-5)
