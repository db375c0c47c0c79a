"""Emacs end to end: the real Emacs and eglot, editors/emacs/diffusion-lsp.el, the real
diffusion-lsp and the shipped model. Each test runs one ert test of
diffusion-lsp-test.el (which says what it checks) in its own `emacs --batch`.

Set-up: Debian's emacs-nox and elpa-eglot are installed with apt-get when Emacs is
missing and we are root; otherwise these tests skip, saying so.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e import emacs_harness
from tests.real_engine import RunningEngine

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def emacs() -> str:
    started = time.monotonic()
    path, why = emacs_harness.ensure_emacs()
    if path is None:
        pytest.skip(why)
    print(f"emacs: {path} ({why} in {time.monotonic() - started:.1f} s)")
    return path


def check(emacs: str, test: str, home: Path, extra_env: dict[str, str] | None = None) -> str:
    """Run ert test `test` and fail with its output unless it passed."""
    done = emacs_harness.run_ert(emacs, test, home, extra_env)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Ran 1 tests, 1 results as expected" in output, output[-6000:]
    return output


def test_byte_compiles_without_warnings(emacs: str, tmp_path: Path) -> None:
    done = emacs_harness.byte_compile(emacs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "diffusion-lsp.elc").is_file()


def test_settings_are_sent_as_initialization_options(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-initialization-options", tmp_path)


def test_completion_at_point_offers_and_inserts_the_fill(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-completion-at-point", tmp_path)


def test_inline_overlay_appears_and_tab_accepts_it(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-inline-overlay-tab-accepts", tmp_path)


def test_inline_overlay_is_accepted_a_word_then_the_rest(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-inline-accept-word-then-tab", tmp_path)


def test_drafts_show_the_fill_as_it_forms(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-drafts", tmp_path)


def test_inline_overlay_is_dismissed_by_the_next_command_or_an_edit(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-inline-dismissed", tmp_path)


def test_inline_mode_asks_by_itself_after_an_edit(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-inline-asks-after-an-edit", tmp_path)


def test_fill_all_holes_replaces_both_holes(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-fill-all-holes", tmp_path)


def test_fill_all_holes_leaves_the_file_parsing(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-fill-all-holes-parses", tmp_path)


def test_regenerate_region_replaces_the_region(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-regenerate-region", tmp_path)


def test_regenerate_region_leaves_the_file_parsing(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-regenerate-region-parses", tmp_path)


def test_second_request_is_served_and_the_first_dropped(emacs: str, tmp_path: Path) -> None:
    output = check(emacs, "diffusion-lsp-test-second-request-supersedes-first", tmp_path)
    print(next(line for line in output.splitlines() if "the first request was answered" in line))


def test_next_edit_is_shown_and_applied(emacs: str, tmp_path: Path) -> None:
    check(emacs, "diffusion-lsp-test-next-edit", tmp_path)


def test_loading_changes_nothing_until_the_mode_is_on(emacs: str, tmp_path: Path) -> None:
    """Emacs convention: loading a package must not take modes from their usual servers."""
    probe = (
        "(progn (require 'eglot) (let ((before (copy-tree eglot-server-programs)))"
        " (require 'diffusion-lsp)"
        ' (princ (format "loaded:%s " (equal before eglot-server-programs)))'
        " (diffusion-lsp-eglot-mode 1)"
        ' (princ (format "on:%s " (eq (cdr (car eglot-server-programs)) #\'diffusion-lsp--contact)))'
        " (diffusion-lsp-eglot-mode -1)"
        ' (princ (format "off:%s" (equal before eglot-server-programs)))))'
    )
    done = emacs_harness.run_eval(emacs, probe, tmp_path)
    assert "loaded:t on:t off:t" in done.stdout, done.stdout + done.stderr


@pytest.fixture()
def remote_env(real_engine: RunningEngine) -> dict[str, str]:
    """The environment that points the ert tests at llama.cpp's server (endpoint, dialect)."""
    return {"DIFFUSION_LSP_TEST_ENDPOINT": real_engine.url, "DIFFUSION_LSP_TEST_DIALECT": "llama-infill"}


@pytest.mark.parametrize(
    "test",
    [
        "diffusion-lsp-test-inline-overlay-tab-accepts",
        "diffusion-lsp-test-fill-all-holes-parses",
        "diffusion-lsp-test-drafts",
    ],
)
def test_a_remote_engine_serves_emacs(emacs: str, tmp_path: Path, remote_env: dict[str, str], test: str) -> None:
    """The same ert tests with the fills from llama.cpp's server (diffusion-lsp-endpoint
    and diffusion-lsp-dialect set): the overlay and TAB, Fill all holes, drafts."""
    check(emacs, test, tmp_path, remote_env)
