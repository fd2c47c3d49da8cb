"""Batches that fill a GPU: how many utterances one batch may hold when the user set no batch size
(``decode.batch_size: null``, ``transcribe`` without ``--batch-seconds``) and the model runs on CUDA.

A batch is sized by seconds of audio, padding counted, from the GPU memory free and what decoding costs in
memory, measured once by a probe: the peak memory (``torch.cuda.max_memory_allocated`` above what was allocated
before) of decoding one utterance - frontend, encoder, CTC head and the search, with the configured beam and
LM - at two lengths, a short one and the longest to be decoded, cut from that very utterance. The cost of one
utterance of ``s`` seconds is then taken as ``per_utterance + per_second * s``: the line through the two probes,
never below the short probe's cost. The true cost is convex in ``s`` (self-attention is quadratic in the
length) and grows with it, so that line lies above it anywhere up to the longest probed. The probe runs the
real pipeline rather than estimating from the config because memory depends on the attention kernel, the
search's pruning, the LM kind and the allocator, none of which a formula over the config follows.

A batch of ``n`` utterances padded to the longest, ``L`` seconds, is taken when ``n * cost(L)`` is within
``decode.gpu_memory_fraction`` of the free memory (the rest is the allocator's fragmentation, library
workspaces and other processes' margin) and ``n * L`` within :data:`MAX_BATCH_SECONDS` (host memory for the
batch's audio, latency). A batch that runs out of memory all the same is split in halves by the caller, and
:meth:`AutoBatch.shrink` halves the budget of the batches after it. Off CUDA nothing here runs: the CPU decodes
``CPU_BATCH_SIZE`` utterances or ``CPU_BATCH_SECONDS`` of audio per batch, as it always did.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

log = logging.getLogger("asrkit.pipeline.autobatch")  # its own name: `asrkit transcribe` shows its INFO lines

CPU_BATCH_SIZE = 16  # utterances per batch of ``asrkit decode`` when decode.batch_size is null, off CUDA
CPU_BATCH_SECONDS = 120.0  # seconds of padded audio per batch of ``asrkit transcribe`` off CUDA
# The most padded audio a batch sized from GPU memory holds: 720 utterances of 10 s, 460 MB of 16 kHz waveforms
# on the host (transcribe buffers twice that as features); the search's throughput still grows at that size
# (docs/benchmarks.md, an H200, 10 s utterances: 2048 a batch search 1.8-2.1x as many per second as 512)
MAX_BATCH_SECONDS = 7200.0
SHORT_PROBE_SECONDS = 1.0  # the short probe's length (or half the longest utterance, if that is shorter)

MemGetInfo = Callable[[], Tuple[int, int]]  # () -> (free, total) bytes, as torch.cuda.mem_get_info
PeakMeter = Callable[[Callable[[], object]], int]  # runs a call, returns its peak bytes above the start


@dataclass(frozen=True)
class MemoryCost:
    """Peak memory of decoding one utterance of ``s`` seconds: at most ``per_utterance + per_second * s`` bytes,
    for ``s`` up to ``upto`` seconds (the longest probed)."""

    per_utterance: float
    per_second: float
    upto: float

    @classmethod
    def fit(cls, short: Tuple[float, float], long: Tuple[float, float]) -> "MemoryCost":
        """The line through two probes, ``(seconds, peak bytes)`` each, the short one first; its intercept is
        at least the short probe's cost, so that it bounds a convex, growing cost on ``[0, long seconds]``."""
        (s0, b0), (s1, b1) = short, long
        if s1 <= s0:  # one length probed: its cost for any utterance up to it
            return cls(float(max(b0, b1)), 0.0, s1)
        return cls(float(b0), max(0.0, (b1 - b0) / (s1 - s0)), s1)

    def bytes(self, seconds: float) -> float:
        return self.per_utterance + self.per_second * seconds


@dataclass(frozen=True)
class BatchLimit:
    """How many utterances one batch holds: ``count * longest <= seconds`` (padded audio), and where the memory
    cost is known, ``count * cost.bytes(longest) <= budget`` bytes; at least one."""

    seconds: float
    cost: Optional[MemoryCost] = None
    budget: float = 0.0

    def count(self, longest: float) -> int:
        """Utterances in a batch whose longest utterance is ``longest`` seconds."""
        n = self.seconds // max(longest, 1e-3)
        if self.cost is not None:
            n = min(n, self.budget // max(self.cost.bytes(longest), 1.0))
        return max(1, int(n))

    def audio(self, longest: float) -> float:
        """Seconds of padded audio a full batch holds (what the transcriber buffers twice before batching): a
        fixed limit's ``seconds``, or ``count(longest) * longest`` for one sized from memory."""
        return self.seconds if self.cost is None else self.count(longest) * longest


def measure_cost(decode_one: Callable[[float], object], longest: float, peak: PeakMeter,
                 short: float = SHORT_PROBE_SECONDS) -> MemoryCost:
    """Probe the memory of ``decode_one(seconds)`` (one utterance of that length decoded) at ``short`` seconds
    (at most half of ``longest``) and at ``longest``."""
    short = min(short, longest / 2)
    return MemoryCost.fit((short, peak(lambda: decode_one(short))), (longest, peak(lambda: decode_one(longest))))


def cuda_peak(device: torch.device) -> PeakMeter:
    """A :data:`PeakMeter` on a CUDA device; the cached blocks are released after each run, so that
    ``mem_get_info`` then counts them as free."""
    def measure(run: Callable[[], object]) -> int:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        try:
            run()
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) - base
        finally:
            torch.cuda.empty_cache()

    return measure


class AutoBatch:
    """The batch limit of one transcriber on a GPU: probed again when an utterance longer than any probed
    comes, or another search (``key``: a call with other decode options); sized from the memory free then.

    ``mem_get_info`` and ``peak`` are injected so that the rule runs on the CPU in tests."""

    def __init__(self, fraction: float, mem_get_info: MemGetInfo, peak: PeakMeter,
                 max_seconds: float = MAX_BATCH_SECONDS, name: str = "cuda"):
        self.fraction, self.mem_get_info, self.peak = fraction, mem_get_info, peak
        self.max_seconds, self.name = max_seconds, name
        self.cost: Optional[MemoryCost] = None
        self.budget = 0.0
        self.scale = 1.0  # halved by each batch that ran out of memory: kept when the budget is measured again
        self.key: object = None

    @classmethod
    def on_device(cls, device: torch.device, fraction: float) -> "AutoBatch":
        """The GPU's own memory reader and peak meter."""
        return cls(fraction, lambda: torch.cuda.mem_get_info(device), cuda_peak(device), name=str(device))

    def limit(self, longest: float, decode_one: Callable[[float], object], key: object = None
              ) -> Optional[BatchLimit]:
        """The limit for batches of utterances up to ``longest`` seconds; ``decode_one(seconds)`` decodes one
        utterance of that length (cut from one of the data's longest) when a probe is needed. None when one such
        utterance alone runs out of memory (the caller decodes it alone, to fail as its own)."""
        if self.cost is None or longest > self.cost.upto or key is not self.key:
            try:
                self.cost, self.key = measure_cost(decode_one, longest, self.peak), key
            except torch.cuda.OutOfMemoryError:  # the cost probed before (if any) stays for shorter utterances
                log.warning("%s: one utterance of %.1f s runs out of memory alone", self.name, longest)
                return None
            free = self.mem_get_info()[0]
            self.budget = self.fraction * self.scale * free
            n = self.current.count(longest)
            log.info("batch sized from %s memory: %.2f GiB free, %.2f of it; one utterance %.1f MiB + %.2f MiB "
                     "per second of audio: %d utterances (%.0f s of audio) of %.1f s a batch", self.name,
                     free / 2**30, self.fraction, self.cost.per_utterance / 2**20, self.cost.per_second / 2**20,
                     n, n * longest, longest)
        return self.current

    @property
    def current(self) -> BatchLimit:
        return BatchLimit(self.max_seconds, self.cost, self.budget)

    def shrink(self) -> None:
        """A batch ran out of memory all the same: halve the budget of the batches after it."""
        self.scale /= 2
        self.budget /= 2
        log.warning("%s: a batch sized from free memory ran out of it: the batches after it get half the budget "
                    "(%.2f GiB)", self.name, self.budget / 2**30)
