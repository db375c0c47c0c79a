"""What stopping a fill that repeats the suffix saves (engine/local/echo.py): at the
server benchmark's cursor positions (line ends from the first third of a held-out file
on, bench/server_bench.py), each position filled with the stop and without it,
alternately, in one run. Prints JSON; never asserted.

    python bench/echo_stop.py --model DIR [--positions N] [--context-tokens T]

Reports the p50 and total fill time of each, how many fills each left empty, and how
many of the fills are the same text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_bench import source  # noqa: E402

from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local import generator  # noqa: E402


class NoEcho:
    """The loop without the stop."""

    def __init__(self, *args: object) -> None:
        pass

    def __call__(self, row: object) -> None:
        return None


def positions(text: str, n: int) -> list[int]:
    """Offsets of the server benchmark's cursor positions (line ends)."""
    lines = text.split("\n")
    first = len(lines) // 3
    step = max(1, (len(lines) - first - 10) // n)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    return [starts[first + 5 + i * step] + len(lines[first + 5 + i * step]) for i in range(n)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--positions", type=int, default=8)
    p.add_argument("--context-tokens", type=int, default=1024)
    args = p.parse_args()
    text = source()
    engine = generator.local_engine(load_model(args.model), FillOptions(context_tokens=args.context_tokens))
    runs: dict[str, list[tuple[float, str]]] = {"stop": [], "no_stop": []}
    for at in positions(text, args.positions):
        req = InfillRequest(prefix=text[:at], suffix=text[at:], language="python")
        for name in ("no_stop", "stop"):
            engine.reset()
            with mock.patch.object(generator, "Echo", generator.Echo if name == "stop" else NoEcho):
                t = time.perf_counter()
                r = engine.fill(req)
                runs[name].append(((time.perf_counter() - t) * 1000, r.text))
    report: dict[str, object] = {"model": str(args.model), "positions": args.positions}
    for name, got in runs.items():
        ms = [t for t, _ in got]
        report[name] = {
            "p50_ms": round(statistics.median(ms), 1),
            "total_s": round(sum(ms) / 1000, 1),
            "empty": sum(not x for _, x in got),
        }
    report["p50_ratio_stop_to_no_stop"] = round(report["stop"]["p50_ms"] / report["no_stop"]["p50_ms"], 2)  # type: ignore[index]
    report["same_text"] = sum(a == b for (_, a), (_, b) in zip(runs["stop"], runs["no_stop"], strict=True))
    report["when"] = time.strftime("%Y-%m-%d")
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
