"""diffusion-infill: the engine's command line: the parser and the runtime commands.

`fill` and `batch` run here, on the runtime alone. The measuring and model-making commands
live beside the code they drive and are imported only when they run, so that a fill loads
nothing of training or evaluation (tests/engine/test_cli.py checks):

    bench, eval          engine/evaluation/cli.py
    train, export-onnx   engine/training/cli.py (they need torch; export-onnx of a GGUF file
                         does not: engine/export/)
    adapt                engine/training/adapt.py (torch, transformers)
    pull                 engine/commands/pull.py (huggingface_hub; the only command that downloads)
    convert-gguf         engine/commands/convert.py (torch, transformers, gguf)
    serve                fill_server/ (the `serve` extra: starlette, uvicorn)

Errors a user can cause (missing files, a bad model directory, bad input) print one line
on stderr and exit with status 2; never a traceback (`-v` shows one for internal errors).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from engine.commands.engine_args import engine_from_args, engine_source
from engine.decoding import STRATEGIES
from engine.errors import EngineError, InputError
from engine.models.directory import DEFAULT_MODEL_DIR
from engine.models.folder import DEFAULT_DEADLINE_MS
from engine.models.table import (
    AUTOREGRESSIVE_MODEL_TYPES,
    BACKENDS,
    EXPORTED,
    GGUF_ARCHITECTURES,
    PULLED,
    QUANTIZATIONS,
    kinds,
    quantized_rows,
)
from engine.spans import language_for
from fill_server.config import DEFAULT_HOST, DEFAULT_MAX_BODY, DEFAULT_PORT, DEFAULT_QUEUE

log = logging.getLogger("diffusion_infill")
EXIT_USAGE = 2


def read_text(path: Path, what: str) -> str:
    """A text file as str; invalid UTF-8 is replaced (and said so), never fatal."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory: {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("%s %s is not valid UTF-8; undecodable bytes were replaced with U+FFFD", what, path)
        return raw.decode("utf-8", errors="replace")


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")


def split_at(text: str, line: int, col: int) -> tuple[str, str]:
    """Split at a 1-based line and column, as editors count them: lines end at \\n, \\r\\n
    or \\r only (not at form feeds or Unicode separators); columns count characters."""
    lines = [m.group(0) for m in _LINE.finditer(text) if m.group(0)] or [""]
    if text.endswith(("\n", "\r")):
        lines.append("")
    if not 1 <= line <= len(lines):
        raise InputError(f"line {line} is outside the file (1..{len(lines)})")
    body = lines[line - 1].rstrip("\r\n")
    if not 1 <= col <= len(body) + 1:
        raise InputError(f"column {col} is outside line {line} (1..{len(body) + 1})")
    offset = sum(len(x) for x in lines[: line - 1]) + col - 1
    return text[:offset], text[offset:]


def _request(args: argparse.Namespace, prefix: str, suffix: str, language: str | None) -> Any:
    from engine.fill import InfillRequest

    return InfillRequest(
        prefix=prefix,
        suffix=suffix,
        language=language,
        candidates=getattr(args, "candidates", 1),
        retry_candidates=getattr(args, "retry_candidates", 0),
    )


def result_json(result: Any, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "middle": result.text,
        "candidates": [
            {
                "text": c.text,
                "syntax": c.syntax,
                "mean_confidence": round(c.mean_confidence, 4),
                "token_confidence": [round(x, 4) for x in c.confidence],
            }
            for c in result.candidates
        ],
        "steps": result.steps,
        "passes": result.passes,
        "rounds": result.rounds,
        "accepted": result.accepted,
        "canvas_tokens": result.canvas_tokens,
        "fitted_tokens": result.fitted_tokens,
        "stop_reason": result.stop_reason,
        "encode_ms": round(result.encode_ms, 2),
        "denoise_ms": round(result.denoise_ms, 2),
        "total_ms": round(result.total_ms, 2),
        "context_tokens": result.context_tokens,
        "drafted": result.drafted,
        "warnings": result.warnings,
    }


def cmd_fill(args: argparse.Namespace) -> int:
    if args.file:
        if args.line is None or args.col is None:
            raise InputError("--file needs --line and --col")
        prefix, suffix = split_at(read_text(args.file, "file"), args.line, args.col)
    elif args.prefix_file:
        prefix = read_text(args.prefix_file, "prefix file")
        suffix = read_text(args.suffix_file, "suffix file") if args.suffix_file else ""
    else:
        raise InputError("give --file F --line L --col C, or --prefix-file (and --suffix-file)")
    language = args.language
    if language is None and args.file:  # from the extension, for syntax checks
        found = language_for(path=str(args.file))
        language = found.name if found.grammar else None
    engine = engine_from_args(args)
    result = engine.fill(_request(args, prefix, suffix, language))
    if args.json:
        json.dump(result_json(result), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.text)
        if not result.text.endswith("\n"):
            sys.stdout.write("\n")
    return 0


def _jsonl(stream: BinaryIO, name: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines as text; invalid UTF-8 is replaced, with a warning naming the line."""
    for n, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("%s line %d is not valid UTF-8; undecodable bytes were replaced with U+FFFD", name, n)
            line = raw.decode("utf-8", errors="replace")
        if line.strip():
            yield n, line


def _open(path: Path, mode: str, what: str) -> Any:
    try:
        return open(path, mode)  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise InputError(f"cannot open {what} {path}: {exc.strerror}") from None


def _batch_item(line: str) -> dict[str, Any]:
    item = json.loads(line)
    if not isinstance(item, dict) or not isinstance(item.get("prefix"), str):
        raise InputError("each line needs an object with a string 'prefix'")
    if not isinstance(item.get("suffix", ""), str):
        raise InputError("'suffix' must be a string")
    return item


def cmd_batch(args: argparse.Namespace) -> int:
    """One result line per input line, in order; a bad line gets an error line and the
    batch goes on. Exit status 1 when any line failed."""
    src: BinaryIO = _open(args.input, "rb", "batch input") if args.input else sys.stdin.buffer
    dst: TextIO = _open(args.output, "w", "batch output") if args.output else sys.stdout
    failures = 0
    try:
        engine = engine_from_args(args)
        for n, line in _jsonl(src, str(args.input or "stdin")):
            item: dict[str, Any] = {}
            try:
                item = _batch_item(line)
                result = engine.fill(_request(args, item["prefix"], item.get("suffix", ""), item.get("language")))
                out = result_json(result, id=item.get("id", n))
            except Exception as exc:  # one bad request must not lose the rest of the batch
                failures += 1
                reason = (
                    str(exc) if isinstance(exc, (InputError, json.JSONDecodeError)) else f"{type(exc).__name__}: {exc}"
                )
                out = {"id": item.get("id", n), "error": f"line {n}: {reason}"}
                log.warning("line %d skipped: %s", n, reason)
            dst.write(json.dumps(out) + "\n")
            dst.flush()
    finally:
        if args.input:
            src.close()
        if args.output:
            dst.close()
    return 1 if failures else 0


SERVE_EXTRA = "pip install 'diffusion-lsp[serve]'"


def cmd_serve(args: argparse.Namespace) -> int:
    """The engine behind OpenAI-compatible HTTP (fill_server/, docs/serve.md); the model
    loads on the server's worker once it listens."""
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(f"serve needs {' and '.join(missing)}, which the base install leaves out: {SERVE_EXTRA}")
    from fill_server.config import ServeConfig
    from fill_server.main import serve

    fs = logging.getLogger("fill_server")
    fs.handlers, fs.propagate = list(logging.getLogger("engine").handlers), False
    fs.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    from engine.opener import model_choice

    path, _ = model_choice(engine_source(args))
    shipped = path is None or path.resolve() == DEFAULT_MODEL_DIR.resolve()
    config = ServeConfig(
        host=args.host,
        port=args.port,
        model_name=args.served_model_name or ("diffusion-lsp" if shipped or path is None else path.name),
        api_key_env=args.api_key_env,
        insecure_no_key=args.insecure_no_key,
        queue_size=args.queue_size,
        max_body_bytes=args.max_body_bytes,
        allow_unknown_fields=args.allow_unknown_fields,
    )
    return serve(config, lambda: engine_from_args(args), args.verbose)


def setup_logging(verbose: bool) -> None:
    """Warnings (and with -v, debug messages) on stderr: stdout carries only results."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("diffusion-infill: %(levelname)s: %(message)s"))
    for name in ("engine", "diffusion_infill"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
        logger.propagate = False


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command `name` of `module`, imported only when it runs."""

    def run(args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
        return command(args)

    return run


MAX_CANDIDATES = 16  # a batch of B canvases costs B times the memory of one
RETRY_CANDIDATES = 16  # fill and batch: sampled candidates when the check leaves no fill (bench/whole_line_fim.py: 8 left 12 of 200 empty, 16 left 8)


def _int_in(lo: int, hi: int | None = None) -> Any:
    """argparse type: an integer in [lo, hi], with a message that names the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"{value} is not in {lo}..{hi}" if hi is not None else f"{value} is below {lo}"
            )
        return value

    return parse


def _device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu, cuda, cuda:N or mps")
    return text


def _add_serve(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The `serve` command's arguments (fill_server/, docs/serve.md)."""
    sv = sub.add_parser(
        "serve",
        parents=parents,
        help="serve fills over OpenAI-compatible HTTP (needs the serve extra; docs/serve.md)",
        description="Serve the engine over HTTP: POST /v1/completions (prompt + suffix), /v1/fim/completions, "
        "/infill (llama.cpp's form); GET /v1/models, /health, /metrics. Binds loopback unless told otherwise.",
    )
    sv.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this machine only)"
    )
    sv.add_argument("--port", type=_int_in(0, 65535), default=DEFAULT_PORT, help="port (0: any free port)")
    sv.add_argument("--api-key-env", metavar="NAME", help="require the API key held in this environment variable")
    sv.add_argument(
        "--insecure-no-key",
        action="store_true",
        help="allow a non-loopback --host without an API key (anyone who reaches it can use the model)",
    )
    sv.add_argument("--served-model-name", help="the model's name in replies and /v1/models")
    sv.add_argument(
        "--queue-size",
        type=_int_in(1, 4096),
        default=DEFAULT_QUEUE,
        help="fills that may wait for the model; more get 429",
    )
    sv.add_argument(
        "--max-body-bytes", type=_int_in(1024), default=DEFAULT_MAX_BODY, help="largest request body in bytes"
    )
    sv.add_argument(
        "--allow-unknown-fields",
        action="store_true",
        help="ignore request fields this server does not know, instead of answering 400",
    )
    sv.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--model",
        type=Path,
        help="model directory (default: the models folder's best model measured on this machine, "
        "as the language server picks it, else the shipped model)",
    )
    common.add_argument(
        "--backend", choices=BACKENDS, default="auto", help=f"auto: the one that loads the checkpoint; {kinds()}"
    )
    common.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, cuda:N or mps (Apple's GPU)")
    common.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help=f"int8 or 4bit weights for these checkpoints: {kinds(quantized_rows(), False)} "
        "(the memory needed is checked before loading)",
    )
    common.add_argument("-v", "--verbose", action="store_true")

    gen = argparse.ArgumentParser(add_help=False)
    gen.add_argument(
        "--canvas-tokens",
        type=int,
        help="longest fill in tokens (default: the span's budget with --language, else the model's); "
        "a model with a length head sizes the canvas within it",
    )
    gen.add_argument(
        "--fit-canvas",
        choices=["on", "off"],
        help="size the canvas by the model's length head (default: on when it has one)",
    )
    gen.add_argument("--context-tokens", type=int, help="context budget in tokens")
    gen.add_argument("--strategy", choices=STRATEGIES)
    gen.add_argument("--steps", type=_int_in(1, 1024), help="maximum denoising steps")
    gen.add_argument("--seed", type=_int_in(0), default=0)
    gen.add_argument(
        "--drafter",
        choices=["on", "off"],
        help="start the canvas from tokens copied out of the context (default: the model's setting)",
    )
    gen.add_argument(
        "--middle-priming",
        choices=["on", "off"],
        help=(
            "give the cursor's line as the fill's start, its last word healed (one token at a time, in the"
            " prefix-suffix-middle order; default: the model's setting, on)"
        ),
    )

    retry = argparse.ArgumentParser(add_help=False)
    retry.add_argument(
        "--retry-candidates",
        type=_int_in(0, MAX_CANDIDATES),
        default=RETRY_CANDIDATES,
        help=f"when the syntax check leaves no fill, sample this many more once (default {RETRY_CANDIDATES}; 0: never)",
    )

    p = argparse.ArgumentParser(prog="diffusion-infill", description="Code infill with a diffusion language model.")
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fill", parents=[common, gen, retry], help="fill at a position and print the fill")
    f.add_argument("--file", type=Path)
    f.add_argument("--line", type=_int_in(1), help="1-based line of the cursor")
    f.add_argument("--col", type=_int_in(1), help="1-based column of the cursor")
    f.add_argument("--prefix-file", type=Path)
    f.add_argument("--suffix-file", type=Path)
    f.add_argument("--language", help="LSP language id (default: from the file's extension); enables syntax checks")
    f.add_argument("--candidates", type=_int_in(1, MAX_CANDIDATES), default=1, help="alternatives, in one batch")
    f.add_argument("--json", action="store_true", help="print the full result as JSON")
    f.set_defaults(func=cmd_fill)

    b = sub.add_parser(
        "batch", parents=[common, gen, retry], help="fill each JSONL request (id, prefix, suffix, language)"
    )
    b.add_argument("--input", type=Path, help="JSONL input (default stdin)")
    b.add_argument("--output", type=Path, help="JSONL output (default stdout)")
    b.set_defaults(func=cmd_batch)

    be = sub.add_parser("bench", parents=[common], help="latency and steps benchmark, JSON on stdout")
    be.add_argument("--json", action="store_true", help="one line of JSON")
    be.add_argument("--repeats", type=_int_in(1), default=20)
    be.add_argument("--strategy", choices=STRATEGIES, help="the cold and warm fills' (default: the model's)")
    be.set_defaults(func=_lazy("engine.evaluation.cli", "cmd_bench"))

    e = sub.add_parser(
        "eval", parents=[common, gen], help="infill quality, pass@1, steps and latency on held-out files"
    )
    e.add_argument("--data", type=Path, required=True, help="directory of source files")
    e.add_argument("--tasks", type=_int_in(1), default=500, help="tasks per kind (default 500)")
    e.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the one-token-per-step baseline on the same tasks: the autoregressive mode of the "
        "same weights, or left to right on the canvas for a model without it (default on)",
    )
    e.add_argument(
        "--functions",
        type=_int_in(0),
        default=200,
        help="at most this many doctested functions for pass@1 (0: none; default 200)",
    )
    e.add_argument("--timeout", type=float, default=10.0, help="seconds per doctest run (default 10)")
    e.add_argument(
        "--kinds", help="only these task kinds, comma-separated (e.g. lines,rest_of_line; default: every kind)"
    )
    e.add_argument("--table", action="store_true", help="print a markdown table instead of the JSON")
    e.add_argument("--output", type=Path, help="also write the JSON report to this file")
    e.set_defaults(func=_lazy("engine.evaluation.cli", "cmd_eval"))

    t = sub.add_parser("train", help="train a model directory from a recipe")
    t.add_argument("-v", "--verbose", action="store_true")
    t.add_argument("--recipe", type=Path, default=Path("recipes/first-model.json"))
    t.add_argument("--out", type=Path, help="model directory to write (required without --state)")
    t.add_argument("--resume", type=Path, help="model directory to continue from")
    t.add_argument(
        "--state",
        type=Path,
        help="training state directory: continued when it holds one, checkpointed during the run (wsd recipes)",
    )
    t.add_argument("--minutes", type=float, help="train this long (overrides the recipe's time_limit_s)")
    t.add_argument("--threads", type=int, help="torch threads (overrides the recipe's threads)")
    t.add_argument("--cooldown-minutes", type=float, help="then cool a copy down this long and write it to --out (wsd)")
    t.set_defaults(func=_lazy("engine.training.cli", "cmd_train"))

    ad = sub.add_parser(
        "adapt",
        help=f"train a checkpoint ({', '.join(AUTOREGRESSIVE_MODEL_TYPES)}) into a Dream-style infiller "
        "(canvas + one-token mode)",
        description="Fine-tune a pretrained autoregressive checkpoint directory (e.g. from convert-gguf or pull) "
        "so that its layers fill a canvas in place under full attention with shifted logits, keeping the "
        "next-token loss; writes a checkpoint directory the dream backend loads (docs/models.md).",
    )
    ad.add_argument("-v", "--verbose", action="store_true")
    ad.add_argument("--model", type=Path, required=True, help="the checkpoint directory to start from")
    ad.add_argument("--out", type=Path, required=True, help="the adapted checkpoint directory to write")
    ad.add_argument(
        "--data", type=Path, nargs="+", default=[Path("corpus")], help="corpus or source folders (default corpus)"
    )
    ad.add_argument("--steps", type=_int_in(1), default=100)
    ad.add_argument("--minutes", type=float, help="stop after this long, if the steps are not done")
    ad.add_argument("--lr", type=float, default=2e-5)
    ad.add_argument("--warmup", type=_int_in(0), default=10, help="steps of linear learning-rate warm-up")
    ad.add_argument("--batch-size", type=_int_in(1), default=4)
    ad.add_argument("--context-tokens", type=_int_in(8), default=256)
    ad.add_argument("--canvas-tokens", type=_int_in(2, 256), default=32)
    ad.add_argument(
        "--anneal-steps", type=_int_in(0), default=0, help="anneal the canvas's attention from causal to full"
    )
    ad.add_argument("--eval-batches", type=_int_in(1), default=2)
    ad.add_argument("--seed", type=_int_in(0), default=0)
    ad.add_argument("--device", type=_device, default="cpu")
    ad.add_argument("--bf16", action="store_true", help="bfloat16 autocast (accelerators)")
    ad.add_argument("--threads", type=_int_in(1), help="torch threads")
    ad.set_defaults(func=_lazy("engine.training.cli", "cmd_adapt"))

    x = sub.add_parser(
        "export-onnx",
        parents=[common],
        help="write the ONNX graphs for a model's safetensors: the embedded model's next to them, a checkpoint's "
        f"({', '.join(EXPORTED)}) as a new model directory the base install runs (backend onnx); --model FILE.gguf "
        f"(general.architecture {' or '.join(GGUF_ARCHITECTURES)}) does the same without torch",
    )
    x.add_argument("--out", type=Path, help="where to write (the embedded model: its own directory by default)")
    x.add_argument(
        "--quantize",
        choices=("int4", "int8", "none"),
        default="int8",
        help=f"a checkpoint's weights ({', '.join(EXPORTED)}) in 8 bits (the default: as good as float32 on the "
        "held-out eval), 4 (faster, but measured worse: docs/models.md), or float32",
    )
    x.set_defaults(func=_lazy("engine.training.cli", "cmd_export"))

    pl = sub.add_parser(
        "pull",
        help=f"download a checkpoint from the Hugging Face Hub: {kinds(tuple(dict.fromkeys(PULLED.values())), False)}",
        description="Download a checkpoint's config, tokenizer and safetensors weights into the models folder "
        "and print its directory. The Hub is HF_ENDPOINT's (default huggingface.co); HF_TOKEN opens gated repos. "
        "Running it again resumes an interrupted pull.",
    )
    pl.add_argument("-v", "--verbose", action="store_true")
    pl.add_argument("repo_id", metavar="REPO_ID", help="the model on the Hub: owner/name")
    pl.add_argument("--revision", help="branch, tag or commit (default: main)")
    pl.add_argument(
        "--dir",
        type=Path,
        help="models folder (default: $DIFFUSION_LSP_MODELS, else diffusion-lsp/models in $XDG_DATA_HOME "
        "or ~/.local/share); the checkpoint goes into DIR/OWNER--NAME",
    )
    pl.add_argument(
        "--force", action="store_true", help="pull a checkpoint whose model_type diffusion-lsp does not load"
    )
    pl.add_argument(
        "--ready",
        choices=("int8", "int4", "none"),
        default="int8",
        help=f"then export a checkpoint ({', '.join(EXPORTED)}) for the base install at 8 bits (the default) or 4 into "
        "DIR-int8 (or -int4) and time it here, so the language server can choose it (needs the torch extra); "
        "none: the checkpoint only",
    )
    pl.add_argument(
        "--quant",
        default="q8_0",
        metavar="TYPE",
        help="for a repo of GGUF files: the one of this type, by its name (q8_0, the default; q4_k_m, f16...)",
    )
    pl.set_defaults(func=_lazy("engine.commands.pull", "cmd_pull"))

    ms = sub.add_parser(
        "models",
        help="list the models folder: size, backend, quantization and fill times measured here (* the server's default)",
        description="List the model directories in the models folder, with the fill times measured on this machine; "
        "--measure times them here (a minute or two each). The language server, its `model` setting left empty, "
        "uses the largest model measured here whose keystroke fill is within its deadline, else the shipped model.",
    )
    ms.add_argument("-v", "--verbose", action="store_true")
    ms.add_argument("--dir", type=Path, help="models folder (default: as `pull`)")
    ms.add_argument(
        "--measure",
        nargs="*",
        metavar="NAME",
        help="time these models here (none named: all of them) and keep the times",
    )
    ms.add_argument("--device", default="cpu", help="where to measure and what the times hold for (cpu, cuda)")
    ms.add_argument(
        "--target-ms",
        type=_int_in(1),
        default=DEFAULT_DEADLINE_MS,
        help="the keystroke fill time the default must meet (deadlineMs)",
    )
    ms.add_argument("--json", action="store_true", help="print JSON")
    ms.set_defaults(func=_lazy("engine.commands.models", "cmd_models"))

    cg = sub.add_parser(
        "convert-gguf",
        help="write a checkpoint directory (safetensors, config.json, tokenizer.json) from a GGUF file "
        f"({', '.join(GGUF_ARCHITECTURES)})",
        description=f"Dequantize an autoregressive model ({', '.join(GGUF_ARCHITECTURES)}) stored as GGUF into a "
        "checkpoint directory "
        "that the dream backend loads (one token at a time) and `adapt` trains; prints the directory.",
    )
    cg.add_argument("-v", "--verbose", action="store_true")
    cg.add_argument("gguf", metavar="GGUF", type=Path, help="the .gguf file")
    cg.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    cg.add_argument("--sha256", help="refuse the file unless its sha256 is this")
    cg.set_defaults(func=_lazy("engine.commands.convert", "cmd_convert_gguf"))

    _add_serve(sub, [common, gen])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except EngineError as exc:
        sys.stderr.write(f"diffusion-infill: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: one line, the traceback only when asked for
        if args.verbose:
            raise
        sys.stderr.write(f"diffusion-infill: internal error: {type(exc).__name__}: {exc} (run with -v for details)\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
