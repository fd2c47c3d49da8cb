"""Data-parallel context: one process per device, started by ``torchrun``.

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (and the rendezvous address); with
``WORLD_SIZE`` > 1 the process group is initialised (NCCL on CUDA, gloo on CPU) and the model is
wrapped in DistributedDataParallel. Without those variables everything below is a no-op, so one
process and many run the same code. Only rank 0 writes checkpoints, logs and tensorboard scalars.

    single node, 4 GPUs:  torchrun --standalone --nproc_per_node=4 -m asrkit train ...
    two nodes:            torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
                              --rdzv-endpoint=HOST:29400 --rdzv-id=JOB -m asrkit train ...

Every rank reads the experiment dir (tokenizer, checkpoints when resuming), so with several nodes
it must be on a shared file system.
"""
from __future__ import annotations

import gc
import importlib
import os
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: Optional[str] = None) -> DistContext:
    """Read the torchrun environment, initialise the process group if there are several processes,
    and pick this process's device (``cuda:LOCAL_RANK`` when CUDA is used)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        if world > 1 or dev.index is None:
            dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        # DistributedDataParallel imports torch._dynamo on first use, and that import keeps references to the
        # process group it finds (10 in torch 2.14), so destroy_process_group could never free it: gloo's
        # threads then ran until interpreter exit, where their teardown while the peer closed its sockets
        # aborted a rank ("terminate called without an active exception"). Imported before the group exists,
        # it holds none.
        importlib.import_module("torch._dynamo")
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistContext(rank, world, local_rank, dev)


def cleanup() -> None:
    """Destroy the process group, and with it (once nothing else holds it) its backend's threads. The
    DistributedDataParallel wrapper that used it must be gone: collected first, in case a cycle holds it."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def all_reduce_sum(values: List[float], ctx: DistContext) -> List[float]:
    """Sum a few scalars over ranks (one collective); identity in a single process."""
    if not ctx.distributed:
        return list(values)
    device = ctx.device if ctx.device.type == "cuda" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj: Any, ctx: DistContext) -> List[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (e.g. RNG states for a checkpoint)."""
    if not ctx.distributed:
        return [obj]
    out: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
