"""What a keystroke costs on a model whose layout puts the suffix after the prefix
(Qwen2.5-Coder's prefix-suffix-middle order), under two settings of the model's
config.json `defaults` side by side in one run: `--base` and `--variant` (JSON objects
merged into the directory's defaults; the weights are linked, not copied), the variant
on another directory's weights with `--variant-model` (two exports of one model). Prints
JSON; never asserted.

    python bench/keystrokes.py --model DIR [--variant-model DIR] [--base JSON] [--variant JSON] [--positions N] [--keys K] [--context-tokens T]

For example int8 exports made two ways: `--model A --variant-model B`. Or the suffix capped at 64 tokens against the whole suffix:
`--variant '{"suffix_tokens": 64}'`; the cursor's line at the end of the prefix (a keystroke
encodes the whole suffix again) against the line in the middle (the default):
`--base '{"line_in_middle": false}'`.

Each keystroke is filled under both settings in turn. At N cursor positions (line starts after the first third of a held-out file, the rest of
the line being the text typed), the first K characters of the line are typed one at a
time, and each keystroke asks for a fill, as the editor would (the engine's context
cache holds the previous keystroke's state). Reports the p50/p95 time of a keystroke's
fill (encode and decode) for each, the p50 of the cold fill before each position's
keystrokes (a new position: nothing cached), and how often the variant's fill equals the
base's.
(bench/results/2026-12-03-keystrokes-moved-suffix-qwen05b-int4.json: the same
keystrokes with the suffix's keys and values moved instead of encoded again, since
reverted.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.denoisers.loading import load_model
from engine.fill import Engine, FillOptions, InfillRequest
from engine.local.generator import local_engine


def source() -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / "email" / "_header_value_parser.py"
    return path.read_text(encoding="utf-8")


def variant_copy(model: Path, into: Path, name: str, defaults: dict[str, object]) -> Path:
    """The model directory with `defaults` merged into its config.json's (the weights
    linked, not copied)."""
    out = into / name
    out.mkdir()
    for f in model.iterdir():
        (out / f.name).symlink_to(f.resolve())
    (out / "config.json").unlink()
    cfg = json.loads((model / "config.json").read_text())
    own = cfg if "defaults" in cfg else cfg.setdefault("diffusion_lsp", {})  # the embedded format: at the top
    own.setdefault("defaults", {}).update(defaults)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def keystrokes(text: str, positions: int, keys: int) -> list[list[tuple[str, str]]]:
    """Per position, the (prefix, suffix) after each typed character."""
    lines = text.split("\n")
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines) + 1)]
    out = []
    first = len(lines) // 3
    step = max(1, (len(lines) - first) // (positions * 2))
    i = first
    while len(out) < positions and i < len(lines) - 1:
        body = lines[i].lstrip()
        if len(body) > keys + 4:
            at = starts[i] + len(lines[i]) - len(body)
            end = starts[i] + len(lines[i])
            out.append([(text[: at + k], text[end:]) for k in range(1, keys + 1)])
        i += step
    return out


@dataclass
class Side:
    """One of the two settings compared: its engine, and what its fills took."""

    engine: Engine
    times: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)  # the fill at a new position, nothing cached
    texts: list[str] = field(default_factory=list)
    passes: int = 0
    tokens: int = 0
    rounds: int = 0
    accepted: int = 0

    def fill(self, prefix: str, suffix: str) -> None:
        t = time.perf_counter()
        r = self.engine.fill(InfillRequest(prefix=prefix, suffix=suffix, language="python"))
        self.times.append((time.perf_counter() - t) * 1000)
        self.texts.append(r.text)
        self.passes += r.passes
        self.tokens += len(r.candidates[0].token_ids) + 1 if r.candidates else 0
        self.rounds += r.rounds
        self.accepted += r.accepted

    def report(self, defaults: dict[str, object]) -> dict[str, object]:
        ordered = sorted(self.times)
        return {
            "defaults": defaults,
            "p50_ms": round(statistics.median(self.times), 1),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
            "cold_p50_ms": round(statistics.median(self.cold), 1) if self.cold else None,
            "tokens_per_pass": round(self.tokens / max(self.passes, 1), 3),
            "acceptance_length": round(self.accepted / self.rounds, 3) if self.rounds else None,
        }


def run(sides: list[Side], cases: list[list[tuple[str, str]]]) -> None:
    """Each keystroke filled by both sides in turn (so that a busy machine slows both alike)."""
    for case in cases:
        for side in sides:
            side.engine.generator.reset()  # type: ignore[attr-defined]
            t = time.perf_counter()
            side.engine.fill(InfillRequest(prefix=case[0][0][:-1], suffix=case[0][1], language="python"))
            side.cold.append((time.perf_counter() - t) * 1000)
        for prefix, suffix in case:
            for side in sides:
                side.fill(prefix, suffix)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--variant-model", type=Path, help="the variant's model directory (default: --model)")
    p.add_argument("--base", type=json.loads, default={}, help="defaults of the base run (JSON)")
    p.add_argument("--variant", type=json.loads, default={}, help="defaults of the variant run (JSON)")
    p.add_argument("--positions", type=int, default=8)
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--context-tokens", type=int, default=1024)
    p.add_argument("--canvas-tokens", type=int, default=24, help="the longest fill")
    args = p.parse_args()
    cases = keystrokes(source(), args.positions, args.keys)
    opts = FillOptions(context_tokens=args.context_tokens, canvas_tokens=args.canvas_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        base_side, var_side = (
            Side(local_engine(load_model(variant_copy(model, Path(tmp), name, d)), opts))
            for name, model, d in (
                ("base", args.model, args.base),
                ("variant", args.variant_model or args.model, args.variant),
            )
        )
        run([base_side, var_side], cases)
    base, var = base_side.texts, var_side.texts
    first = [a.split("\n")[0] == b.split("\n")[0] for a, b in zip(var, base, strict=True)]
    report = {
        "model": str(args.model),
        "variant_model": str(args.variant_model or args.model),
        "keystrokes": len(var),
        "positions": len(cases),
        "context_tokens": args.context_tokens,
        "canvas_tokens": args.canvas_tokens,
        "base": base_side.report(args.base),
        "variant": var_side.report(args.variant),
        "p50_ratio_variant_to_base": round(statistics.median(var_side.times) / statistics.median(base_side.times), 2),
        "cold_p50_ratio_variant_to_base": round(
            statistics.median(var_side.cold) / statistics.median(base_side.cold), 2
        ),
        "same_fill": round(sum(a == b for a, b in zip(var, base, strict=True)) / len(var), 3),
        "same_first_line": round(sum(first) / len(first), 3),
        "when": time.strftime("%Y-%m-%d"),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
