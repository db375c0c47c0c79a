"""`diffusion-infill eval` at small size with the shipped model, and pass@1 by execution."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from engine.denoisers.loading import load_model
from engine.evaluation.heldout import KINDS, draw_tasks, evaluate_dir, markdown_table, parses_no_worse, run_task
from engine.evaluation.passk import keep_passing, mine_file, run_doctests
from engine.fill import Engine
from engine.local.generator import LocalGenerator, local_engine
from engine.models.directory import DEFAULT_MODEL_DIR

FUNCS = '''"""Small functions with doctests, for the evaluation tests."""

import socket


def add(a, b):
    """Add two numbers.

    >>> add(2, 3)
    5
    """
    total = a + b
    return total


def clamp(x, lo, hi):
    """Clamp x into [lo, hi].

    >>> clamp(5, 0, 3)
    3
    >>> clamp(-1, 0, 3)
    0
    """
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def network():
    """Reports whether name lookups are blocked.

    >>> network()
    'blocked'
    """
    try:
        socket.getaddrinfo("localhost", 80)
    except OSError as exc:
        return "blocked" if "disabled" in str(exc) else "failed"
    return "open"


def log(x):
    """Passes whatever the body does.

    >>> log(1)
    """
    print(end="")


def no_doctest(x):
    """Nothing to run here."""
    return x


class Counter:
    def __init__(self, start=0):
        self.value = start
        self.history = [start]

    def bump(self, by=1):
        for _ in range(by):
            self.value += 1
            self.history.append(self.value)
        return self.value
'''


def local(engine: Engine) -> LocalGenerator:
    assert isinstance(engine.generator, LocalGenerator)
    return engine.generator


@pytest.fixture(scope="module")
def engine() -> Engine:
    return local_engine(load_model(DEFAULT_MODEL_DIR))


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    pkg = tmp_path / "heldout" / "toypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "funcs.py").write_text(FUNCS)
    return tmp_path / "heldout"


def test_doctests_pass_with_the_original_body_and_fail_otherwise(data: Path) -> None:
    path = data / "toypkg" / "funcs.py"
    fns = {fn.name: fn for fn in mine_file(path, path.read_text())}
    assert set(fns) == {"add", "clamp", "network", "log"}  # not methods, nor functions without `>>>`
    add = fns["add"]
    assert add.module == "toypkg.funcs" and add.root == data.resolve()
    assert add.middle == "    total = a + b\n    return total\n"
    assert add.prefix + add.middle + add.suffix == path.read_text()
    assert run_doctests(add, add.middle).passed
    assert run_doctests(fns["clamp"], fns["clamp"].middle).passed
    wrong = run_doctests(add, "    return a - b\n")
    assert not wrong.passed and wrong.reason == "failed"
    assert not run_doctests(add, "    return (\n").passed  # does not compile
    assert run_doctests(fns["network"], fns["network"].middle).passed  # name lookups raise
    assert keep_passing(list(fns.values()), 10, timeout=5) == ([add, fns["clamp"], fns["network"]], 4)


def test_a_fill_that_loops_forever_is_killed(data: Path) -> None:
    path = data / "toypkg" / "funcs.py"
    add = mine_file(path, path.read_text())[0]
    result = run_doctests(add, "    while True:\n        pass\n", timeout=1.5)
    assert result.reason == "timeout" and not result.passed


def test_syntax_validity_compares_with_the_file_as_written() -> None:
    assert parses_no_worse("def f():\n", "    return 1\n", "    return 2\n", "")
    assert not parses_no_worse("def f():\n", "    return 1\n", "    return (1,\n", "")
    # an error the file already had is not held against the fill
    assert parses_no_worse("x = (\ndef f():\n", "    return 1\n", "    return 2\n", "")


def test_baseline_takes_one_step_per_token(engine: Engine, data: Path) -> None:
    texts = [(data / "toypkg" / "funcs.py").read_text()]
    rng = random.Random(0)
    tasks = draw_tasks(engine, texts, "rest_of_line", 6, rng, None) + draw_tasks(
        engine, texts, "block_body", 2, rng, None
    )
    assert len(tasks) == 8 and all(t.middle.count("\n") >= 2 for t in tasks[6:])
    filled = 0
    for task in tasks:
        l2r = replace(local(engine).default_sampler(), strategy="left_to_right", max_steps=task.canvas)
        out = run_task(engine, task, l2r, False, None)
        # one step per canvas position the fill used: its tokens, and end-of-fill when
        # the canvas had room, which the end rule may lock in the same step as the last
        # token; an empty fill may take one step more (the sampler holds back a leading
        # position that is likely padding and locks one after it first)
        if out.fill:
            filled += 1
            assert out.tokens - 1 <= out.steps <= out.tokens, out
        else:
            assert out.steps <= out.tokens + 1, out
    assert filled >= 3


def test_small_eval_report(engine: Engine, data: Path) -> None:
    report = evaluate_dir(engine, data, tasks=3, seed=1, functions=3, timeout=5)
    assert report["files"] == 1  # the empty __init__.py is not a source of tasks
    for source in (report, report["baseline"]):
        for kind in (*KINDS, "single_line", "all"):
            row = source[kind]
            assert row["tasks"] == {"single_line": 6, "all": 12}.get(kind, 3), kind
            assert 0.0 <= row["exact_match"] <= 1.0 and 0.0 <= row["syntax_valid"] <= 1.0
            assert row["steps_per_fill"] >= 1 and row["p50_ms"] > 0
        fb = source["function_body"]
        assert fb["tasks"] == 3 and 0.0 <= fb["pass_at_1"] <= 1.0 and 0.0 <= fb["syntax_valid"] <= 1.0
    # `log` passes with an empty body: its doctests say nothing about a fill
    assert report["function_body"]["functions_mined"] == 4 and report["function_body"]["functions_kept"] == 3
    for kind in (*KINDS, "function_body"):  # one token per step (an empty fill: maybe one more)
        row = report["baseline"][kind]
        assert row["tokens_per_fill"] <= row["steps_per_fill"] <= row["tokens_per_fill"] + 1
    assert report["setup"]["baseline"] and report["setup"]["canvas_tokens"]["block_body"] == 128
    one_by_one = "autoregressive" if local(engine).den.info.autoregressive else "left_to_right"
    assert report["setup"]["baseline"].startswith(one_by_one)
    for kind in (*KINDS, "function_body"):  # the floor: an empty middle, no model
        row = report["empty"][kind]
        assert row["exact_match"] == 0.0 and row["non_empty"] == 0.0 and row["syntax_valid_non_empty"] == 0.0
        assert row["steps_per_fill"] == 0 and row["edit_similarity"] == 0.0  # nothing is like a real middle
        for source in (report, report["baseline"]):  # valid & non-empty never exceeds either alone
            r = source[kind]
            assert r["syntax_valid_non_empty"] <= min(r["non_empty"], r["syntax_valid"])
    table = markdown_table(report)
    assert table.count("\n") == 2 + 4 * 3  # header, rule, 4 kinds x {diffusion, baseline, empty}
    assert f"| function_body | {one_by_one} | 3 |" in table and "| function_body | empty middle | 3 |" in table


def test_edit_similarity_says_how_close_a_fill_is_to_the_middle() -> None:
    from engine.evaluation.heldout import Outcome, Task, summarize

    task = Task("def f(x):\n    return ", "x + 1", "\n", 32, True, True)

    def score(fill: str) -> float:
        return float(summarize([task], [Outcome(fill, fill == "x + 1", True, 1, 1, 1.0)])["edit_similarity"])

    assert score("x + 1") == 1.0 and score("") == 0.0
    assert score("x + 1\n") == 1.0  # trailing whitespace aside
    assert 0.0 < score("x + 2") < 1.0 and score("x + 2") > score("y - 7")
