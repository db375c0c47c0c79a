"""The backend table (engine/models/table.py) is the one source of what each backend loads:
`pull` takes what it loads from the Hub, `export-onnx` what it marks exportable, and the
settings, the command line and the docs say what it says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.commands import pull
from engine.commands.cli import build_parser
from engine.models.table import BACKENDS, EXPORTED, PULLED, QUANTIZATIONS, TABLE, quantized_rows
from lsp_server.settings import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "editors").glob("*/README.md"))]


def test_pull_takes_what_the_table_loads_from_the_hub_and_readies_what_it_exports() -> None:
    assert set(PULLED) == {t for r in TABLE if r.pulled for t in r.model_types}
    assert pull.READY_TYPES == EXPORTED and set(EXPORTED) <= set(PULLED)
    for model_type, r in PULLED.items():
        assert r.name in pull.family({"model_type": model_type}, "o/n", force=False)
    for r in TABLE:
        if not r.pulled:
            for t in r.model_types:
                with pytest.raises(pull.PullError):
                    pull.family({"model_type": t}, "o/n", force=False)


def _help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return re.sub(r"\s+", "", capsys.readouterr().out)  # argparse wraps lines, at hyphens too


def test_the_settings_and_the_command_line_name_every_kind_the_table_has(capsys: pytest.CaptureFixture[str]) -> None:
    described = {o.key: o.description for o in OPTIONS}
    assert all(r.kind in described["model"] and r.name in described["model"] for r in TABLE)
    assert all(r.kind in described["quantization"] for r in quantized_rows())
    assert not any(r.kind in described["quantization"] for r in TABLE if r not in quantized_rows())
    fill = _help(capsys, "fill")
    assert all(r.kind.replace(" ", "") in fill for r in TABLE)  # --backend
    assert ",".join(EXPORTED) in _help(capsys, "export-onnx")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_list_the_backends_and_quantizations_there_are(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for flag, values in (("backend", BACKENDS), ("quantization", QUANTIZATIONS)):
        for listed in re.findall(rf"--{flag} \{{([^}}]*)\}}", text):
            assert tuple(v.strip() for v in listed.split(",")) == values, f"{doc.name}: --{flag} {{{listed}}}"


FAMILIES = ("DiffusionGemma", "Dream", "Qwen2", "Llama", "LLaDA", "SDAR", "Fast-dLLM")


def _messages(tree: ast.AST) -> list[str]:
    """The string literals of a module that are not docstrings (f-strings' text parts too)."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_list_of_families_is_written_by_hand_outside_the_table() -> None:
    """A message, help text or description that names several families is made from the
    table (engine/models/table.py), not written out where it can fall behind it."""
    found = []
    for path in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "lsp_server").rglob("*.py")]):
        if path == ROOT / "engine" / "models" / "table.py":
            continue
        for text in _messages(ast.parse(path.read_text(encoding="utf-8"))):
            if sum(name in text for name in FAMILIES) >= 2:
                found.append(f"{path.relative_to(ROOT)}: {text[:80]!r}")
    assert not found, found
