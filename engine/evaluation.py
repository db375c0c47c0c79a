"""`diffusion-infill eval`: exact match and steps on infill tasks cut from source files.

Minimal here (the default-model issue adds syntax validity and more kinds): tasks of
three kinds are cut from the files under a directory with a fixed seed; the fill counts
as exact when it equals the removed middle (trailing whitespace ignored).
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

from engine.errors import InputError
from engine.infill import InfillEngine, InfillRequest
from engine.sampler import SamplerConfig
from engine.tasks import TaskKind, cut

KINDS: tuple[TaskKind, ...] = ("rest_of_line", "lines", "random_span")


def evaluate_dir(
    engine: InfillEngine,
    data: Path,
    tasks: int = 100,
    seed: int = 0,
    sampler: SamplerConfig | None = None,
    use_drafter: bool | None = None,
    canvas_tokens: int | None = None,
    context_tokens: int | None = None,
) -> dict[str, Any]:
    if not data.is_dir():
        raise InputError(f"eval data directory not found: {data}")
    texts = []
    for p in sorted(data.rglob("*.py")):
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise InputError(f"no readable .py files under {data}")
    rng = random.Random(seed)
    report: dict[str, Any] = {"data": str(data), "files": len(texts)}
    all_exact, all_steps = 0, []
    for kind in KINDS:
        exact, steps, ms = 0, [], []
        for _ in range(tasks):
            prefix, middle, suffix = cut(rng.choice(texts), kind, rng)
            engine.reset(cache=False)  # independent tasks: no warm start between them
            r = engine.fill(
                InfillRequest(
                    prefix=prefix,
                    suffix=suffix,
                    sampler=sampler,
                    use_drafter=use_drafter,
                    canvas_tokens=canvas_tokens,
                    context_tokens=context_tokens,
                )
            )
            exact += r.text.rstrip() == middle.rstrip()
            steps.append(r.steps)
            ms.append(r.total_ms)
        all_exact += exact
        all_steps += steps
        report[kind] = {
            "tasks": tasks,
            "exact_match": round(exact / tasks, 4),
            "steps_per_fill": round(statistics.mean(steps), 2),
            "p50_ms": round(statistics.median(ms), 2),
        }
    report["all"] = {
        "tasks": tasks * len(KINDS),
        "exact_match": round(all_exact / (tasks * len(KINDS)), 4),
        "steps_per_fill": round(statistics.mean(all_steps), 2),
    }
    return report
