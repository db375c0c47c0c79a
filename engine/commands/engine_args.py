"""The engine a command's arguments ask for: its source (engine.opener's policy, the same as
the language server's), its options and its sampler. Shared by the runtime commands
(engine/commands/cli.py) and the measuring ones (engine/evaluation/cli.py), which thus do
not import the command line itself."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from typing import Any

from engine.decoding import SamplerConfig

log = logging.getLogger("diffusion_infill")


def sampler_from_args(args: argparse.Namespace, engine: Any) -> SamplerConfig | None:
    """The whole sampler the arguments ask for, over the model's default for a single
    line, or None: the model's defaults for each span (what `options_from_args` gives)."""
    changes: dict[str, Any] = {}
    if args.strategy:
        changes["strategy"] = args.strategy
    if args.steps is not None:
        changes["max_steps"] = args.steps
    return replace(engine.generator.default_sampler(), **changes) if changes else None


def options_from_args(args: argparse.Namespace) -> Any:
    """The engine's budgets and sampling from the arguments (None: the model's)."""
    from engine.fill import FillOptions

    return FillOptions(
        canvas_tokens=args.canvas_tokens,
        context_tokens=args.context_tokens,
        strategy=args.strategy,
        max_steps=args.steps,
        seed=args.seed,
        use_drafter=None if args.drafter is None else args.drafter == "on",
        fit_canvas=None if args.fit_canvas is None else args.fit_canvas == "on",
        middle_priming=None if args.middle_priming is None else args.middle_priming == "on",
    )


def engine_source(args: argparse.Namespace) -> Any:
    """Where the arguments say fills come from (engine.opener: the same policy as the
    language server's: --model, else the models folder's best here, else the shipped model)."""
    from engine.opener import EngineSource

    return EngineSource(model=args.model, backend=args.backend, device=args.device, quantization=args.quantization)


def engine_from_args(args: argparse.Namespace) -> Any:
    """The engine the arguments name (`engine_source`), with their options."""
    from engine.opener import open_engine

    opened = open_engine(engine_source(args), options_from_args(args))
    log.info("fills from %s", opened.where)
    return opened.engine
