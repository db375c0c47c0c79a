"""diffusion-infill's model-making commands, `train`, `adapt` and `export-onnx` (they need torch,
but for export-onnx of a GGUF file: engine/export);
engine/commands/cli.py parses their arguments and imports this module only when one of them runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from engine.denoisers.loading import load_model
from engine.errors import InputError
from engine.models.directory import DEFAULT_MODEL_DIR, read_config
from engine.models.table import EXPORTED


def cmd_train(args: argparse.Namespace) -> int:
    try:
        from engine.training.pipeline import run_training
    except ImportError as exc:
        raise InputError(f"training needs torch: pip install 'diffusion-lsp[torch]' ({exc})") from exc
    if not args.recipe.is_file():
        raise InputError(f"recipe not found: {args.recipe}")
    if args.out is None and args.state is None:
        raise InputError("train needs --out (a model directory), --state (a training state), or both")
    try:
        summary = run_training(
            args.recipe,
            args.out,
            resume=args.resume,
            state_dir=args.state,
            minutes=args.minutes,
            cooldown_minutes=args.cooldown_minutes,
            threads=args.threads,
        )
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise InputError(f"recipe {args.recipe} is not valid: {exc}") from None
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    try:
        import torch

        from engine.training.adapt import AdaptConfig, adapt
    except ImportError as exc:
        raise InputError(f"adapt needs torch and transformers: pip install 'diffusion-lsp[torch]' ({exc})") from exc
    for d in args.data:
        if not d.is_dir():
            raise InputError(f"data folder not found: {d}")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [f.name for f in dataclasses.fields(AdaptConfig) if hasattr(args, f.name)]
    cfg = AdaptConfig(**{name: getattr(args, name) for name in names})
    summary = adapt(args.model, args.out, args.data, cfg)
    summary.pop("train_curve")
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from engine.export.from_gguf import export_gguf, is_gguf

    if args.model is not None and is_gguf(args.model):  # numpy, onnx and gguf: no torch
        if args.out is None:
            raise InputError("export-onnx of a GGUF file writes a new model directory: give --out")
        export_gguf(args.model, args.out, args.quantize, verbose=args.verbose)
        sys.stdout.write(f"{args.out}\n")
        return 0
    try:
        from engine.training.export import export_onnx
        from engine.training.export_lm import export_lm
    except ImportError as exc:
        raise InputError(f"export needs torch: pip install 'diffusion-lsp[torch]' ({exc})") from exc
    model = args.model or DEFAULT_MODEL_DIR  # export works on a directory: no --model is the shipped one
    if read_config(model).get("model_type") in EXPORTED:
        if args.out is None:
            raise InputError(
                f"export-onnx of a checkpoint ({', '.join(EXPORTED)}) writes a new model directory: give --out"
            )
        export_lm(model, args.out, args.quantize)
        sys.stdout.write(f"{args.out}\n")
        return 0
    loaded = load_model(model, backend="torch")
    out = args.out or loaded.path
    # graphs next to the weights read them from the safetensors file; elsewhere they embed a copy
    weights = loaded.path / "model.safetensors" if Path(out).resolve() == loaded.path.resolve() else None
    export_onnx(loaded.denoiser.model, out, weights)  # type: ignore[attr-defined]
    sys.stdout.write(f"wrote {out}/encode.onnx and {out}/denoise.onnx\n")
    return 0
