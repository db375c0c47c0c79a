"""How often a fill is right against its confidence: the reliability table, precision and
recall against a threshold, and the threshold a model directory's config.json carries.

The held-out eval (engine/evaluation/heldout.py) records each fill's confidence
(engine.candidate.Candidate.score) with its outcome; `calibrate` turns them into, per fill
kind:

- `reliability`: the fills in confidence bins (BINS), with how many were exact, exact or
  equivalent (the same program: `right`), and syntax-valid, and their mean confidence;
- `curve`: for each threshold a fill must reach to be shown, the share shown, the
  precision (right among the shown) and the recall (shown among the right);
- `threshold(curve, precision, min_recall)`: the lowest threshold whose shown fills are
  right at least `precision` of the time (the most fills shown at that precision); where
  no threshold reaches it, None (nothing is shown unasked), or, when asked for
  (`min_recall`, a choice made per model: docs/confidence.md), the highest threshold that
  still shows that share of the right fills (a useful model that is never that precise
  keeps what it gets right and loses only its surest misses).

`python -m engine.evaluation.calibration REPORT.json` prints the tables of an eval report
(`diffusion-infill eval --output REPORT.json`); `--write MODEL_DIR` writes the thresholds
of single-line fills and of multi-line ones (`WRITTEN`) into that directory's config.json
(`defaults` for a model of the embedded architecture, `diffusion_lsp.defaults` for a
transformers-style one), where the language server's `minConfidence: auto` reads them.
docs/confidence.md describes the whole.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BINS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # reliability bins' edges
DEFAULT_PRECISION = 2 / 3  # of shown fills right (exact or equivalent): at most a third are ones a person rejects
ROUNDING = 5e-5  # the curve's shares are rounded to 4 decimals
# the kinds whose thresholds config.json carries: fills of one line (most of those shown
# unasked) and of several (block bodies, random spans, function bodies together)
WRITTEN = {"single_line": "min_confidence", "multi_line": "min_confidence_multiline"}
NEVER = 1.01  # a threshold no confidence reaches: the Automatic trigger shows nothing


@dataclass(frozen=True)
class Scored:
    """One fill of the eval: its confidence (None: the source gave none) and its outcome."""

    score: float | None
    exact: bool
    right: bool  # exact, or the same program (engine.evaluation.heldout.equivalent)
    valid: bool | None  # parses no worse than the file as written; None: no grammar
    mean_logprob: float | None = None  # the fill's mean log-probability per token (compared in docs/confidence.md)
    fill: str = ""  # its text, for reading the report


def reliability(fills: Sequence[Scored], bins: Sequence[float] = BINS) -> list[dict[str, Any]]:
    """One row per confidence bin [lo, hi) (the last holds 1.0): fills, their mean
    confidence, and the shares exact, right and valid (None for an empty bin)."""
    rows = []
    for lo, hi in zip(bins[:-1], bins[1:], strict=True):
        last = hi == bins[-1]
        inside = [f for f in fills if f.score is not None and lo <= f.score and (f.score < hi or last)]
        rows.append({"from": lo, "to": hi, "fills": len(inside), **_shares(inside)})
    return rows


def _shares(fills: Sequence[Scored]) -> dict[str, float | None]:
    n = len(fills)
    checked = [f.valid for f in fills if f.valid is not None]
    return {
        "mean_confidence": round(sum(f.score or 0.0 for f in fills) / n, 4) if n else None,
        "exact": round(sum(f.exact for f in fills) / n, 4) if n else None,
        "right": round(sum(f.right for f in fills) / n, 4) if n else None,
        "valid": round(sum(bool(v) for v in checked) / len(checked), 4) if checked else None,
    }


def curve(fills: Sequence[Scored]) -> list[dict[str, Any]]:
    """Precision and recall of showing only fills whose confidence reaches each threshold:
    one row per distinct confidence (ascending), then NEVER (nothing shown). A fill without
    a confidence is always shown (as the server shows it)."""
    right_total = sum(f.right for f in fills)
    scores = sorted({f.score for f in fills if f.score is not None})
    rows = []
    for t in [*scores, NEVER]:
        shown = [f for f in fills if f.score is None or f.score >= t]
        hits = sum(f.right for f in shown)
        rows.append(
            {
                "threshold": t,
                "shown": round(len(shown) / len(fills), 4) if fills else 0.0,
                "precision": round(hits / len(shown), 4) if shown else None,
                "recall": round(hits / right_total, 4) if right_total else None,
            }
        )
    return rows


def threshold(rows: Sequence[dict[str, Any]], precision: float, min_recall: float | None = None) -> float | None:
    """The lowest threshold of `curve`'s rows whose shown fills are right at least
    `precision` of the time (the most fills shown at that precision); where none is, the
    highest whose shown fills hold at least `min_recall` of the right ones; else None."""
    for row in rows:
        if row["precision"] is not None and row["precision"] >= precision - ROUNDING:
            return float(row["threshold"])
    if min_recall is None:
        return None
    keeping = [r for r in rows if r["recall"] is not None and r["recall"] >= min_recall - ROUNDING]
    return float(keeping[-1]["threshold"]) if keeping else None


def calibrate(
    by_kind: Mapping[str, Sequence[Scored]],
    precision: float = DEFAULT_PRECISION,
    min_recall: float | None = None,
) -> dict[str, Any]:
    """Per kind: the reliability table, the curve, and the threshold for `precision`
    (else `min_recall`), with what it shows and keeps (the curve's row at it)."""
    out: dict[str, Any] = {"target_precision": precision, "min_recall": min_recall}
    for kind, fills in by_kind.items():
        rows = curve(fills)
        t = threshold(rows, precision, min_recall)
        at = next((r for r in rows if r["threshold"] == t), None)
        out[kind] = {
            "fills": len(fills),
            **_shares(fills),
            "reliability": reliability(fills),
            "curve": rows,
            "threshold": t,
            "at_threshold": at,
        }
    return out


def _cell(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def reliability_markdown(cal: dict[str, Any], kind: str) -> str:
    """The reliability table of one kind as Markdown."""
    lines = [
        "| confidence | fills | mean confidence | exact | exact or equivalent | valid |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in cal[kind]["reliability"]:
        if row["fills"]:
            lines.append(
                f"| {row['from']:.1f}–{row['to']:.1f} | {row['fills']} | {_cell(row['mean_confidence'], '.2f')} "
                f"| {_cell(row['exact'], '.0%')} | {_cell(row['right'], '.0%')} | {_cell(row['valid'], '.0%')} |"
            )
    return "\n".join(lines) + "\n"


def curve_markdown(cal: dict[str, Any], kind: str, thresholds: Sequence[float]) -> str:
    """Precision and recall at chosen thresholds (the curve's row at or just above each)."""
    rows = cal[kind]["curve"]
    lines = ["| min confidence | shown | precision | recall |", "|---:|---:|---:|---:|"]
    for t in thresholds:
        row = next((r for r in rows if r["threshold"] >= t), rows[-1])
        lines.append(
            f"| {t:g} | {row['shown']:.0%} | {_cell(row['precision'], '.0%')} | {_cell(row['recall'], '.0%')} |"
        )
    return "\n".join(lines) + "\n"


def write_threshold(model_dir: Path, value: float, source: dict[str, Any], key: str = "min_confidence") -> Path:
    """Write `value` as the directory's calibrated threshold `key` (`min_confidence`, or
    `min_confidence_multiline`), and where it came from (`<key>_source`), into its
    config.json; returns the file."""
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    embedded = "diffusion_lsp" not in cfg and cfg.get("model_type") == "diffusion_coder"
    own = cfg if embedded else cfg.setdefault("diffusion_lsp", {})
    defaults = own.setdefault("defaults", {})
    defaults[key] = math.floor(value * 1e4) / 1e4  # rounded down: the fill it was chosen at stays shown
    defaults[f"{key}_source"] = source
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _source(cal: dict[str, Any], kind: str) -> dict[str, Any]:
    """Where a written threshold came from: the kind, the targets, and what it shows and keeps."""
    at = cal[kind]["at_threshold"] or {}
    return {
        "kind": kind,
        "target_precision": round(cal["target_precision"], 4),
        "min_recall": cal["min_recall"],
        "fills": cal[kind]["fills"],
        **{k: at.get(k) for k in ("precision", "recall", "shown")},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.evaluation.calibration", description=__doc__)
    parser.add_argument("report", type=Path, help="an eval report (diffusion-infill eval --output)")
    parser.add_argument("--precision", type=float, default=DEFAULT_PRECISION, help="target precision (2/3)")
    parser.add_argument(
        "--min-recall",
        type=float,
        help="where the precision is out of reach: the share of right fills to keep showing (default: show none)",
    )
    parser.add_argument("--write", type=Path, metavar="MODEL_DIR", help="write the thresholds into its config.json")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    fills = {k: [Scored(**f) for f in v] for k, v in report.get("fills", {}).items()}
    if "single_line" not in fills:
        sys.stderr.write(
            f"{args.report}: no single-line fills with their confidence (an eval report of an older version?)\n"
        )
        return 1
    cal = calibrate(fills, args.precision, args.min_recall)
    for kind in fills:
        sys.stdout.write(f"\n{kind}: threshold {cal[kind]['threshold']}\n\n" + reliability_markdown(cal, kind))
        sys.stdout.write("\n" + curve_markdown(cal, kind, (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)))
    if args.write:
        for kind, key in WRITTEN.items():
            if kind in cal:
                t = cal[kind]["threshold"]
                value = NEVER if t is None else t
                source = {**_source(cal, kind), "data": report.get("data"), "seed": report.get("seed")}
                path = write_threshold(args.write, value, source, key)
                sys.stdout.write(f"\nwrote {key} {value} to {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
