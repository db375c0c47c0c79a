"""Sampler sweep: exact match and steps per fill for each strategy and setting on held-out
code, to choose the shipped defaults. Prints JSON.

    python bench/sampler_sweep.py [--model DIR] [--tasks N] [--context-tokens N] [--data DIR] [--only NAME...]

Held-out data: the standard library's email package by default (never trained on), or
--data (e.g. corpus/heldout).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

from engine.decoding import SamplerConfig
from engine.denoisers.loading import load_model
from engine.evaluation.heldout import evaluate_dir
from engine.local.generator import LocalGenerator, local_engine
from engine.models.directory import DEFAULT_MODEL_DIR

SETTINGS: dict[str, dict[str, object]] = {
    "left_to_right": {"strategy": "left_to_right"},
    "autoregressive": {"strategy": "autoregressive"},
    "entropy_bound_0.5": {"strategy": "entropy_bound", "entropy_bound": 0.5},
    "entropy_bound_2": {"strategy": "entropy_bound", "entropy_bound": 2.0},
    "entropy_bound_1": {"strategy": "entropy_bound", "entropy_bound": 1.0},
    "entropy_bound_4": {"strategy": "entropy_bound", "entropy_bound": 4.0},
    "entropy_bound_8": {"strategy": "entropy_bound", "entropy_bound": 8.0},
    "entropy_bound_16": {"strategy": "entropy_bound", "entropy_bound": 16.0},
    "confidence_0.7": {"strategy": "confidence", "confidence_threshold": 0.7},
    "fixed_k_2": {"strategy": "fixed_k", "k": 2},
    "fixed_k_4": {"strategy": "fixed_k", "k": 4},
    "fixed_k_8": {"strategy": "fixed_k", "k": 8},
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--context-tokens", type=int, default=None)
    p.add_argument("--only", nargs="*", help="names of settings to run")
    p.add_argument("--drafter", choices=["on", "off"], default="on")
    p.add_argument("--data", type=Path, default=Path(sysconfig.get_paths()["stdlib"]) / "email")
    args = p.parse_args()
    data = args.data
    engine = local_engine(load_model(args.model))
    gen = engine.generator
    assert isinstance(gen, LocalGenerator)
    if args.context_tokens:
        gen.defaults = {**gen.defaults, "context_tokens": args.context_tokens}
    out: dict[str, object] = {"model": str(args.model), "data": str(data), "drafter": args.drafter}
    for name, changes in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        cfg = replace(SamplerConfig(max_steps=32), **changes)  # type: ignore[arg-type]
        out[name] = evaluate_dir(
            engine, data, tasks=args.tasks, sampler=cfg, use_drafter=args.drafter == "on", baseline=False, functions=0
        )
        sys.stderr.write(f"{name}: {json.dumps(out[name])}\n")
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
