"""What converting a GGUF file for the base install costs: `diffusion-infill export-onnx
--model FILE.gguf` run a few times, each in its own process, timed (wall clock) with its
peak resident memory (the process's own, from wait4). `--python` runs it with another
environment's interpreter: a virtual environment with only `pip install .` shows that no
torch is needed (the JSON says whether torch was importable there). Prints JSON.

    python bench/gguf_export.py --gguf .weights-cache/qwen2.5-coder-0.5b-instruct.gguf [--runs 3] [--python VENV/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPORT = "import sys; from engine.commands.cli import main; sys.exit(main(sys.argv[1:]))"


def run_once(python: str, gguf: Path, quantize: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gguf-export-") as tmp:
        argv = [python, "-c", EXPORT, "export-onnx", "--model", str(gguf), "--out", tmp, "--quantize", quantize]
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err = child.stderr.read().decode() if child.stderr else ""
            raise SystemExit(f"export-onnx failed ({child.returncode}): {err.strip()}")
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
    return {
        "seconds": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1e3, 1),
        "output_mb": round(size / 1e6, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quantize", default="int8", choices=("int8", "int4", "none"))
    p.add_argument("--python", default=sys.executable, help="the interpreter of the environment to run it in")
    args = p.parse_args()
    probe = "import importlib.util as u; print(u.find_spec('torch') is not None)"
    torch = subprocess.run([args.python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    runs = [run_once(args.python, args.gguf, args.quantize) for _ in range(args.runs)]
    report = {
        "gguf": str(args.gguf),
        "gguf_mb": round(args.gguf.stat().st_size / 1e6, 1),
        "quantize": args.quantize,
        "python": args.python,
        "torch_importable": torch == "True",
        "runs": runs,
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "when": time.strftime("%Y-%m-%d"),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
