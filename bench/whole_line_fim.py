"""Whole-line fill-in-the-middle tasks, the usual FIM benchmark form: the middle is one
whole line of a Python file with its line break, the prefix ends with the line break before
it and the suffix starts with the next line, which is not blank. Runs them through
`diffusion-infill batch` and prints JSON: how many middles came back empty, with and
without `"language": "python"`. Never asserted in tests.

    python bench/whole_line_fim.py [--tasks N] [--seed S] [--no-plain] [--root DIR] [-- batch options]

`--root`: run the engine of another checkout (a `git archive` of a commit, say) with this
environment, to compare commits on the same tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_CHARS = 40_000  # files past this are skipped (the engine trims the context anyway)
MAX_LINE_CHARS = 120  # a middle longer than this is not a single-line task


def sources() -> list[Path]:
    """Python files of the fixtures and of the standard library (top level and email/,
    json/, http/), in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in ROOT.glob("fixtures/**/*.py") if "typing" not in p.parts)  # typing/: held out
    for sub in ("", "email", "json", "http"):
        paths += sorted((stdlib / sub).glob("*.py"))
    return paths


def tasks(n: int, seed: int) -> list[dict[str, str]]:
    """`n` tasks, at most 2 per file, cut at random non-blank lines followed by a
    non-blank line."""
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    files = sources()
    rng.shuffle(files)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > MAX_FILE_CHARS:
            continue
        lines = text.splitlines(keepends=True)
        spots = [
            i
            for i in range(1, len(lines) - 1)
            if lines[i].strip() and lines[i + 1].strip() and len(lines[i]) <= MAX_LINE_CHARS
        ]
        for i in rng.sample(spots, min(2, len(spots))):
            prefix, middle, suffix = "".join(lines[:i]), lines[i], "".join(lines[i + 1 :])
            out.append({"id": f"{path.name}:{i + 1}", "prefix": prefix, "suffix": suffix, "middle": middle})
        if len(out) >= n:
            break
    return out[:n]


def run_batch(
    items: list[dict[str, str]], language: str | None, extra: list[str], root: Path
) -> tuple[list[str], float]:
    """The middles `diffusion-infill batch` returns, in task order, and the seconds it took."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        with src.open("w", encoding="utf-8") as f:
            for t in items:
                row = {"id": t["id"], "prefix": t["prefix"], "suffix": t["suffix"]}
                if language:
                    row["language"] = language
                f.write(json.dumps(row) + "\n")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-c", "import sys; from engine.commands.cli import main; sys.exit(main())"]
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run(
            [*cmd, "batch", "--input", str(src), "--output", str(dst), *extra], check=True, cwd=root, env=env
        )
        took = time.perf_counter() - t0
        got = {r["id"]: r.get("middle", "") for r in map(json.loads, dst.read_text(encoding="utf-8").splitlines())}
    return [got.get(t["id"], "") for t in items], took


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plain", action="store_true", help="skip the run without a language")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose engine runs")
    p.add_argument("--show", type=int, default=0, help="print this many empty tasks to stderr")
    p.add_argument("batch", nargs="*", help="options passed to diffusion-infill batch")
    args = p.parse_args()
    items = tasks(args.tasks, args.seed)
    report: dict[str, object] = {"tasks": len(items), "seed": args.seed}
    for language in ["python"] if args.no_plain else ["python", None]:
        middles, took = run_batch(items, language, args.batch, args.root.resolve())
        empty = [t for t, m in zip(items, middles, strict=True) if not m.strip()]
        ends = sum(m.endswith(("\n", "\r")) for m in middles if m.strip())
        exact = sum(m.strip() == t["middle"].strip() for t, m in zip(items, middles, strict=True))
        report[language or "no_language"] = {
            "empty": len(empty),
            "empty_share": round(len(empty) / max(1, len(items)), 3),
            "non_empty_ending_in_line_break": ends,
            "exact_match": exact,
            "seconds": round(took, 1),
        }
        for t in empty[: args.show]:
            sys.stderr.write(f"--- {language} {t['id']}: {t['middle']!r}\n")
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
