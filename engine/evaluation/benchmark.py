"""`diffusion-infill bench`: fill latency, steps and throughput on one model, as JSON.

Scenarios (each over the same `repeats` cursor positions in held-out code):
  cold      fresh cache, CONTEXT_TOKENS of context, a CANVAS_TOKENS-token span, the
            model's default sampler settings
  warm      the same request after one more typed character (cache + warm start)
  drafter_on, drafter_off   cold, with the prompt-lookup drafter forced on / off
  baseline_l2r   cold, one token per step left to right (the autoregressive-style
                 baseline), same weights, drafter off
Ratios are computed within one run. Wall-clock figures are medians: the machines are
shared and noisy. Nothing here is asserted in tests.
"""

from __future__ import annotations

import platform
import random
import resource
import statistics
import sys
import sysconfig
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.candidate import Shown
from engine.denoisers.loading import LoadedModel
from engine.fill import Engine, FillOptions, InfillRequest
from engine.local.generator import LocalGenerator, local_engine

CONTEXT_TOKENS = 1024
CANVAS_TOKENS = 32
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "code"


def bench_sources() -> list[str]:
    """Held-out code (the stdlib's email package, never trained on), else fixtures."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "email"
    files = sorted(root.glob("*.py")) or sorted(FIXTURES.glob("*.py"))
    texts = [p.read_text(encoding="utf-8") for p in files]
    return [t for t in texts if len(t) > 20_000] or texts


def positions(texts: list[str], n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (prefix, suffix) pairs at line ends deep enough for a full context."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        t = rng.choice(texts)
        lo = min(len(t) - 1, 12_000)
        i = t.find("\n", rng.randrange(lo, len(t)))
        if i > 0:
            out.append((t[:i], t[i:]))
    return out


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summary(ms: list[float], steps: list[int], tokens: list[int]) -> dict[str, float]:
    total_s = sum(ms) / 1000
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(_pct(ms, 0.95), 2),
        "steps_per_fill": round(statistics.mean(steps), 2),
        "tokens_per_step": round(sum(tokens) / max(1, sum(steps)), 2),
        "tokens_per_s": round(sum(tokens) / total_s, 1) if total_s else 0.0,
        "fills": len(ms),
    }


def _fill_tokens(engine: Engine, text: str) -> int:
    """Tokens the fill produced, counting its end-of-fill token."""
    return engine.generator.count_tokens(text) + 1


def run_benchmark(model: LoadedModel, repeats: int = 20, strategy: str | None = None) -> dict[str, Any]:
    """`strategy`: the cold and warm fills' (None: the model's default)."""
    engine = local_engine(
        model, FillOptions(canvas_tokens=CANVAS_TOKENS, context_tokens=CONTEXT_TOKENS, strategy=strategy)
    )
    cases = positions(bench_sources(), repeats)
    assert isinstance(engine.generator, LocalGenerator)
    base = engine.generator.default_sampler()
    l2r = replace(base, strategy="left_to_right", max_steps=CANVAS_TOKENS)
    # the autoregressive mode of the same weights, where the model has it
    ar = (
        replace(base, strategy="autoregressive", max_steps=CANVAS_TOKENS)
        if model.denoiser.info.autoregressive
        else None
    )

    # warm-up: load the graphs and allocate buffers
    engine.fill(InfillRequest(*cases[0]))
    report: dict[str, Any] = {}
    rows: dict[str, tuple[list[float], list[int], list[int]]] = {
        k: ([], [], []) for k in ("cold", "warm", "drafter_on", "drafter_off", "baseline_l2r", "baseline_ar")
    }
    scenarios: list[tuple[str, dict[str, Any]]] = [
        ("cold", {}),
        ("drafter_on", {"use_drafter": True}),
        ("drafter_off", {"use_drafter": False}),
        ("baseline_l2r", {"sampler": l2r, "use_drafter": False}),
    ]
    if ar is not None:
        scenarios.append(("baseline_ar", {"sampler": ar, "use_drafter": False}))
    else:
        del rows["baseline_ar"]
    drafted: list[int] = []
    warm_started = 0
    reused: list[float] = []
    for prefix, suffix in cases:
        for name, kw in scenarios:
            engine.reset()
            t0 = time.perf_counter()
            r = engine.configured(**kw).fill(InfillRequest(prefix, suffix))
            ms = (time.perf_counter() - t0) * 1000
            rows[name][0].append(ms)
            rows[name][1].append(r.steps)
            rows[name][2].append(_fill_tokens(engine, r.text))
            if name == "drafter_on":
                drafted.append(r.drafted)
            if name == "cold":
                typed = r.text[:1] if r.text[:1].strip() else " "
                # warm: the same context plus one typed character
                t0 = time.perf_counter()
                w = engine.fill(InfillRequest(prefix + typed, suffix, previous=Shown(prefix, suffix, r.text)))
                wms = (time.perf_counter() - t0) * 1000
                rows["warm"][0].append(wms)
                rows["warm"][1].append(w.steps)
                rows["warm"][2].append(_fill_tokens(engine, w.text))
                warm_started += w.warm_start
                reused.append(w.reused_tokens / max(1, w.context_tokens))
    for name, (times, steps, toks) in rows.items():
        report[name] = _summary(times, steps, toks)
    report["drafter_on"]["drafted_positions"] = round(statistics.mean(drafted), 2)
    report["warm"]["warm_start_share"] = round(warm_started / len(cases), 2)
    report["warm"]["context_reused_share"] = round(statistics.mean(reused), 3)
    cold_steps = report["cold"]["steps_per_fill"]
    report["ratios"] = {
        "baseline_steps_over_default": round(report["baseline_l2r"]["steps_per_fill"] / max(cold_steps, 1e-9), 2),
        **(
            {"ar_steps_over_default": round(report["baseline_ar"]["steps_per_fill"] / max(cold_steps, 1e-9), 2)}
            if "baseline_ar" in report
            else {}
        ),
        "drafter_off_steps_over_drafter_on": round(
            report["drafter_off"]["steps_per_fill"] / max(report["drafter_on"]["steps_per_fill"], 1e-9), 2
        ),
    }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report["peak_rss_mb"] = round(rss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)
    report["setup"] = {
        "model": str(model.path),
        "backend": model.backend,
        "strategy": strategy or base.strategy,
        "entropy_bound": base.entropy_bound,
        "drafter_default": bool(model.defaults.get("drafter", True)),
        "max_steps": base.max_steps,
        "context_tokens": CONTEXT_TOKENS,
        "canvas_tokens": CANVAS_TOKENS,
        "repeats": repeats,
        "machine": f"{platform.machine()} {platform.processor() or ''} cpus={_cpus()}".strip(),
        "python": platform.python_version(),
    }
    return report


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
