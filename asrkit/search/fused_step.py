"""The CTC part of a frame step of the torch loop as one Triton kernel (the GPU path's default where triton runs).

Captured in a CUDA graph (:mod:`asrkit.search.prefix_graph`), the torch loop still runs about 30 kernels per frame
step (67 with a word 3-gram), each a few microseconds on a GPU. This kernel does the step's CTC arithmetic of
:func:`asrkit.search.prefix_loop.step` for one utterance per program: the extension and stay scores, the merge of
an extension into the stay of the hypothesis it equals (the parent found by prefix hashes), the K best of the
K*(C+1) candidates, and the new beam with its hashes. Without scorers one launch runs every step of the batch (the
beam stays in registers; by default the GPU path runs :mod:`asrkit.search.fused_search` instead, which also builds
the tables in its program); with scorers it runs one step between the scorers' torch calls (their scores go in
through ``fusion``, their states follow the picks it writes out).

It reads the bucketed tables of :class:`~asrkit.search.prefix_loop.FrameTables` (the kept frames' log-prob rows
step-major, data-driven padding and blank runs) and writes what the torch step writes: ``st``, ``ints``, the
step's picks into ``hist`` (so backtracking is unchanged), ``parent`` and ``token`` for the scorers. The K best are
taken best first, ties to the lower candidate index (``torch.topk`` leaves both open: the beam's order differs, the
n-best does not). Not for the exact search over more than 32 tokens (``wide``) nor for streaming.

On by default on CUDA (``prefix_graph.FUSED_STEP``; ``ASRKIT_FUSED_STEP=0`` turns it off): on an H100 it was
1.1-2.8x the captured torch step, with the same results (tests/search/test_fused_step.py passed there). On the CPU
it runs under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check it against the torch
step; the interpreter is slow, so it is for tests only.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Optional

import torch

from asrkit.search.interfaces import HASH_MUL, SENT_HASH, SENT_PARENT

NUM_WARPS = 8  # warps per program (measured on an H100: 8 beat 1, 2 and 4 by 1.2-1.4x at batch 32 and 2048)


def unavailable(device: torch.device) -> Optional[str]:
    """Why the kernel cannot run on ``device`` (None: it can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"the Triton kernel runs on CUDA devices (or under TRITON_INTERPRET=1), not {device}"
    return None


def run_steps(s: Any, fr: Any, first: int, n_steps: int, has_scorers: bool) -> None:
    """Advance the beam ``s`` (a :class:`~asrkit.search.prefix_loop.BeamState`) by steps ``first`` ..
    ``first + n_steps - 1`` of the bucketed tables ``fr``; with scorers, ``s.fusion_buf`` holds the step's weighted
    scores and ``s.parent`` / ``s.token`` receive the picks' parents and tokens; without, ``s.bonus`` the length bonus."""
    import triton

    from asrkit.search.fused_kernel import ctc_steps

    batch, beam = s.pnb.shape
    ctc_steps[(batch,)](
        s.st, s.ints, fr.tok_all, fr.tables["cval"], fr.tables["lpb"], fr.tables["pad_bias"], fr.run_after,
        fr.tables["lp_rows"], s.fusion_buf if has_scorers else s.st, s.hist, s.parent, s.token,
        first, n_steps, batch, beam, fr.n_cand, fr.tables["lp_rows"].shape[2], s.bonus if s.fusion else s.st,
        HAS_FUSION=s.fusion, HAS_SCORERS=has_scorers, BK=triton.next_power_of_2(beam),
        BC=triton.next_power_of_2(fr.n_cand + 1), SENT_HASH_C=SENT_HASH, SENT_PARENT_C=SENT_PARENT,
        SENT_MIN_C=-(2 ** 63), HASH_MUL_C=HASH_MUL, num_warps=NUM_WARPS)
