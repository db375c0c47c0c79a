"""The layout keeps the runtime apart from training and evaluation: the language
server and the fill server, from start to a fill with the shipped model, import neither
torch nor any module of engine.training or engine.evaluation (docs/engine.md, Layout);
and the two front ends (lsp_server, fill_server) sit above the engine and apart from
each other."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, json, sys
from engine.fill import InfillRequest
from lsp_server.server import create_server
from lsp_server.service import REGION
from lsp_server.settings import Settings
server = create_server()
assert server.fills.load(Settings()) is None, server.fills.load_error
server.fills.ready.set()
request = InfillRequest("def add(a, b):\\n    return ", "\\n", "python")
answer = asyncio.run(server.fills.fill("file:///a.py", request, REGION))
print(json.dumps(sorted(sys.modules)))
"""


SERVE_PROBE = """
import json, sys
import fill_server.main
from engine.denoisers.loading import load_model
from engine.fill import FillControl
from engine.local.generator import local_engine
from fill_server.filling import run_fill
from fill_server.schema import fill_ask
ask = fill_ask({"prompt": "def add(a, b):\\n    return ", "suffix": "\\n", "language": "python"}, "completions")
outcome = run_fill(local_engine(load_model()), ask, FillControl())
print(json.dumps(sorted(sys.modules)))
"""


def _forbidden_after(probe: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "engine.local.generator" in modules and "onnxruntime" in modules  # the probe did load and fill
    return [
        m
        for m in modules
        if m.split(".")[0] in {"torch", "transformers", "safetensors"}
        or m.startswith(("engine.training", "engine.evaluation"))
    ]


def test_the_server_imports_no_torch_training_or_evaluation() -> None:
    assert _forbidden_after(PROBE) == []


def test_the_fill_server_imports_no_torch_training_or_evaluation() -> None:
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("the serve extra is not installed")
    assert _forbidden_after(SERVE_PROBE) == []


# ------------------------------------------------------------------ the import graph

# The runtime: what the server and the command line import to fill. Training and
# evaluation live beside it (engine/training, engine/evaluation) and may import it.
RUNTIME = ("engine", "lsp_server", "fill_server")
APART = ("engine.training", "engine.evaluation")

# What each part may not import (prefixes of module names). Read from the bottom up:
# the errors and spans know nothing else of the engine; the backend table is a leaf;
# models (the directory format) know no backend; denoisers know
# no generator; the frame knows no generator or backend; the local and remote generators
# know nothing of each other; nothing of the engine knows the servers or the commands.
# The two front ends (the language server, the fill server) know nothing of each other,
# and the fill server nothing of the commands that start it.
ABOVE = ("lsp_server", "fill_server", "engine.commands")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "engine.errors": ("engine.",),
    "engine.spans": (
        "engine.fill",
        "engine.syntax",
        "engine.local",
        "engine.remote",
        "engine.models",
        "engine.denoisers",
    ),
    "engine.models.table": ("engine.models.", "engine.denoisers", "engine.local", "engine.remote", "engine.fill"),
    "engine.denoisers.base": ("engine.",),
    "engine.models": ("engine.denoisers", "engine.local", "engine.remote", "engine.fill", "engine.syntax", *ABOVE),
    "engine.denoisers": ("engine.local", "engine.remote", "engine.fill", "engine.syntax", *ABOVE),
    "engine.fill": ("engine.local", "engine.remote", "engine.denoisers", "engine.denoisers.loading", *ABOVE),
    "engine.syntax": ("engine.local", "engine.remote", "engine.denoisers", "engine.denoisers.loading", *ABOVE),
    "engine.candidate": ("engine.local", "engine.remote", "engine.denoisers", "engine.models", *ABOVE),
    "engine.decoding": ("engine.",),
    "engine.local": ("engine.remote", *ABOVE),
    "engine.remote": ("engine.local", "engine.denoisers", "engine.denoisers.loading", *ABOVE),
    "lsp_server": ("fill_server",),
    "fill_server": ("lsp_server", "engine.commands", *APART),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project's modules that `name` imports anywhere in its text (lazy imports too),
    each resolved to the longest known module name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: -node.level] if path.name != "__init__.py" else name.split(".")
                base = ".".join([*package[: len(package) - (node.level - 1)], *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for top in RUNTIME for p in (ROOT / top).rglob("*.py")}
    files = {n: p for n, p in files.items() if not n.startswith(APART)}
    known = set(files)
    return {name: _imports(path, name, known) for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_runtime_has_no_import_circle() -> None:
    graph = _graph()
    assert "engine.local.generator" in graph and "engine.models.table" in graph["engine.denoisers.loading"]
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_part_imports_what_lies_above_it() -> None:
    graph = _graph()
    upward = []
    for name, targets in sorted(graph.items()):
        rules = [rule for prefix, rule in FORBIDDEN.items() if name == prefix or name.startswith(prefix + ".")]
        banned = rules[-1] if rules else ()  # the most specific part's rule (FORBIDDEN lists parents first)
        if name.startswith("engine"):
            banned = (
                (*banned, "lsp_server", "fill_server", *APART) if not name.startswith("engine.commands") else banned
            )
        upward += [f"{name} -> {t}" for t in sorted(targets) if t.startswith(banned) and t != name]
    assert upward == []


def test_the_backend_table_is_a_leaf_that_imports_no_backend() -> None:
    """The settings, the command line and pull read the table without loading a backend:
    it imports the engine's errors and the standard library, nothing else."""
    assert _graph()["engine.models.table"] == {"engine.errors"}
    tree = ast.parse((ROOT / "engine/models/table.py").read_text(encoding="utf-8"))
    tops = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    tops |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert tops <= {"__future__", "dataclasses", "engine"}
