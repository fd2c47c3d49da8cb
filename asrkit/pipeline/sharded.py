"""Sharded decoding of a Kaldi data dir: N local processes (``asrkit decode --nj N``) or one shard per
``torchrun`` rank; finished shards are kept, so a rerun decodes only what is missing.

Layout under the output dir ``OUT`` (Kaldi style, shards numbered from 1)::

    OUT/split<N>/<k>/            shard k's data dir (wav.scp, segments, text, ... of its utterances)
    OUT/split<N>/<k>/decode/     its outputs: text, decode.yaml, nbest.jsonl, failed
    OUT/split<N>/<k>/.done       written atomically when shard k finished: utterance count and fingerprint
    OUT/log/decode.<k>.log       everything shard k's process printed (progress, warnings, a traceback)
    OUT/text, OUT/nbest.jsonl, OUT/failed, OUT/decode.yaml   the merge, in utterance order

Shards are contiguous ranges of the sorted utterance ids balanced by duration
(:func:`asrkit.data.split.split_data_dir`). A shard's fingerprint hashes the decoding settings, the model
checkpoint's (and a file LM's) path, size and modification time, and the shard's utterances with their audio
sources and bounds: a rerun with the same N, model, settings and data reuses every shard whose ``.done``
holds the same fingerprint, and decodes the others afresh. Changed audio *contents* behind unchanged paths
are not detected (delete ``OUT/split<N>`` to force a full decode).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from asrkit.atomic import atomic_write
from asrkit.checkpoint import MODEL_FILE
from asrkit.config import DecodeConfig, to_dict
from asrkit.data.datadir import DataDir, read_data_dir, write_data_dir
from asrkit.data.split import split_data_dir
from asrkit.data.table import read_table
from asrkit.pipeline.decode_dir import MAX_UTTERANCE_SECONDS, decode_data_dir, write_outputs
from asrkit.pipeline.transcriber import Transcriber

log = logging.getLogger("asrkit.pipeline")

MARKER = ".done"
_PR_SET_PDEATHSIG = 1  # prctl(2) option, from <linux/prctl.h>
# How long a torchrun rank waits at the final collective for the slowest rank's shard to finish.
DIST_TIMEOUT = timedelta(hours=48)


class ShardError(RuntimeError):
    """One or more shards failed; the message names each shard and its log file."""


@dataclass(frozen=True)
class DecodeJob:
    """What every shard's process needs to decode (picklable: it crosses to spawned processes)."""
    model_dir: str
    decode: DecodeConfig
    checkpoint: Optional[str] = None
    device: str = "cpu"
    batch_size: Optional[int] = None
    max_seconds: float = MAX_UTTERANCE_SECONDS  # longer utterances are segmented (asrkit.pipeline.decode_dir)


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as in Kaldi's split<N>/<k>
    num_shards: int
    data_dir: str
    log_file: str
    num_utts: int
    fingerprint: str

    @property
    def out_dir(self) -> str:
        return os.path.join(self.data_dir, "decode")

    @property
    def marker(self) -> str:
        return os.path.join(self.data_dir, MARKER)

    def is_done(self) -> bool:
        """True when the shard finished with these very settings and utterances (its ``.done`` agrees)."""
        try:
            with open(self.marker, encoding="utf-8") as fh:
                info = json.load(fh)
        except (OSError, ValueError):
            return False
        return (info.get("fingerprint") == self.fingerprint and info.get("utterances") == self.num_utts
                and os.path.isfile(os.path.join(self.out_dir, "text")))


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, as under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _stamp(path: Optional[str]) -> Optional[list]:
    """A cheap identity of a file: absolute path, size, modification time (None if absent)."""
    if not path or not os.path.exists(path):
        return None
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def shard_fingerprint(job: DecodeJob, dd: DataDir) -> str:
    """sha256 over the decoding settings, the model (and file LM) identity, and the shard's utterances."""
    utts = [[u.utt, u.source, u.start, u.end] for u in dd.utterances()]
    blob = {"decode": to_dict(job.decode), "model": _stamp(job.checkpoint or os.path.join(job.model_dir, MODEL_FILE)),
            "lm": _stamp(job.decode.lm), "utterances": utts, "max_seconds": job.max_seconds}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode("utf-8")).hexdigest()


def plan_shards(job: DecodeJob, data_dir: str, out_dir: str, nj: int) -> List[Tuple[Shard, DataDir]]:
    """Split ``data_dir`` into ``nj`` shards under ``out_dir/split<nj>`` (nothing is written yet)."""
    subs = split_data_dir(read_data_dir(data_dir), nj)
    split = os.path.join(out_dir, f"split{nj}")
    return [(Shard(k, nj, os.path.join(split, str(k)), os.path.join(out_dir, "log", f"decode.{k}.log"),
                   len(sub.all_utts()), shard_fingerprint(job, sub)), sub) for k, sub in enumerate(subs, 1)]


def prepare_shard(shard: Shard, sub: DataDir) -> None:
    """Write the shard's data dir and clear its old outputs and marker (before it is decoded again)."""
    if os.path.exists(shard.marker):
        os.remove(shard.marker)
    if os.path.isdir(shard.out_dir):
        shutil.rmtree(shard.out_dir)
    write_data_dir(sub, shard.data_dir)
    os.makedirs(os.path.dirname(shard.log_file), exist_ok=True)


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2: Python, tqdm and C++ alike) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w", encoding="utf-8") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            root.removeHandler(handler)
            root.setLevel(old_level)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def decode_shard(job: DecodeJob, shard: Shard, threads: Optional[int] = None, device: Optional[str] = None) -> dict:
    """Decode one prepared shard into ``shard.out_dir`` and write its ``.done``; output goes to its log file.

    Raises whatever decoding raises (after writing the traceback to the log).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    with _output_to(shard.log_file):
        print(f"# shard {shard.index} of {shard.num_shards}: {shard.num_utts} utterances from {shard.data_dir}, "
              f"{torch.get_num_threads()} thread(s), pid {os.getpid()}", flush=True)
        try:
            tr = Transcriber.from_dir(job.model_dir, device=device or job.device, checkpoint=job.checkpoint,
                                      decode=job.decode)
            stats = decode_data_dir(tr, shard.data_dir, shard.out_dir, job.batch_size, job.max_seconds)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            raise
        with atomic_write(shard.marker) as fh:  # a killed process leaves no marker
            json.dump({"utterances": shard.num_utts, "fingerprint": shard.fingerprint, **stats}, fh)
            fh.write("\n")
        print(f"# shard {shard.index} done: {stats}", flush=True)
    return stats


def _shard_device(device: str, k: int) -> str:
    """Local process k's device: ``cuda`` without an index spreads the shards over the visible GPUs."""
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        return f"cuda:{(k - 1) % torch.cuda.device_count()}"
    return device


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent`` (its parent) ends, even by SIGKILL, when no handler of the
    parent runs to end it: on Linux the kernel sends SIGKILL (``PR_SET_PDEATHSIG``; it fires when the parent
    *thread* that started this process ends, so start workers from a thread that lives as long as they should);
    elsewhere a daemon thread checks the parent's pid every second. A shard left running would decode on as
    an orphan beside the rerun."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker(job: DecodeJob, shard: Shard, threads: int, parent: int) -> None:
    """Entry point of a spawned process: exit status 0 when the shard finished, 1 otherwise."""
    die_with_parent(parent)
    try:
        decode_shard(job, shard, threads, _shard_device(job.device, shard.index))
    except BaseException:  # the traceback is in the shard's log
        sys.exit(1)


def merge_shards(shards: Sequence[Shard], out_dir: str) -> dict:
    """Merge the shards' text, nbest.jsonl and failed into ``out_dir`` in utterance order; decode.yaml once."""
    text: Dict[str, str] = {}
    failed: Dict[str, str] = {}
    nbest: List[Tuple[str, int, str]] = []
    for s in shards:
        text.update(read_table(os.path.join(s.out_dir, "text")))
        if os.path.isfile(os.path.join(s.out_dir, "failed")):
            failed.update(read_table(os.path.join(s.out_dir, "failed")))
        path = os.path.join(s.out_dir, "nbest.jsonl")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    obj = json.loads(line)
                    nbest.append((obj["utt"], obj["rank"], line))
    with open(os.path.join(shards[0].out_dir, "decode.yaml"), "rb") as src, \
            atomic_write(os.path.join(out_dir, "decode.yaml"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    nbest.sort(key=lambda x: (x[0], x[1]))  # utterance order (C-locale, as Kaldi sorts), then rank
    write_outputs(out_dir, text, failed, [line for _, _, line in nbest])
    log.info("merged %d shards into %s/text: %d utterances decoded, %d failed", len(shards), out_dir,
             len(text), len(failed))
    return {"decoded": len(text), "failed": len(failed)}


def _failure_message(failures: Sequence[Tuple[Shard, str]]) -> str:
    lines = [f"{len(failures)} of {failures[0][0].num_shards} shards failed (finished shards are kept; "
             f"rerun the same command to decode only the missing ones):"]
    lines += [f"  shard {s.index} ({why}): see {s.log_file}" for s, why in failures]
    return "\n".join(lines)


def gpu_share(job: DecodeJob, devices: Sequence[str]) -> DecodeJob:
    """The job of local shard processes on ``devices`` (one each): where several share one GPU, each sizes its
    batches (``decode.batch_size`` null, :mod:`asrkit.pipeline.autobatch`) from its share of the memory, since
    each probes the memory free before any of them fills it."""
    sharing = max(Counter(d for d in devices if torch.device(d).type == "cuda").values(), default=1)
    if sharing <= 1:
        return job
    share = round(job.decode.gpu_memory_fraction / sharing, 4)  # (rounded: decode.yaml says it)
    return replace(job, decode=replace(job.decode, gpu_memory_fraction=share))


def decode_sharded(job: DecodeJob, data_dir: str, out_dir: str, nj: int) -> dict:
    """Decode ``data_dir`` into ``out_dir`` with ``nj`` local processes (spawned), one shard each, then merge.

    Each process uses ``max(1, cpus // nj)`` torch threads. Shards already done with the same fingerprint
    are reused. Raises ShardError naming each failed shard and its log (after all processes ended).
    Returns ``{"decoded", "failed", "shards_run", "shards_reused"}``.
    """
    import multiprocessing as mp

    plan = plan_shards(job, data_dir, out_dir, nj)
    todo = [(s, sub) for s, sub in plan if not s.is_done()]
    threads = max(1, cpu_count() // nj)
    log.info("%d shards of %s: %d to decode (%d reused) in %d processes of %d thread(s); logs in %s",
             nj, data_dir, len(todo), nj - len(todo), len(todo), threads, os.path.join(out_dir, "log"))
    ctx = mp.get_context("spawn")  # fork would copy a parent's torch thread pools and locks
    worker_job = gpu_share(job, [_shard_device(job.device, s.index) for s, _ in todo])
    procs = []
    try:
        for shard, sub in todo:
            prepare_shard(shard, sub)
            p = ctx.Process(target=_worker, args=(worker_job, shard, threads, os.getpid()),
                            name=f"decode.{shard.index}")
            p.start()
            procs.append((shard, p))
        from multiprocessing.connection import wait
        pending = {p.sentinel: p for _, p in procs}
        with tqdm(total=len(procs), desc="shards", unit="shard", dynamic_ncols=True) as bar:
            while pending:
                for sentinel in wait(list(pending)):
                    pending.pop(sentinel).join()
                    bar.update(1)
    finally:
        for _, p in procs:
            if p.is_alive():  # interrupted: do not leave orphans decoding
                p.terminate()
                p.join()
    failures = [(s, f"exit status {p.exitcode}") for s, p in procs if p.exitcode != 0 or not s.is_done()]
    if failures:
        raise ShardError(_failure_message(failures))
    result = merge_shards([s for s, _ in plan], out_dir)
    return {**result, "shards_run": len(todo), "shards_reused": nj - len(todo)}


def torchrun_world() -> Tuple[int, int, int]:
    """``(rank, world_size, local_world_size)`` from the torchrun environment ((0, 1, 1) without it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))


def decode_distributed(job: DecodeJob, data_dir: str, out_dir: str) -> Optional[dict]:
    """Under ``torchrun``: rank r decodes shard r + 1 of ``split<WORLD_SIZE>``; rank 0 merges after every rank
    finished. Collectives go over gloo (CPU tensors only; works with and without GPUs).

    Returns the merge's counts on rank 0 and None on the other ranks; raises ShardError on every rank when
    any shard failed (rank 0's message names them all).
    """
    import torch.distributed as dist

    rank, world, local_world = torchrun_world()
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group(backend="gloo", timeout=DIST_TIMEOUT)
    try:
        # rank 0 splits (reading audio headers once) and hands each rank its shard
        plan: List[Optional[Tuple[Shard, DataDir]]] = [None] * world
        error: Optional[str] = None
        if rank == 0:
            try:
                plan = list(plan_shards(job, data_dir, out_dir, world))
            except (ValueError, OSError) as exc:  # DataDirError and TableError are ValueErrors
                error = str(exc)
        box = [error]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            raise ShardError(box[0])
        mine: List[Optional[Tuple[Shard, DataDir]]] = [None]
        dist.scatter_object_list(mine, plan if rank == 0 else None, src=0)
        shard, sub = mine[0]
        status: Optional[str] = None
        if shard.is_done():
            print(f"shard {shard.index} of {world}: already done, kept", file=sys.stderr)
        else:
            prepare_shard(shard, sub)
            device = job.device
            if device == "cuda":
                device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            try:
                decode_shard(job, shard, max(1, cpu_count() // local_world), device)
            except Exception as exc:  # reported by rank 0; the traceback is in the shard's log
                status = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        statuses: List[Optional[str]] = [None] * world
        dist.all_gather_object(statuses, status)
        failures = [(s, why) for (s, _), why in zip(plan, statuses) if why is not None] if rank == 0 else []
        if any(s is not None for s in statuses):
            raise ShardError(_failure_message(failures) if rank == 0 else
                             f"shard {shard.index} failed: {status}; see {shard.log_file}" if status else
                             "another rank's shard failed (rank 0 names it)")
        result = merge_shards([s for s, _ in plan], out_dir) if rank == 0 else None
        dist.barrier()  # every rank returns only when the merged output exists
        return result
    finally:
        if own_group:
            dist.destroy_process_group()
