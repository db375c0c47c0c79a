"""diffusion-infill's measuring commands, `bench` and `eval`; engine/commands/cli.py parses their
arguments and imports this module only when one of them runs (the engine the arguments name
comes from engine/commands/engine_args.py, not from the command line's module)."""

from __future__ import annotations

import argparse
import json
import sys

from engine.commands.engine_args import engine_from_args, sampler_from_args
from engine.denoisers.loading import load_model
from engine.errors import InputError


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.evaluation.benchmark import run_benchmark

    report = run_benchmark(
        load_model(args.model, backend=args.backend, device=args.device, quantization=args.quantization),
        repeats=args.repeats,
        strategy=args.strategy,
    )
    text = json.dumps(report, indent=None if args.json else 2)
    sys.stdout.write(text + "\n")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.evaluation.heldout import KINDS, evaluate_dir, markdown_table

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else KINDS
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise InputError(f"--kinds: unknown {', '.join(unknown) or 'none given'}; choose from {', '.join(KINDS)}")

    engine = engine_from_args(args)
    report = evaluate_dir(
        engine,
        args.data,
        tasks=args.tasks,
        seed=args.seed or 0,
        sampler=sampler_from_args(args, engine),
        use_drafter=None if args.drafter is None else args.drafter == "on",
        fit_canvas=None if args.fit_canvas is None else args.fit_canvas == "on",
        canvas_tokens=args.canvas_tokens,
        context_tokens=args.context_tokens,
        baseline=args.baseline,
        functions=args.functions,
        timeout=args.timeout,
        kinds=kinds,
    )
    text = json.dumps(report, indent=2) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    sys.stdout.write(markdown_table(report) if args.table else text)
    return 0
