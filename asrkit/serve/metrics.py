"""What ``asrkit serve`` has done, as Prometheus text (``GET /metrics``, exposition format 0.0.4).

Counters only grow; ``asrkit_streams_live`` is a gauge; ``asrkit_rtf`` is the engine's compute seconds over the
seconds of stream audio it decoded; ``asrkit_partial_latency_seconds`` is a summary whose quantiles are over
the last :data:`LATENCY_WINDOW` partials: from the arrival of the last audio a partial heard to the partial
handed to its connection (the server's share of what a client sees).
"""
from __future__ import annotations

import collections
import threading
from typing import Deque, List, Tuple

import numpy as np

LATENCY_WINDOW = 10000
QUANTILES = (0.5, 0.95, 0.99)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The server's counters; thread-safe (the engine's worker and the event loop both count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.streams_live = 0
        self.streams_total = 0
        self.streams_refused = 0
        self.errors = 0
        self.audio_seconds = 0.0  # stream audio decoded
        self.compute_seconds = 0.0  # the engine's work on it
        self.ticks = 0  # batched steps
        self.chunks = 0  # stream chunks those steps advanced (chunks / ticks: the mean batch)
        self.uploads = 0
        self.upload_audio_seconds = 0.0
        self._latency: Deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self._latency_sum = 0.0
        self._latency_count = 0

    def add(self, **amounts: float) -> None:
        """Add to counters by name (``add(errors=1)``)."""
        with self._lock:
            for key, amount in amounts.items():
                setattr(self, key, getattr(self, key) + amount)

    def observe_latency(self, seconds: float) -> None:
        with self._lock:
            self._latency.append(seconds)
            self._latency_sum += seconds
            self._latency_count += 1

    @property
    def rtf(self) -> float:
        return self.compute_seconds / self.audio_seconds if self.audio_seconds else 0.0

    def latency_quantiles(self) -> List[Tuple[float, float]]:
        """(q, seconds) for each of :data:`QUANTILES` over the recent partials (NaN before the first)."""
        with self._lock:
            window = np.array(self._latency, dtype=np.float64)
        return [(q, float(np.quantile(window, q)) if window.size else float("nan")) for q in QUANTILES]

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        out: List[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"])

        metric("asrkit_streams_live", "gauge", "WebSocket streams open now.", self.streams_live)
        metric("asrkit_streams_total", "counter", "WebSocket streams started.", self.streams_total)
        metric("asrkit_streams_refused_total", "counter", "WebSocket streams refused: the server held its most.",
               self.streams_refused)
        metric("asrkit_errors_total", "counter", "Streams and uploads ended by an error.", self.errors)
        metric("asrkit_audio_seconds_total", "counter", "Seconds of stream audio decoded.", self.audio_seconds)
        metric("asrkit_compute_seconds_total", "counter", "Seconds the inference loop worked on streams.",
               self.compute_seconds)
        metric("asrkit_rtf", "gauge", "Real-time factor of the streams: compute seconds / audio seconds.", self.rtf)
        metric("asrkit_ticks_total", "counter", "Batched steps of the inference loop.", self.ticks)
        metric("asrkit_chunks_total", "counter", "Stream chunks decoded (per tick: the batch).", self.chunks)
        metric("asrkit_uploads_total", "counter", "Files transcribed by POST /v1/transcribe.", self.uploads)
        metric("asrkit_upload_audio_seconds_total", "counter", "Seconds of uploaded audio transcribed.",
               self.upload_audio_seconds)
        name = "asrkit_partial_latency_seconds"
        out += [f"# HELP {name} From a partial's last audio arriving to the partial sent.", f"# TYPE {name} summary"]
        out += [f'{name}{{quantile="{q:g}"}} {_number(v)}' for q, v in self.latency_quantiles()]
        with self._lock:
            out += [f"{name}_sum {_number(self._latency_sum)}", f"{name}_count {self._latency_count}"]
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """A sample value as Prometheus writes it (NaN, +Inf; integers without a fraction)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))
