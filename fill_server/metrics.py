"""The server's counters, gauges and histograms, in Prometheus' text format (0.0.4).

Written by hand (a few dozen lines) rather than with prometheus_client: the serve extra
stays two packages. Every metric is named `diffusion_serve_*`; labels have a bounded set
of values (the routes, HTTP statuses, a few reasons), so a scrape stays small.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

PREFIX = "diffusion_serve"
FILL_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)  # tokens per second


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        for i, le in enumerate(self.buckets):
            if value <= le:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{le:g}"}} {c}' for le, c in zip(self.buckets, self.counts, strict=True)]
        out += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]
        return out


class Metrics:
    """Thread-safe: the handlers count requests, the worker fills."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.cancelled: defaultdict[str, int] = defaultdict(int)  # by reason: superseded, disconnected
        self.fill_seconds = Histogram(FILL_BUCKETS_S)
        self.queue_wait_seconds = Histogram(FILL_BUCKETS_S)
        self.tokens_per_second = Histogram(RATE_BUCKETS)
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.steps = 0  # the engine's steps, cancelled fills' included
        self.queue_depth: Callable[[], int] = lambda: 0  # the scheduler sets these two
        self.running: Callable[[], int] = lambda: 0
        self.model_loaded: Callable[[], bool] = lambda: False

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1

    def cancel(self, reason: str) -> None:
        with self._lock:
            self.cancelled[reason] += 1

    def fill(self, seconds: float, waited: float, prompt: int, generated: int, steps: int) -> None:
        with self._lock:
            self.fill_seconds.observe(seconds)
            self.queue_wait_seconds.observe(waited)
            if generated and seconds > 0:
                self.tokens_per_second.observe(generated / seconds)
            self.generated_tokens += generated
            self.prompt_tokens += prompt
            self.steps += steps

    def render(self) -> str:
        """The exposition text, one scrape."""
        p = PREFIX
        with self._lock:
            out = _family(f"{p}_requests_total", "counter", "HTTP requests answered, by route and status")
            out += [
                f'{p}_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())
            ]
            out += _family(f"{p}_cancelled_total", "counter", "fills cancelled, by reason")
            out += [f'{p}_cancelled_total{{reason="{r}"}} {n}' for r, n in sorted(self.cancelled.items())]
            out += _gauge(f"{p}_queue_depth", "fills waiting for the model", self.queue_depth())
            out += _gauge(f"{p}_running", "fills on the model now", self.running())
            out += _gauge(f"{p}_model_loaded", "1 once the model has loaded", int(self.model_loaded()))
            out += _family(f"{p}_fill_seconds", "histogram", "time on the model per fill")
            out += self.fill_seconds.lines(f"{p}_fill_seconds")
            out += _family(f"{p}_queue_wait_seconds", "histogram", "time a fill waited for the model")
            out += self.queue_wait_seconds.lines(f"{p}_queue_wait_seconds")
            out += _family(f"{p}_tokens_per_second", "histogram", "generated tokens per second of each fill")
            out += self.tokens_per_second.lines(f"{p}_tokens_per_second")
            out += _counter(f"{p}_generated_tokens_total", "tokens in the answers", self.generated_tokens)
            out += _counter(f"{p}_prompt_tokens_total", "context tokens the fills read", self.prompt_tokens)
            out += _counter(f"{p}_steps_total", "the engine's steps (forward passes)", self.steps)
        return "\n".join(out) + "\n"


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


def _gauge(name: str, help_text: str, value: float) -> list[str]:
    return [*_family(name, "gauge", help_text), f"{name} {value:g}"]


def _counter(name: str, help_text: str, value: float) -> list[str]:
    return [*_family(name, "counter", help_text), f"{name} {value:g}"]
