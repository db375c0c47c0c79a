"""`diffusion-infill eval`: infill quality, steps and latency on held-out code, as JSON.

Task kinds, cut with a fixed seed from the `.py` files under a directory (engine/training/tasks.py):

  lines          one whole non-blank line (the cursor on an indented empty line)
  rest_of_line   the rest of a line from a random column
  single_line    lines and rest_of_line together (the issue's single-line infill)
  block_body     the whole indented block after a `:` line, at least two lines
  random_span    a random character span of up to 160 characters
  function_body  the body after the docstring of a function whose doctests pass with it
                 (engine/evaluation/passk.py): these give pass@1 by execution

Per kind: exact match (the fill equals the removed middle, trailing whitespace ignored),
syntax validity (prefix + fill + suffix has no more tree-sitter errors than the file as
written: `parses_no_worse`), steps and canvas tokens per fill, p50 and p95
latency (encode + denoise; the cache is cleared before every fill, so each one is cold),
and for function_body pass@1; the share of non-empty fills (every task's middle is
non-empty), the syntax validity that counts an empty fill as a failure, and the share
of fills with as many lines as the middle (the fill ends where the code ends). The same
tasks run again with the one-token-per-step baseline on the same weights (`baseline`:
the autoregressive mode when the model has one, else left to right on the canvas), and
an empty middle gives the floor (`empty`), so the speed/quality trade-off is one table
(`markdown_table`).

The fill is the model's raw top candidate (no syntax checking or truncation, which would
hide the model's errors), except that single-line kinds keep its first line, as the
editor does for a single-line span. Canvas budgets are the editor's (engine/spans):
32 tokens for a line, 64 for a random span, 128 for a body, unless --canvas-tokens is
given; a task whose middle does not fit its budget is redrawn (up to REDRAWS times, and
the share that fits is reported).

Each fill's confidence (engine.candidate.Candidate.score; for a single-line kind decoded
one token at a time, that of its first line and its line break, as the editor's one-line
span stops there) is recorded with its outcome under "fills" (exact; `right`: exact or
`equivalent`, the same program; valid), and "calibration" holds, per kind, the
reliability table and precision/recall against a threshold (engine/evaluation/calibration.py).
"""

from __future__ import annotations

import ast
import difflib
import io
import math
import random
import statistics
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.candidate import Candidate, scored
from engine.decoding import ONE_TOKEN_STRATEGIES, SamplerConfig, Strategy
from engine.errors import InputError
from engine.evaluation import calibration, passk
from engine.fill import Engine, InfillRequest
from engine.local.generator import LocalGenerator
from engine.spans import Document, count_errors, language_for
from engine.spans.select import MULTI_LINE_BUDGET, PROSE_BUDGET, SINGLE_LINE_BUDGET
from engine.training.tasks import TaskKind, cut

# eval kind -> (cut kind, most characters in the middle, canvas budget, single-line fill)
KIND_SPECS: dict[str, tuple[TaskKind, int, int, bool]] = {
    "lines": ("line", 160, SINGLE_LINE_BUDGET, True),
    "rest_of_line": ("rest_of_line", 160, SINGLE_LINE_BUDGET, True),
    "block_body": ("block_body", 400, MULTI_LINE_BUDGET, False),
    "random_span": ("random_span", 160, PROSE_BUDGET, False),
}
KINDS: tuple[str, ...] = tuple(KIND_SPECS)
TABLE_KINDS = ("single_line", "block_body", "random_span", "function_body")
REDRAWS = 50  # draws per task before one that does not fit its canvas is taken anyway
MAX_BODY_CHARS = 400  # function bodies longer than this are not mined
DEFAULT_FUNCTIONS = 200  # functions for pass@1 (at most)


def parses_no_worse(prefix: str, middle: str, fill: str, suffix: str, language: str = "python") -> bool | None:
    """Whether prefix + fill + suffix has no more syntax errors (ERROR and MISSING nodes)
    than prefix + middle + suffix, the file as written; None without a grammar.

    The evaluation's syntax-validity measure: held-out files may already hold errors
    (newer syntax than the grammar knows), which a fill is not blamed for. The fill's
    tree is an incremental reparse of the original's.
    """
    lang = language_for(language)
    if not lang.grammar:
        return None
    doc = Document(prefix + middle + suffix, lang)
    if doc.tree is None:
        return None
    after = doc.with_insert(len(prefix) + len(middle), fill, len(prefix))
    return bool(count_errors(after) <= count_errors(doc.tree))


@dataclass(frozen=True)
class Task:
    prefix: str
    middle: str
    suffix: str
    canvas: int
    single_line: bool
    fits: bool  # the middle and end-of-fill fit the canvas


@dataclass(frozen=True)
class Outcome:
    fill: str
    exact: bool
    syntax_valid: bool | None
    steps: int
    tokens: int  # canvas positions used: the fill's tokens plus end-of-fill when it fit
    ms: float
    passes: int = 0  # sequential forward passes, the context's included
    rounds: int = 0  # verified decoding: drafts
    accepted: int = 0  # verified decoding: drafted tokens kept
    canvas: int = 0  # the canvas it ran with (the length head's size, else the budget)
    score: float | None = None  # the fill's confidence (engine.candidate.Candidate.score)
    mean_logprob: float | None = None  # its mean log-probability per token (the other measure reported)
    equivalent: bool = False  # the same program as the middle (`equivalent`), exact or not


def load_files(data: Path) -> list[tuple[Path, str]]:
    """(path, text) of every readable, non-empty .py file under `data`, sorted by path."""
    if not data.is_dir():
        raise InputError(f"eval data directory not found: {data}")
    files = []
    for p in sorted(data.rglob("*.py")):
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            files.append((p, text))
    if not files:
        raise InputError(f"no readable .py files under {data}")
    return files


def draw_tasks(
    engine: Engine, texts: list[str], kind: str, n: int, rng: random.Random, canvas_tokens: int | None
) -> list[Task]:
    """`n` tasks of an eval kind (fewer only when the files hold too few)."""
    cut_kind, max_chars, budget, single = KIND_SPECS[kind]
    canvas = canvas_tokens or budget
    tasks: list[Task] = []
    draws = tries = 0
    while len(tasks) < n and draws < 100 * n:
        draws += 1
        got = cut(rng.choice(texts), cut_kind, rng, max_chars)
        if got is None or not got[1].strip() or (kind == "block_body" and got[1].count("\n") < 2):
            continue  # no such node in this file, a blank middle, or a one-line body
        fits = engine.generator.count_tokens(got[1]) + 1 <= canvas
        tries += 1
        if fits or tries >= REDRAWS:
            tasks.append(Task(*got, canvas=canvas, single_line=single, fits=fits))
            tries = 0
    return tasks


def equivalent(prefix: str, middle: str, fill: str, suffix: str) -> bool:
    """Whether the fill makes the same program as the middle, comments included: the same
    Python syntax tree and the same comments (quotes, spacing and line breaks inside
    brackets aside), or, where the file does not parse as written, the same text once
    white space is dropped."""
    if fill.rstrip() == middle.rstrip():
        return True
    try:
        same_tree = ast.dump(ast.parse(prefix + fill + suffix)) == ast.dump(ast.parse(prefix + middle + suffix))
        return same_tree and _comments(prefix + fill + suffix) == _comments(prefix + middle + suffix)
    except (SyntaxError, ValueError, RecursionError, tokenize.TokenError):
        return "".join(fill.split()) == "".join(middle.split())


def _comments(source: str) -> list[str]:
    """The comments of Python source, in order, each without trailing white space."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.string.rstrip() for t in tokens if t.type == tokenize.COMMENT]


def first_line(cand: Candidate, line_breaks: frozenset[int]) -> Candidate:
    """A one-token fill scored on its first line: its tokens up to and including the first
    that holds a line break (where the editor's one-line span stops decoding); the whole
    fill, end-of-fill counted, when it has none."""
    cut = next((i for i, t in enumerate(cand.token_ids) if t in line_breaks), None)
    if cut is None or cut + 1 > len(cand.confidence):
        return cand
    return scored(cand, [math.log(max(p, 1e-30)) for p in cand.confidence[: cut + 1]])


def run_task(
    engine: Engine,
    task: Task,
    sampler: SamplerConfig | None,
    use_drafter: bool | None,
    context_tokens: int | None,
    fit_canvas: bool | None = None,
) -> Outcome:
    engine.reset()  # independent, cold fills: no cached context
    # the task's sampler as it is (the CLI's --strategy/--steps are already in it; the
    # engine's own overrides would turn the baseline into the strategy under test)
    run = engine.configured(
        sampler=sampler,
        strategy=None,
        max_steps=None,
        use_drafter=use_drafter,
        canvas_tokens=task.canvas,
        context_tokens=context_tokens,
        fit_canvas=fit_canvas,
    )
    r = run.fill(InfillRequest(prefix=task.prefix, suffix=task.suffix))
    fill = r.text.split("\n", 1)[0] if task.single_line else r.text
    ids = r.candidates[0].token_ids if r.candidates else []
    best = r.candidates[0] if r.candidates else None
    if best is not None and task.single_line and sampler is not None and sampler.strategy in ONE_TOKEN_STRATEGIES:
        local = engine.generator
        assert isinstance(local, LocalGenerator), "the held-out eval runs a local model"
        best = first_line(best, local.tok.line_break_ids)
    return Outcome(
        fill=fill,
        score=best.score if best is not None else None,
        mean_logprob=best.mean_logprob if best is not None else None,
        equivalent=equivalent(task.prefix, task.middle, fill, task.suffix),
        exact=fill.rstrip() == task.middle.rstrip(),
        syntax_valid=parses_no_worse(task.prefix, task.middle, fill, task.suffix),
        steps=r.steps,
        tokens=min(len(ids) + 1, task.canvas),
        ms=r.total_ms,
        passes=r.passes,
        rounds=r.rounds,
        accepted=r.accepted,
        canvas=r.fitted_tokens or r.canvas_tokens,
    )


def empty_outcome(task: Task) -> Outcome:
    """What an empty middle scores on a task: the floor every model must beat."""
    return Outcome(
        fill="",
        exact=task.middle.rstrip() == "",
        syntax_valid=parses_no_worse(task.prefix, task.middle, "", task.suffix),
        steps=0,
        tokens=0,
        ms=0.0,
    )


def _similarity(fill: str, middle: str) -> float:
    return difflib.SequenceMatcher(None, fill.rstrip(), middle.rstrip(), autojunk=False).ratio()


def _lines(text: str) -> int:
    """Lines of code in a fill or middle (a final line break ends a line, it starts none)."""
    return len(text.rstrip("\n").split("\n")) if text.strip() else 0


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(tasks: list[Task], outcomes: list[Outcome]) -> dict[str, Any]:
    """The figures of one kind (and one sampler)."""
    n = len(outcomes)
    if not n:
        return {"tasks": 0}
    checked_outcomes = [o for o in outcomes if o.syntax_valid is not None]
    checked = [bool(o.syntax_valid) for o in checked_outcomes]
    steps = [o.steps for o in outcomes]
    return {
        "tasks": n,
        "exact_match": round(sum(o.exact for o in outcomes) / n, 4),
        "exact_or_equivalent": round(sum(o.exact or o.equivalent for o in outcomes) / n, 4),
        "syntax_valid": round(sum(checked) / len(checked), 4) if checked else None,
        "non_empty": round(sum(bool(o.fill.strip()) for o in outcomes) / n, 4),
        # the fill ends where the code ends: as many lines as the middle it replaces
        "same_line_count": round(
            sum(_lines(o.fill) == _lines(t.middle) for t, o in zip(tasks, outcomes, strict=True)) / n, 4
        ),
        "syntax_valid_non_empty": (
            round(sum(bool(o.fill.strip()) and bool(o.syntax_valid) for o in checked_outcomes) / len(checked), 4)
            if checked
            else None
        ),
        # closeness to the real middle, 0..1 (difflib's ratio of the two texts, trailing
        # whitespace aside): validity says a fill parses, this says whether it is the code
        "edit_similarity": round(
            statistics.mean(_similarity(o.fill, t.middle) for t, o in zip(tasks, outcomes, strict=True)), 4
        ),
        "steps_per_fill": round(statistics.mean(steps), 2),
        "passes_per_fill": round(statistics.mean(o.passes for o in outcomes), 2),
        "tokens_per_pass": round(sum(o.tokens for o in outcomes) / max(1, sum(o.passes for o in outcomes)), 2),
        # verified decoding: drafted tokens kept per draft (0 for the other strategies)
        "acceptance_length": round(sum(o.accepted for o in outcomes) / max(1, sum(o.rounds for o in outcomes)), 2),
        "canvas_per_fill": round(statistics.mean(o.canvas for o in outcomes), 2),
        "tokens_per_fill": round(statistics.mean(o.tokens for o in outcomes), 2),
        "tokens_per_step": round(sum(o.tokens for o in outcomes) / max(1, sum(steps)), 2),
        "p50_ms": round(statistics.median(o.ms for o in outcomes), 2),
        "p95_ms": round(_pct([o.ms for o in outcomes], 0.95), 2),
        "middle_fits_canvas": round(sum(t.fits for t in tasks) / n, 4),
    }


def evaluate_dir(
    engine: Engine,
    data: Path,
    tasks: int = 500,
    seed: int = 0,
    sampler: SamplerConfig | None = None,
    use_drafter: bool | None = None,
    canvas_tokens: int | None = None,
    context_tokens: int | None = None,
    baseline: bool = True,
    fit_canvas: bool | None = None,
    functions: int = DEFAULT_FUNCTIONS,
    timeout: float = passk.DEFAULT_TIMEOUT_S,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """The report: one entry per kind, the baseline's under "baseline", pass@1 under
    "function_body" (when `functions` > 0), each fill's confidence and outcome under
    "fills" and their calibration under "calibration"."""
    files = load_files(data)
    local = engine.generator
    assert isinstance(local, LocalGenerator), "the held-out eval runs a local model"
    base = sampler or local.default_sampler()
    texts, rng = [t for _, t in files], random.Random(seed)
    report: dict[str, Any] = {"data": str(data), "files": len(files), "seed": seed}
    runs: dict[str, dict[str, tuple[list[Task], list[Outcome]]]] = {"diffusion": {}, "baseline": {}, "empty": {}}
    one_by_one: Strategy = "autoregressive" if local.den.info.autoregressive else "left_to_right"

    def run_kind(kind: str, kind_tasks: list[Task]) -> None:
        runs["diffusion"][kind] = (
            kind_tasks,
            [run_task(engine, t, base, use_drafter, context_tokens, fit_canvas) for t in kind_tasks],
        )
        if baseline:
            outs = []
            for t in kind_tasks:  # one token per step: the autoregressive mode, or left to right
                one = replace(base, strategy=one_by_one, max_steps=t.canvas)
                outs.append(run_task(engine, t, one, False, context_tokens))
            runs["baseline"][kind] = (kind_tasks, outs)
        runs["empty"][kind] = (kind_tasks, [empty_outcome(t) for t in kind_tasks])

    for kind in kinds:
        run_kind(kind, draw_tasks(engine, texts, kind, tasks, rng, canvas_tokens))

    mined, kept, checked = _doctested(files, functions, seed, timeout)
    if functions > 0:
        run_kind("function_body", _function_tasks(engine, kept, canvas_tokens or MULTI_LINE_BUDGET))

    _summaries(report, runs, kinds, kept, baseline, timeout)
    report["fills"] = scored_fills(runs["diffusion"])
    report["calibration"] = calibration.calibrate(
        {k: [calibration.Scored(**f) for f in v] for k, v in report["fills"].items()}
    )
    if functions > 0:
        counts = {"functions_mined": len(mined), "functions_checked": checked, "functions_kept": len(kept)}
        report["function_body"] = {**report.get("function_body", {"tasks": 0}), **counts}
    report["setup"] = _setup(local, base, use_drafter, fit_canvas, context_tokens, canvas_tokens, timeout)
    report["setup"]["baseline"] = f"{one_by_one}, one token per step, drafter off" if baseline else None
    return report


def _doctested(
    files: list[tuple[Path, str]], functions: int, seed: int, timeout: float
) -> tuple[list[passk.DoctestFunction], list[passk.DoctestFunction], int]:
    """(functions mined, at most `functions` of them whose doctests pass with their body
    and fail without it, how many were checked); nothing when `functions` is 0."""
    if functions <= 0:
        return [], [], 0
    mined = passk.mine(files, MAX_BODY_CHARS)
    random.Random(seed).shuffle(mined)
    kept, checked = passk.keep_passing(mined, functions, timeout)
    return mined, kept, checked


def _function_tasks(engine: Engine, kept: list[passk.DoctestFunction], canvas: int) -> list[Task]:
    """The doctested functions' bodies as tasks on a `canvas`-token budget."""
    count = engine.generator.count_tokens
    return [Task(fn.prefix, fn.middle, fn.suffix, canvas, False, count(fn.middle) + 1 <= canvas) for fn in kept]


def _summaries(
    report: dict[str, Any],
    runs: dict[str, dict[str, tuple[list[Task], list[Outcome]]]],
    kinds: tuple[str, ...],
    kept: list[passk.DoctestFunction],
    baseline: bool,
    timeout: float,
) -> None:
    """Each run's figures per kind into `report` (the diffusion run's at its top, the
    others under their names), single_line and all among them, pass@1 for function_body."""
    for name, by_kind in runs.items():
        if name == "baseline" and not baseline:
            continue
        out = report if name == "diffusion" else report.setdefault(name, {})
        for kind, (kind_tasks, outcomes) in by_kind.items():
            out[kind] = summarize(kind_tasks, outcomes)
            if kind == "function_body":
                results = passk.run_many([(fn, o.fill) for fn, o in zip(kept, outcomes, strict=True)], timeout)
                out[kind]["pass_at_1"] = round(sum(r.passed for r in results) / len(results), 4) if results else None
                out[kind]["timeouts"] = sum(r.reason == "timeout" for r in results)
        if "lines" in by_kind and "rest_of_line" in by_kind:
            pairs = [by_kind[k] for k in ("lines", "rest_of_line")]
            out["single_line"] = summarize([t for p in pairs for t in p[0]], [o for p in pairs for o in p[1]])
        all_tasks = [t for k in kinds for t in by_kind[k][0]]
        all_outs = [o for k in kinds for o in by_kind[k][1]]
        out["all"] = summarize(all_tasks, all_outs)


def _setup(
    local: LocalGenerator,
    base: SamplerConfig,
    use_drafter: bool | None,
    fit_canvas: bool | None,
    context_tokens: int | None,
    canvas_tokens: int | None,
    timeout: float,
) -> dict[str, Any]:
    """What the run was: the model, the decoding and the budgets."""
    return {
        "model": str(local.model.path),
        "backend": local.model.backend,
        "strategy": base.strategy,
        "max_steps": base.max_steps,
        "entropy_bound": base.entropy_bound,
        "drafter": use_drafter if use_drafter is not None else bool(local.defaults.get("drafter", True)),
        "fit_canvas": (fit_canvas if fit_canvas is not None else bool(local.defaults.get("fit_canvas", True)))
        and local.den.info.length_classes > 0,
        "context_tokens": context_tokens or local.defaults.get("context_tokens"),
        "canvas_tokens": canvas_tokens
        or {"single_line": SINGLE_LINE_BUDGET, "random_span": PROSE_BUDGET, "block_body": MULTI_LINE_BUDGET},
        "baseline": None,
        "empty": "an empty middle: the floor",
        "doctest_timeout_s": timeout,
    }


def scored_fills(by_kind: dict[str, tuple[list[Task], list[Outcome]]]) -> dict[str, list[dict[str, Any]]]:
    """Per kind (and single_line: lines and rest_of_line together; multi_line: the kinds of
    several lines together): each fill's confidence and outcome, as
    engine.evaluation.calibration.Scored fields."""
    out = {
        kind: [
            {
                "fill": o.fill,
                "score": o.score,
                "mean_logprob": o.mean_logprob,
                "exact": o.exact,
                "right": o.exact or o.equivalent,
                "valid": o.syntax_valid,
            }
            for o in outcomes
        ]
        for kind, (_, outcomes) in by_kind.items()
    }
    if "lines" in out and "rest_of_line" in out:
        out["single_line"] = out["lines"] + out["rest_of_line"]
    several = [f for kind in ("block_body", "random_span", "function_body") for f in out.get(kind, [])]
    if several:
        out["multi_line"] = several
    return out


def _cell(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def markdown_table(report: dict[str, Any]) -> str:
    """Rows kind x {the strategy under test, baseline, empty}; columns EM, edit similarity,
    non-empty, syntax-valid (and counting empty fills as failures), pass@1, sequential
    passes per fill, p50 ms."""
    lines = [
        "| kind | decoding | tasks | EM | edit sim | non-empty | syntax-valid | valid & non-empty | same lines "
        "| pass@1 | passes/fill | p50 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    setup = report.get("setup", {})
    base_name = str((setup.get("baseline") or "baseline").split(",")[0])
    name = str(setup.get("strategy", "diffusion")) + (", length head" if setup.get("fit_canvas") else "")
    for kind in TABLE_KINDS:
        for label, source in (
            (name, report),
            (base_name, report.get("baseline", {})),
            ("empty middle", report.get("empty", {})),
        ):
            row = source.get(kind)
            if not row or not row.get("tasks"):
                continue
            lines.append(
                f"| {kind} | {label} | {row['tasks']} | {_cell(row['exact_match'], '.1%')} "
                f"| {_cell(row.get('edit_similarity'), '.3f')} "
                f"| {_cell(row.get('non_empty'), '.1%')} | {_cell(row['syntax_valid'], '.1%')} "
                f"| {_cell(row.get('syntax_valid_non_empty'), '.1%')} | {_cell(row.get('same_line_count'), '.1%')} "
                f"| {_cell(row.get('pass_at_1'), '.1%')} "
                f"| {row.get('passes_per_fill', row['steps_per_fill']):.1f} | {row['p50_ms']:.0f} |"
            )
    return "\n".join(lines) + "\n"
