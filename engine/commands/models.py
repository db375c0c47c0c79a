"""diffusion-infill models: what is in the models folder (size, backend, quantization, the
fill times measured on this machine, a block-causal checkpoint's blocks, and a checkpoint's
own decoding defaults from its generation_config.json), and `--measure` to time them here.

A measurement loads the model, then writes a few lines of a standard-library file (the
same for every model) as a user types them: the first character with the cache cold, then
a fill after each of a few more, each under the server's deadline (`--target-ms`, the
deadlineMs it stands for); it keeps the medians in the model's directory
(engine.models.folder).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from engine.errors import EngineError
from engine.models.directory import decoding_defaults, describe_blocks
from engine.models.folder import (
    DEFAULT_DEADLINE_MS,
    Entry,
    Timing,
    best,
    machine_key,
    models_folder,
    scan,
    write_timing,
)

SAMPLE = ("email", "_header_value_parser.py")  # in every CPython's standard library
POSITIONS = 3
KEYS = 4  # the first is the cold fill, the others keystrokes
# a line that starts a statement (not a comment, a docstring's text or a continuation)
_STATEMENT = re.compile(r"(?:return|if|for|while|raise|yield) |[A-Za-z_][\w.]*\s*(?:=|\()")


def sample_cases(positions: int = POSITIONS, keys: int = KEYS) -> list[tuple[str, str, str]]:
    """(prefix, suffix, typed characters): a line of the sample file being written, at
    lines spread over it; the prefix ends where the line's text starts, the suffix is the
    code after the line, and the typed characters are the line's first few."""
    text = Path(sysconfig.get_paths()["stdlib"]).joinpath(*SAMPLE).read_text(encoding="utf-8")
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    out: list[tuple[str, str, str]] = []
    step = max(1, len(lines) // (2 * positions))
    for j in range(positions):  # the first statement line from each of `positions` places on
        i = len(lines) // 3 + j * step
        while i < len(lines) - 1 and not (len(lines[i].lstrip()) > keys + 4 and _STATEMENT.match(lines[i].lstrip())):
            i += 1
        if i < len(lines) - 1:
            body = lines[i].lstrip()
            at = starts[i] + len(lines[i]) - len(body)
            out.append((text[:at], text[starts[i + 1] - 1 :], body[:keys]))
    return out


def measure(path: Path, device: str = "cpu", deadline_ms: int = DEFAULT_DEADLINE_MS) -> Timing:
    """Load the model and time its fills (see the module), each under the deadline the
    server gives it (a fill past it returns with its first line finished, as there)."""
    from engine.denoisers.loading import load_model
    from engine.fill import FillControl, FillOptions, InfillRequest
    from engine.local.generator import DEFAULT_CONTEXT_TOKENS, local_engine

    def timed(prefix: str, suffix: str) -> float:
        t = time.perf_counter()
        control = FillControl(deadline=time.monotonic() + deadline_ms / 1000)
        engine.fill(InfillRequest(prefix=prefix, suffix=suffix, language="python"), control)
        return (time.perf_counter() - t) * 1000

    t0 = time.perf_counter()
    engine = local_engine(load_model(path, device=device), FillOptions(context_tokens=DEFAULT_CONTEXT_TOKENS))
    load_s = time.perf_counter() - t0
    cold: list[float] = []
    keystroke: list[float] = []
    for prefix, suffix, typed in sample_cases():
        engine.reset()
        cold.append(timed(prefix + typed[0], suffix))
        keystroke.extend(timed(prefix + typed[:k], suffix) for k in range(2, len(typed) + 1))
    engine.close()
    return Timing(
        keystroke_p50_ms=round(statistics.median(keystroke), 1),
        cold_p50_ms=round(statistics.median(cold), 1),
        load_s=round(load_s, 2),
        when=time.strftime("%Y-%m-%d"),
    )


def _row(e: Entry, chosen: Entry | None) -> dict[str, object]:
    t = e.timing
    return {
        "name": e.name,
        "default": chosen is not None and e.path == chosen.path,
        "size_mb": round(e.size_bytes / 1e6),
        "backend": e.backend,
        "quantization": e.quantization,
        "parameters_m": round(e.parameters / 1e6) if e.parameters else None,
        "keystroke_p50_ms": t.keystroke_p50_ms if t else None,
        "cold_p50_ms": t.cold_p50_ms if t else None,
        "load_s": t.load_s if t else None,
        "problem": e.problem,
        "decoding": decoding_defaults(e.path).describe() or None,  # the checkpoint's own decoding defaults
        "blocks": describe_blocks(e.path) or None,  # a block-causal checkpoint's blocks
        "conversion": e.conversion,  # what making an export cost, where it was recorded
        "path": str(e.path),
    }


def _table(rows: list[dict[str, object]]) -> str:
    def cell(v: object, unit: str = "") -> str:
        return "-" if v is None else f"{v}{unit}"

    head = f"{'':2}{'NAME':40} {'SIZE':>8} {'BACKEND':16} {'QUANT':6} {'PARAMS':>7} {'KEYSTROKE':>10} {'COLD':>9}"
    out = [head]
    for r in rows:
        mark = "* " if r["default"] else "  "
        backend = r["backend"] or "unusable"
        out.append(
            f"{mark}{str(r['name'])[:40]:40} {cell(r['size_mb'], ' MB'):>8} {str(backend):16} {r['quantization']!s:6} "
            f"{cell(r['parameters_m'], 'M'):>7} {cell(r['keystroke_p50_ms'], ' ms'):>10} {cell(r['cold_p50_ms'], ' ms'):>9}"
        )
        if r["problem"]:
            out.append(f"    {r['problem']}")
        for line in ("blocks", "decoding"):
            if r.get(line):
                out.append(f"    {r[line]}")
    return "\n".join(out)


def cmd_models(args: argparse.Namespace) -> int:
    folder = models_folder(args.dir)
    key = machine_key(args.device)
    entries = scan(folder, key)
    if args.measure is not None:
        for e in entries:
            if (not args.measure or e.name in args.measure) and e.problem is None:
                sys.stderr.write(f"measuring {e.name} on {key} ...\n")
                try:
                    write_timing(e.path, key, measure(e.path, args.device, args.target_ms))
                except EngineError as exc:
                    sys.stderr.write(f"{e.name}: {exc}\n")
        entries = scan(folder, key)  # with the new times
    chosen = best(entries, args.target_ms)
    rows = [_row(e, chosen) for e in entries]
    if args.json:
        json.dump({"folder": str(folder), "machine": key, "target_ms": args.target_ms, "models": rows}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    if not rows:
        sys.stdout.write(f"no models in {folder}: `diffusion-infill pull OWNER/NAME` puts one there\n")
        return 0
    sys.stdout.write(_table(rows) + "\n")
    unmeasured = [r["name"] for r in rows if r["keystroke_p50_ms"] is None and not r["problem"]]
    pick = (
        f"* the server's default (keystroke fill within {args.target_ms} ms)"
        if chosen
        else "the server uses the shipped model"
    )
    sys.stdout.write(f"\n{folder} on {key}: {pick}")
    if unmeasured:
        sys.stdout.write(
            f"; not measured here: {', '.join(map(str, unmeasured))} (`diffusion-infill models --measure`)"
        )
    sys.stdout.write("\n")
    return 0
