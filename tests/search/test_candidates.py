"""candidates.top_tokens (the per-frame token pre-selection) against torch.topk."""
from __future__ import annotations

import pytest
import torch

import asrkit.search.candidates as candidates
from asrkit.search.candidates import top_tokens


@pytest.mark.parametrize("vocab,count", [(29, 8), (29, 1), (31, 29), (320, 8), (500, 8), (1031, 8), (1031, 1),
                                         (5000, 8), (5000, 24), (4096, 5)])
@pytest.mark.parametrize("subset", [False, True])
def test_top_tokens_equal_torch_topk_over_the_non_blank_tokens(vocab: int, count: int, subset: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Catches: a best token missed by the row/column crossing (e.g. only C instead of C + 1 rows or
    # columns kept while the blank takes one), the partial last row (V not a multiple of m) lost,
    # the blank returned, rows of a chunk boundary or of the row subset mixed up, a vocabulary smaller than
    # one row of the (q, m) view sent to the row/column maxima (V=29 with one candidate).
    monkeypatch.setattr(candidates, "_CHUNK", 7 * vocab)  # several chunks, the last one partial
    gen = torch.Generator().manual_seed(vocab + count)
    x = (torch.randn(40, vocab, generator=gen) * 3).log_softmax(-1)
    x[::3, 0] = 0.0  # the blank is the best class on every third row ...
    x[1::5, vocab - 1] = 5.0  # ... the last token (partial row) on others
    rows = torch.randperm(40, generator=gen)[:23] if subset else None
    want_v, want_i = (x if rows is None else x[rows])[:, 1:].topk(count)
    vals, ids = top_tokens(x, rows, count)
    order = vals.argsort(1, descending=True)
    assert torch.equal(vals.gather(1, order), want_v)
    assert torch.equal(ids.gather(1, order), want_i + 1)


def test_no_rows_give_empty_tables() -> None:
    vals, ids = top_tokens(torch.zeros(0, 600), None, 8)
    assert vals.shape == (0, 8) and ids.shape == (0, 8) and ids.dtype == torch.long


def test_a_gpu_takes_a_batch_of_rows_in_few_chunks() -> None:
    # Catches the CPU's cache-sized chunks (512 rows) on a GPU, where every op of a chunk is a kernel launch the host
    # pays for: 2048 utterances of 250 frames took ~4700 launches to build their candidate tables.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert candidates.rows_per_chunk(29, cuda) >= 2048 * 250
    assert candidates.rows_per_chunk(500, cuda) == (1 << 26) // 500  # whole rows: -(-2048 * 250 // it) == 4 chunks
    assert candidates.rows_per_chunk(10 ** 8, cuda) == 1
    assert [candidates.rows_per_chunk(v, cpu) for v in (29, 500, 5000, 10 ** 7)] == [512, 512, 419, 1]
