"""Engine benchmark on the CPU: cold and warm fill latency, steps vs the one-token
baseline, the drafter's effect, peak RSS. Prints JSON; never asserted in tests.

    python bench/engine_bench.py [--model DIR] [--repeats N] [--backend onnx|torch]

Same as `diffusion-infill bench --json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.denoisers.loading import load_model
from engine.evaluation.benchmark import run_benchmark
from engine.models.directory import DEFAULT_MODEL_DIR


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--backend", default="auto")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    report = run_benchmark(load_model(args.model, backend=args.backend), repeats=args.repeats)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
