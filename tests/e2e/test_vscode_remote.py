"""VS Code end to end on a remote engine: the extension in real VS Code (code-server) with
the two settings a user sets (`diffusionLsp.endpoint`, `diffusionLsp.dialect`), the fills
coming from llama.cpp's server (xllamacpp, tests/real_engine.py: its fills are strings
of x). Ghost text accepted with Tab, drafts reaching the editor, Fill all holes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.vscode_harness import (
    HOLES,
    INVENTORY,
    STATUS_READY,
    VSCode,
    ask_for_ghost_text,
    fill_all_holes,
    line_of,
    parses,
    save_and_read,
    vscode_session,
)
from tests.real_engine import RunningEngine

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def remote_vscode(tmp_path_factory: pytest.TempPathFactory, real_engine: RunningEngine) -> Iterator[VSCode]:
    settings = {"diffusionLsp.endpoint": real_engine.url, "diffusionLsp.dialect": "llama-infill"}
    with vscode_session(tmp_path_factory.mktemp("vscode-remote"), [INVENTORY, HOLES], settings) as vs:
        vs.ui("openFile", name="inventory.py")
        vs.ui("status", pattern=STATUS_READY, timeout=120_000)
        yield vs


def test_ghost_text_from_the_engine_is_accepted_with_tab(remote_vscode: VSCode) -> None:
    vscode = remote_vscode
    path = vscode.workspace / "inventory.py"
    line = line_of(path.read_text(), "        return self.price * self.quantity")
    vscode.ui("goto", line=line, column=len("        return ") + 1)
    vscode.ui("press", key="Shift+End")
    vscode.ui("press", key="Delete")
    ghost = ask_for_ghost_text(vscode)
    assert ghost.strip() and set(ghost.strip()) <= {"x", "y"}, ghost
    before = path.read_text()
    vscode.ui("press", key="Tab")
    after = save_and_read(vscode, path, before)
    filled = after.splitlines()[line - 1]
    assert filled == "        return " + ghost.strip(), (filled, vscode.diagnostics())
    assert parses(after)
    drafts = vscode.events("draft")
    assert drafts and all(d["text"] and set(d["text"]) <= {"x", "y"} for d in drafts), vscode.diagnostics()


def test_fill_all_holes_from_the_engine(remote_vscode: VSCode) -> None:
    vscode = remote_vscode
    _, done, after = fill_all_holes(vscode)
    assert done[-1]["command"] == "diffusion.fillAllHoles" and done[-1]["outcome"] == "served", vscode.diagnostics()
    assert "    pass" not in after.splitlines() and "    ..." not in after.splitlines(), after
    assert parses(after), after
