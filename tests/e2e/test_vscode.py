"""VS Code end to end: the extension from editors/vscode in real VS Code (code-server) in
chromium, with the real diffusion-lsp server and the shipped model, used as a person would:
keys, the command palette, ghost text, the file saved to disk.

The shipped model is small and weak: the tests never check a fill's exact text, only that
one appears where it should, lands in the file, and leaves the file parsing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.vscode_harness import (
    EXTENSION,
    HOLES,
    INVENTORY,
    ROOT,
    STATUS_READY,
    VSCode,
    ask_for_ghost_text,
    build_vsix,
    ensure_node,
    fill_all_holes,
    line_of,
    node_env,
    parses,
    save_and_read,
    vscode_session,
)

pytestmark = pytest.mark.e2e

ARTIFACTS = ROOT / "test-artifacts"
TRIGGER_KEY = "Control+Alt+J"  # bound to "Trigger Inline Suggestion" in the session's keybindings.json
DEBOUNCE_MS = 5000  # the server waits this long before an automatic fill: room for a second request


@pytest.fixture(scope="module")
def vscode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VSCode]:
    """One code-server for the module (starting it is the slow part); each test opens its file."""
    tmp = tmp_path_factory.mktemp("vscode")
    keys = [{"key": "ctrl+alt+j", "command": "editor.action.inlineSuggest.trigger", "when": "editorTextFocus"}]
    # editMargin -100: a next edit keeps what the user's edit implies whatever the shipped
    # weights think of it (the model's judgment is tests/unit/test_edits.py's)
    settings = {"diffusionLsp.debounceMs": DEBOUNCE_MS, "diffusionLsp.editMargin": -100}
    with vscode_session(tmp, [INVENTORY, HOLES], settings, keys) as vs:
        vs.ui("openFile", name="inventory.py")
        vs.ui("status", pattern=STATUS_READY, timeout=120_000)
        yield vs


@pytest.fixture
def explain(vscode: VSCode, request: pytest.FixtureRequest) -> Iterator[None]:
    """On failure, a screenshot in test-artifacts/ (the call's report is logged before
    teardown, so the session's failure count already includes it)."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        shot = _screenshot(vscode, f"failed-{request.node.name}")
        print(f"screenshot: {shot}")


def _screenshot(vscode: VSCode, name: str) -> Path:
    shot = vscode.logs / f"{name}.png"
    vscode.ui("screenshot", path=str(shot))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / f"vscode-{name}.png")
    return ARTIFACTS / f"vscode-{name}.png"


def test_extension_type_checks_and_lints() -> None:
    """tsc --noEmit and eslint on editors/vscode exit 0 (tsc prints errors but still exits
    non-zero, so the exit codes are what count)."""
    node_bin = ensure_node()
    build_vsix(node_bin)  # npm ci when the lockfile changed
    env = node_env(node_bin)
    for cmd in (["npx", "--no-install", "tsc", "--noEmit"], ["npx", "--no-install", "eslint", "src"]):
        proc = subprocess.run(cmd, cwd=EXTENSION, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"


def test_ghost_text_in_a_function_body_is_accepted_with_tab(vscode: VSCode, explain: None) -> None:
    """Cursor after `return ` in Item.total (the expression deleted): ghost text shows, Tab
    accepts it, the saved file has the fill there and parses."""
    path = vscode.workspace / "inventory.py"
    vscode.ui("openFile", name="inventory.py")
    line = line_of(path.read_text(), "        return self.price * self.quantity")
    vscode.ui("goto", line=line, column=len("        return ") + 1)
    vscode.ui("press", key="Shift+End")
    vscode.ui("press", key="Delete")
    ghost = ask_for_ghost_text(vscode)
    assert ghost.strip(), "no ghost text at the cursor"
    _screenshot(vscode, "ghost-text")
    before = path.read_text()
    vscode.ui("press", key="Tab")
    after = save_and_read(vscode, path, before)
    lines = after.splitlines()
    filled = lines[line - 1]
    assert filled.startswith("        return ") and filled[len("        return ") :].strip(), (
        f"Tab did not put the fill after `return ` (line {line}: {filled!r})\n{vscode.diagnostics()}"
    )
    assert [e for e in vscode.events("inline") if e["outcome"] == "served"], vscode.diagnostics()
    assert lines[: line - 1] == before.splitlines()[: line - 1], "text before the cursor changed"
    assert parses(after), f"inventory.py does not parse after accepting the fill at line {line}:\n{after}"


def test_fill_all_holes_fills_both_holes(vscode: VSCode, explain: None) -> None:
    count, done, after = fill_all_holes(vscode)
    assert len(done) > count and done[-1]["command"] == "diffusion.fillAllHoles", vscode.diagnostics()
    assert done[-1]["outcome"] == "served", vscode.diagnostics()
    assert "    pass" not in after.splitlines(), f"the `pass` hole is still there:\n{after}"
    assert "    ..." not in after.splitlines(), f"the `...` hole is still there:\n{after}"
    for header in (
        "def area(width: float, height: float) -> float:",
        "def perimeter(width: float, height: float) -> float:",
    ):
        assert header in after, f"{header} is gone:\n{after}"
    assert after.rstrip().endswith("print(area(2.0, 3.0), perimeter(2.0, 3.0))"), after
    assert parses(after), f"holes.py does not parse after Fill all holes:\n{after}"


def test_regenerate_selection_replaces_the_selection(vscode: VSCode, explain: None) -> None:
    """Select the expression returned by Inventory.value and regenerate it."""
    path = vscode.workspace / "inventory.py"
    before = path.read_text()
    vscode.ui("openFile", name="inventory.py")
    old = "        return sum(item.total() for item in self.items.values())"
    line = line_of(before, old)
    vscode.ui("goto", line=line, column=len("        return ") + 1)
    vscode.ui("press", key="Shift+End")
    count = len(vscode.events("command"))
    vscode.ui("command", title="Diffusion: Regenerate selection")
    events = vscode.wait_events("command", count + 1)
    assert len(events) > count and events[-1]["command"] == "diffusion.regenerateSelection", vscode.diagnostics()
    assert events[-1]["outcome"] == "served", vscode.diagnostics()
    after = save_and_read(vscode, path, before)
    old_lines, new_lines = before.splitlines(), after.splitlines()
    assert after != before, "the selection was not replaced"
    # everything outside the selected statement (a whole syntax node) is as it was
    assert new_lines[: line - 1] == old_lines[: line - 1]
    tail = old_lines[line:]
    assert new_lines[len(new_lines) - len(tail) :] == tail, f"text after the selection changed:\n{after}"
    assert old not in new_lines, f"line {line} still reads {old!r}"
    assert parses(after), f"inventory.py does not parse after regenerating line {line}:\n{after}"


def test_a_next_edit_after_a_rename_is_shown_and_accepted(vscode: VSCode, explain: None) -> None:
    """Rename `item` where Inventory.remove defines it; "Suggest next edit" shows the
    edit that implies at one of its uses there (the one the model prefers most), and
    "Accept next edit" applies exactly that."""
    path = vscode.workspace / "inventory.py"
    before = path.read_text()
    vscode.ui("openFile", name="inventory.py")
    definition = "        item = self.items[name]"
    vscode.ui("goto", line=line_of(before, definition), column=9)
    vscode.ui("press", key="Control+Shift+ArrowRight")  # the word `item`
    vscode.ui("type", text="entry")
    count = len(vscode.events("nextEdit"))
    vscode.ui("command", title="Diffusion: Suggest next edit")
    shown = vscode.wait_events("nextEdit", count + 1)[-1]
    assert shown["outcome"] == "served" and shown["text"] == "entry", vscode.diagnostics()
    accepted = len(vscode.events("nextEditAccepted"))
    vscode.ui("command", title="Diffusion: Accept next edit")
    assert vscode.wait_events("nextEditAccepted", accepted + 1)[-1]["applied"] is True, vscode.diagnostics()
    after = save_and_read(vscode, path, before)
    renamed = before.replace(definition, "        entry = self.items[name]")
    uses = ("if quantity > item.quantity:", "{item.quantity} of", "item.quantity -= quantity")
    wants = [renamed.replace(use, use.replace("item", "entry")) for use in uses]
    assert after in wants, f"not one use of remove()'s `item` alone:\n{after}"
    assert parses(after)


def test_a_second_request_while_the_first_runs_is_served_and_the_first_dropped(vscode: VSCode, explain: None) -> None:
    """Typing asks for a suggestion (automatic: the server waits debounceMs before filling);
    asking again at once (the trigger key, invoked: no wait) is served while the first still runs,
    and the first is dropped: only the second's text shows and is accepted."""
    path = vscode.workspace / "inventory.py"
    vscode.ui("openFile", name="inventory.py")
    line = line_of(path.read_text(), "        return sorted(self.items)")
    vscode.ui("goto", line=line, column=len("        return ") + 1)
    vscode.ui("press", key="Shift+End")
    vscode.ui("press", key="Delete")
    started = len(vscode.events("inlineStart"))
    vscode.ui("type", text="s")
    first = vscode.wait_events("inlineStart", started + 1)
    assert len(first) > started and first[-1]["trigger"] == "automatic", (
        f"typing did not ask for a suggestion\n{vscode.diagnostics()}"
    )
    a = first[-1]["request"]
    running = [e for e in vscode.events("inline") if e["request"] == a]
    assert not running, f"the first request ended before the second was asked for: {running}"
    vscode.ui("press", key=TRIGGER_KEY)  # not the palette: focus leaving the editor cancels the first
    starts = vscode.wait_events("inlineStart", started + 2)
    invoked = [e for e in starts if e["request"] > a and e["trigger"] == "invoked"]
    assert invoked, f"no invoked request after the automatic one\n{vscode.diagnostics()}"
    b = invoked[0]["request"]
    ghost = vscode.ui("ghostText")
    vscode.wait_for(lambda: any(e["request"] == a for e in vscode.events("inline")), DEBOUNCE_MS / 1000 + 30)
    ends = {e["request"]: e for e in vscode.events("inline")}
    assert b in ends and ends[b]["outcome"] == "served" and ends[b]["items"] > 0, vscode.diagnostics()
    assert a in ends, f"the first request never ended\n{vscode.diagnostics()}"
    assert ends[a]["items"] == 0, f"the first request was not dropped: {ends[a]}"
    # the editor renders ghost text in pieces (a line break between its spans, where the
    # text has none): compare without whitespace
    assert "".join(ghost.split()) in "".join(ends[b]["text"].split()), (ghost, ends[b])
    _screenshot(vscode, "second-request")
