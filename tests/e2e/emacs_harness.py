"""Emacs for the end-to-end tests: find (or install) Emacs with eglot, and run the ert
suite of tests/e2e/diffusion-lsp-test.el, one test per Emacs, against the real server.

The install is Debian's emacs-nox and elpa-eglot (Emacs 28.2, eglot 1.9), through
apt-get, and only as root; the tests skip with the reason otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "editors" / "emacs"
PACKAGE = PACKAGE_DIR / "diffusion-lsp.el"
ERT_FILE = Path(__file__).with_name("diffusion-lsp-test.el")
APT_PACKAGES = ("emacs-nox", "elpa-eglot")
INSTALL_TIMEOUT_S = 900  # apt-get update + install, on a slow mirror
EMACS_TIMEOUT_S = 300  # one Emacs run; the ert file bounds its own waits well below this


def emacs_with_eglot() -> str | None:
    """The path of an Emacs that can load eglot, or None."""
    emacs = shutil.which("emacs")
    if emacs is None:
        return None
    probe = subprocess.run([emacs, "--batch", "--eval", "(require 'eglot)"], capture_output=True, text=True, timeout=60)
    return emacs if probe.returncode == 0 else None


def ensure_emacs() -> tuple[str | None, str]:
    """(emacs, why): an Emacs with eglot, installed with apt-get when missing and we are
    root; else (None, the reason to skip)."""
    emacs = emacs_with_eglot()
    if emacs is not None:
        return emacs, "found"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, (
            "Emacs with eglot is missing and cannot be installed here (needs root and apt-get): "
            f"install {' '.join(APT_PACKAGES)} to run the Emacs end-to-end tests"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            return None, f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}"
    emacs = emacs_with_eglot()
    return (emacs, "installed") if emacs else (None, "apt-get installed Emacs, but it cannot load eglot")


def run_ert(
    emacs: str, test: str, home: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one ert test (its full name) in a fresh `emacs --batch`; `extra_env` sets
    DIFFUSION_LSP_TEST_ENDPOINT (and _DIALECT) to fill from a remote engine."""
    env = {
        **os.environ,
        **(extra_env or {}),
        "HOME": str(home),  # nothing of the user's Emacs set-up, nothing written there
        "DIFFUSION_LSP_TEST_SERVER": shlex.join([sys.executable, "-m", "lsp_server"]),
        "DIFFUSION_LSP_TEST_PYTHON": sys.executable,
    }
    cmd = [
        emacs,
        "--batch",
        "-L",
        str(PACKAGE_DIR),
        "-l",
        "ert",
        "-l",
        str(ERT_FILE),
        "--eval",
        f'(ert-run-tests-batch-and-exit "^{test}$")',
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=EMACS_TIMEOUT_S)


def byte_compile(emacs: str, out: Path) -> subprocess.CompletedProcess[str]:
    """Byte-compile a copy of diffusion-lsp.el in `out`, every warning an error."""
    copy = out / PACKAGE.name
    shutil.copyfile(PACKAGE, copy)
    cmd = [
        emacs,
        "--batch",
        "-L",
        str(out),
        "--eval",
        "(setq byte-compile-error-on-warn t)",
        "-f",
        "batch-byte-compile",
        str(copy),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=out, timeout=EMACS_TIMEOUT_S)


def run_eval(emacs: str, form: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Evaluate `form` in `emacs --batch` with the package on the load path."""
    cmd = [emacs, "--batch", "-L", str(PACKAGE_DIR), "--eval", form]
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=EMACS_TIMEOUT_S)
