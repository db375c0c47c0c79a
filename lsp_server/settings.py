"""Server settings: nested, fully defaulted dataclasses read from initializationOptions and
workspace/configuration (section `diffusionLsp`). An invalid value is reported (by name)
and its default used; unknown keys are ignored."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.sampler import STRATEGIES

BACKENDS = ("auto", "onnx", "torch", "diffusion_gemma")


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # model directory; None: the shipped model
    backend: str = "auto"
    device: str = "cpu"
    strategy: str | None = None  # None: the model's default
    max_steps: int | None = None
    max_fill_tokens: int | None = None  # canvas length; None: from the span or the model
    context_tokens: int | None = None
    debounce_ms: int = 0
    alternatives: int = 3  # candidates when the user asks (triggerKind Invoked)
    languages: list[str] = field(default_factory=list)  # empty: all languages
    drafts: bool = False


def _check(name: str, value: Any) -> str | None:
    """Why `value` is not valid for setting `name`, or None."""
    optional_int = {"max_steps": (1, 1024), "max_fill_tokens": (1, 256), "context_tokens": (16, 1 << 20)}
    if name in optional_int:
        lo, hi = optional_int[name]
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
            return f"an integer in {lo}..{hi}"
    elif name in ("debounce_ms", "alternatives"):
        lo, hi = (0, 5000) if name == "debounce_ms" else (1, 8)
        if not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
            return f"an integer in {lo}..{hi}"
    elif name == "backend" and value not in BACKENDS:
        return f"one of {', '.join(BACKENDS)}"
    elif name == "strategy" and value is not None and value not in STRATEGIES:
        return f"one of {', '.join(STRATEGIES)}"
    elif name in ("model", "device") and value is not None and not isinstance(value, str):
        return "a string"
    elif name == "languages" and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        return "a list of language ids"
    elif name == "drafts" and not isinstance(value, bool):
        return "true or false"
    return None


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """(settings, problems): each problem names the setting and what it should be."""
    base = base or Settings()
    if raw is None:
        return base, []
    if not isinstance(raw, dict):
        return base, ["diffusionLsp settings must be an object; using the defaults"]
    raw = raw.get("diffusionLsp", raw)
    names = {f.name for f in fields(Settings)}
    camel = {
        "maxSteps": "max_steps",
        "maxFillTokens": "max_fill_tokens",
        "contextTokens": "context_tokens",
        "debounceMs": "debounce_ms",
    }
    changes: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        name = camel.get(key, key)
        if name not in names:
            continue
        why = _check(name, value)
        if why is not None:
            problems.append(f"diffusionLsp.{key} must be {why} (got {value!r}); using the default")
        else:
            changes[name] = value
    return replace(base, **changes), problems
