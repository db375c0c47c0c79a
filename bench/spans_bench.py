"""Spans benchmark: span selection plus validation of 3 candidates on a 5,000-line file
after a one-character edit (incremental parse). Prints JSON; never asserted in tests.

    python bench/spans_bench.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from engine.spans import Document, language_for, select_span, validate_fill

LINES = 5000
CANDIDATES = ["len(items) + 1", "self._value(key)", "foo(a, b))"]  # ok, ok, truncated


def source() -> str:
    """At least LINES lines of real Python (the standard library), cut at LINES lines."""
    text = ""
    for path in sorted((Path(sysconfig.get_paths()["stdlib"]) / "email").glob("*.py")):
        text += path.read_text(encoding="utf-8")
        if text.count("\n") >= LINES:
            break
    return "\n".join(text.split("\n")[:LINES]) + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    text = source()
    lang = language_for("python")
    # the cursor: a new line being typed in a function body in the middle of the file
    anchor = text.index("\n        return ", len(text) // 2) + 1
    text = text[:anchor] + "        result = \n" + text[anchor:]
    text = "\n".join(text.split("\n")[:LINES]) + "\n"
    cursor = anchor + len("        result = ")
    t0 = time.perf_counter()
    doc = Document(text, lang, version=0)
    full_parse_ms = (time.perf_counter() - t0) * 1000
    times, parse_times = [], []
    for i in range(args.repeats):
        # one typed character, then the next request deletes it again
        new = text[:cursor] + "x" + text[cursor:] if i % 2 == 0 else text
        at = cursor + 1 if i % 2 == 0 else cursor
        t0 = time.perf_counter()
        doc.update(new, i + 1)
        t1 = time.perf_counter()
        span = select_span(doc.text, at, lang, doc.tree)
        verdicts = [validate_fill(doc, at, fill) for fill in CANDIDATES]
        t2 = time.perf_counter()
        times.append((t2 - t0) * 1000)
        parse_times.append((t1 - t0) * 1000)
    report = {
        "lines": doc.text.count("\n"),
        "span": {"kind": span.kind, "multiline": span.multiline},
        "verdicts": [v.status for v in verdicts],
        "full_parse_ms": round(full_parse_ms, 2),
        "edit_select_validate3": {
            "p50_ms": round(statistics.median(times), 3),
            "p95_ms": round(sorted(times)[int(0.95 * (len(times) - 1))], 3),
        },
        "incremental_parse_p50_ms": round(statistics.median(parse_times), 3),
        "repeats": args.repeats,
        "machine": f"{platform.machine()} cpus={len(__import__('os').sched_getaffinity(0))}",
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
