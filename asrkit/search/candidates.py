"""Per-frame token pre-selection for CTC prefix search: the C best non-blank tokens of chosen rows.

``torch.topk`` on CPU costs about 4-9 us per row of 500-5000 tokens (it copies each row into a
heap): at V = 5000 more than the whole frame loop. :func:`top_tokens` instead views each row's V
tokens as a (q, m) matrix, ``v = b * m + a`` (m = 32 or 64), and takes its column maxima (classes ``a = v mod m``)
and row maxima (blocks ``b = v div m``) with two vectorised ``amax`` passes. A token among the row's
C best non-blank tokens lies in a column among the C + 1 largest maxima (C + 1 larger ones would
be C + 1 distinct larger tokens, at most one of them the blank) and likewise in a row, so the
C best lie among the (C + 1)^2 tokens at the crossings of the selected rows and columns, and
``topk`` runs on those values only. Rows are processed in chunks of up to 512 rows (8 MB): each chunk
costs about a dozen ops, so smaller chunks are dispatch-bound. Ties between
equal values are broken arbitrarily, as by ``torch.topk``.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

NEG_INF = float("-inf")
_CHUNK = 1 << 21  # numbers per chunk of rows (8 MB of float32: stays in L3)
_CHUNK_ROWS = 512  # rows per chunk at most: enough to amortise the ~10 ops per chunk (measured, CPU)
_MIN_VOCAB = 320  # below this a plain topk per row is as fast (measured, CPU)
_GPU_CHUNK = 1 << 26  # numbers per chunk on a GPU (256 MB of float32): a batch's rows in one or a few chunks


def rows_per_chunk(vocab: int, device: torch.device) -> int:
    """Rows of V tokens per chunk: cache-sized on the CPU; on a GPU, where each op of a chunk is a kernel launch the
    host pays for, as many as a 256 MB buffer holds."""
    if device.type == "cuda":
        return max(1, _GPU_CHUNK // vocab)
    return max(1, min(_CHUNK_ROWS, _CHUNK // vocab))


def _width(vocab: int) -> int:
    """m: the row width, a multiple of 16 floats so that the column maxima vectorise (measured on CPU:
    m = 32 at V = 500 and m = 64 at V = 5000 are 1.4-1.8x faster than torch.topk; m = 16 is slower)."""
    return 32 if vocab < 2500 else 64


def _chunk_top(x: torch.Tensor, count: int, blank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the `count` best non-blank tokens of each row of x (n, V)."""
    rows, vocab = x.shape
    if vocab < _MIN_VOCAB or (count + 1) ** 2 * 4 > vocab:
        vals, ids = x.topk(count + 1, 1, True, False)  # the blank may be one of them
        vals = vals.masked_fill(ids == blank, NEG_INF)
        best, at = vals.topk(count, 1, True, False)
        return best, ids.gather(1, at)
    m = _width(vocab)
    q, r = divmod(vocab, m)
    main = x[:, :q * m].unflatten(1, (q, m))  # (n, q, m) view: token b*m + a
    cmax = main.amax(1)  # (n, m) column maxima
    bmax = main.amax(2)  # (n, q) row maxima
    if r:  # the last, partial row: tokens q*m .. V-1
        tail = x[:, q * m:]
        torch.maximum(cmax[:, :r], tail, out=cmax[:, :r])
        bmax = torch.cat([bmax, tail.amax(1, keepdim=True)], 1)
    pa = cmax.topk(min(count + 1, m), 1, True, False)[1]
    pb = bmax.topk(min(count + 1, bmax.shape[1]), 1, True, False)[1]
    ids = (pb[:, :, None] * m + pa[:, None, :]).flatten(1)  # (n, (C+1)^2) crossings
    bad = (ids >= vocab) | (ids == blank)
    vals = x.gather(1, ids.masked_fill(bad, 0)).masked_fill_(bad, NEG_INF)
    best, at = vals.topk(count, 1, True, False)
    return best, ids.gather(1, at)


def top_tokens(flat: torch.Tensor, rows: torch.Tensor, count: int, blank: int = 0
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The `count` best non-blank tokens of the rows ``flat[rows]`` (rows None: all), in no order.

    flat: (R, V) log-probabilities with contiguous rows; rows: (N,) row ids or None; count < V - 1.
    Returns values (N, count) and token ids (N, count).
    """
    vocab = flat.shape[1]
    total = flat.shape[0] if rows is None else rows.shape[0]
    # Per-chunk op dispatch dominates small chunks: V = 5000 ran 1.2x faster with 419-row chunks
    # than with 52-row (1 MB) ones, V = 500 is best at ~512 rows, V = 20000 at ~100 rows (8 MB).
    step = rows_per_chunk(vocab, flat.device)
    vals: List[torch.Tensor] = []
    ids: List[torch.Tensor] = []
    buf = flat.new_empty((min(step, total), vocab)) if rows is not None else None
    for r in range(0, total, step):
        if rows is None:
            chunk = flat[r:r + step]
        else:
            part = rows[r:r + step]
            chunk = torch.index_select(flat, 0, part, out=buf[:part.shape[0]])
        v, i = _chunk_top(chunk, count, blank)
        vals.append(v)
        ids.append(i)
    if not vals:
        return flat.new_empty((0, count)), torch.empty((0, count), dtype=torch.long, device=flat.device)
    return torch.cat(vals), torch.cat(ids)
