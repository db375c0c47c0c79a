"""pass@1 by execution: functions with doctests, mined from held-out code, run in a sandbox.

A task masks a function's body (the whole lines after its docstring) and asks for it
back; the fill passes when the function's doctests pass with the fill in place. Only
functions whose doctests pass with their ORIGINAL body are kept, so a failure is the
fill's, not the environment's; and only those whose doctests fail with an empty body
(a function that returns None and prints nothing would pass any fill that does nothing).

Each check runs in its own `python -I` subprocess (no user site, no PYTHONPATH, no
script directory on sys.path) with a minimal environment, a temporary working
directory, a wall-clock timeout (the process is killed; a fill that loops forever
fails), an address-space limit where the platform has one, and the network blocked:
before anything is imported, socket connections, name lookups and datagram sends raise
OSError. The module is imported from the held-out tree (its other functions as written),
then the function's source with the candidate body is executed in the module's namespace,
and the doctests of the original docstring run against it.

Only module-level functions are mined: a method's body would need its class rebuilt.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
MEMORY_LIMIT_BYTES = 2 << 30  # per check; a fill that allocates without end fails instead

# Runs in the subprocess; reads one JSON job on stdin, exits 0 when every example passed.
_RUNNER = r"""
import json, sys
job = json.load(sys.stdin)
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (job["memory"], job["memory"]))
except Exception:
    pass
import socket
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled during evaluation")
socket.socket.connect = _no_network
socket.socket.connect_ex = _no_network
socket.socket.sendto = _no_network
socket.create_connection = _no_network
socket.getaddrinfo = _no_network
sys.path.insert(0, job["root"])
import doctest, importlib
module = importlib.import_module(job["module"])
ns = module.__dict__
exec(compile(job["source"], job["file"], "exec"), ns)
test = doctest.DocTestParser().get_doctest(job["docstring"], dict(ns), job["name"], job["file"], job["line"])
runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS)
result = runner.run(test, out=lambda s: None)
print(json.dumps({"attempted": result.attempted, "failed": result.failed}))
sys.exit(0 if result.attempted and not result.failed else 1)
"""


@dataclass(frozen=True)
class DoctestFunction:
    """A module-level function whose docstring holds doctests, split for infill."""

    path: Path
    root: Path  # the sys.path entry its module imports from
    module: str  # dotted module name
    name: str
    docstring: str
    line: int  # 0-based line of the docstring, for doctest's messages
    prefix: str  # the file up to the body (after the docstring), ending at a line start
    middle: str  # the body: whole lines
    suffix: str  # the rest of the file
    head: str  # the function's source up to the body (decorators, signature, docstring)

    def source(self, body: str) -> str:
        """The function's source with `body` as its body."""
        return self.head + body


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    reason: str  # "passed", "failed", "timeout", "error"


def module_location(path: Path) -> tuple[Path, str]:
    """(sys.path root, dotted module name) of a file: its package is every directory
    above it that holds an __init__.py."""
    path = path.resolve()
    parts = [path.stem] if path.stem != "__init__" else []
    parent = path.parent
    while (parent / "__init__.py").is_file():
        parts.insert(0, parent.name)
        parent = parent.parent
    return parent, ".".join(parts)


def _line_offsets(text: str) -> list[int]:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def mine_file(path: Path, text: str, max_body_chars: int = 600) -> list[DoctestFunction]:
    """Module-level functions of one file with `>>>` examples in their docstring and a
    body after it of at most `max_body_chars`."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    root, module = module_location(path)
    if not module:
        return []
    offsets = _line_offsets(text)
    out: list[DoctestFunction] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or ">>>" not in doc or len(node.body) < 2 or node.end_lineno is None:
            continue
        first = node.body[1]  # the first statement after the docstring
        if first.lineno <= (node.body[0].end_lineno or 0):  # on the docstring's line
            continue
        def_start = offsets[min(d.lineno for d in [*node.decorator_list, node]) - 1]
        body_start, body_end = offsets[first.lineno - 1], offsets[min(node.end_lineno, len(offsets) - 1)]
        middle = text[body_start:body_end]
        if not middle.strip() or len(middle) > max_body_chars:
            continue
        out.append(
            DoctestFunction(
                path=path,
                root=root,
                module=module,
                name=node.name,
                docstring=doc,
                line=node.body[0].lineno - 1,
                prefix=text[:body_start],
                middle=middle,
                suffix=text[body_end:],
                head=text[def_start:body_start],
            )
        )
    return out


def run_doctests(fn: DoctestFunction, body: str, timeout: float = DEFAULT_TIMEOUT_S) -> CheckResult:
    """Run `fn`'s doctests with `body` as its body, in a sandboxed subprocess."""
    job = {
        "root": str(fn.root),
        "module": fn.module,
        "name": fn.name,
        "source": fn.source(body if body.endswith("\n") else body + "\n"),
        "docstring": fn.docstring,
        "file": str(fn.path),
        "line": fn.line,
        "memory": MEMORY_LIMIT_BYTES,
    }
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="passk-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _RUNNER],
                input=json.dumps(job),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd,
                env=env,
            )
        except subprocess.TimeoutExpired:  # subprocess.run has killed it
            return CheckResult(False, "timeout")
    if proc.returncode == 0:
        return CheckResult(True, "passed")
    return CheckResult(False, "failed" if proc.stdout.strip() else "error")


def run_many(
    jobs: list[tuple[DoctestFunction, str]], timeout: float = DEFAULT_TIMEOUT_S, workers: int | None = None
) -> list[CheckResult]:
    """`run_doctests` over (function, body) pairs, a few subprocesses at a time."""
    n = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda job: run_doctests(job[0], job[1], timeout), jobs))


def mine(files: list[tuple[Path, str]], max_body_chars: int = 600) -> list[DoctestFunction]:
    """Doctest functions of many files, in file order."""
    return [fn for path, text in files for fn in mine_file(path, text, max_body_chars)]


def keep_passing(
    candidates: list[DoctestFunction], limit: int, timeout: float = DEFAULT_TIMEOUT_S
) -> tuple[list[DoctestFunction], int]:
    """Up to `limit` candidates, in order, whose doctests pass with their original body
    and fail with an empty one (only the docstring: it returns None), so that passing
    says something about the fill; and how many were checked to find them."""
    kept: list[DoctestFunction] = []
    checked = 0
    chunk = 2 * min(4, os.cpu_count() or 1)
    while len(kept) < limit and checked < len(candidates):
        batch = candidates[checked : checked + chunk]
        checked += len(batch)
        results = run_many([(fn, body) for fn in batch for body in (fn.middle, "")], timeout)
        kept += [fn for i, fn in enumerate(batch) if results[2 * i].passed and not results[2 * i + 1].passed]
    return kept[:limit], checked
