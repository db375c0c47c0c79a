"""lsp_server/repository.py: repository context is read from the workspace folders only, and
the files a document imports are found in Python, JavaScript and Go; on files written here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lsp_server.repository import MAX_FILE_BYTES, Repository


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Repository, Path]:
    root = tmp_path / "proj"
    root.mkdir()
    repo = Repository()
    repo.set_folders([root])
    return repo, root


def test_a_file_inside_is_read(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    (root / "a.py").write_text("x = 1\n")
    assert repo.read(root / "a.py") == "x = 1\n"


def test_files_outside_the_workspace_are_refused(workspace: tuple[Repository, Path], tmp_path: Path) -> None:
    repo, root = workspace
    secret = tmp_path / "secret.py"
    secret.write_text("TOKEN = 'x'\n")
    assert repo.read(secret) is None
    assert repo.read(root / ".." / "secret.py") is None  # a path that climbs out
    os.symlink(secret, root / "link.py")
    assert repo.read(root / "link.py") is None  # a link that leads out
    assert repo.read(Path("/etc/passwd")) is None


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("node_modules/lib/index.js", b"module.exports = 1\n"),  # an ignored folder
        (".git/config", b"[core]\n"),
        ("big.py", b"x = 1\n" * (MAX_FILE_BYTES // 6 + 1)),  # over the size limit
        ("image.py", b"\x89PNG\0\0binary"),  # binary
        ("latin.py", "caf\xe9 = 1\n".encode("latin-1")),  # not UTF-8
    ],
)
def test_what_is_never_read(workspace: tuple[Repository, Path], name: str, content: bytes) -> None:
    repo, root = workspace
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    assert repo.read(path) is None


@pytest.mark.parametrize(
    ("ignores", "name", "read"),
    [
        ({".gitignore": "secrets.py\n"}, "secrets.py", False),
        ({".gitignore": "secrets.py\n"}, "pkg/secrets.py", False),  # a name without a slash: at any depth
        ({".gitignore": "/secrets.py\n"}, "pkg/secrets.py", True),  # anchored to the folder
        ({".gitignore": "generated/\n"}, "pkg/generated/api.py", False),  # under an ignored folder
        ({".gitignore": "*.py\n!keep.py\n"}, "keep.py", True),  # taken back
        ({"pkg/.gitignore": "local_*.py\n"}, "pkg/local_settings.py", False),  # a nested .gitignore
        ({"pkg/.gitignore": "local_*.py\n"}, "local_settings.py", True),  # ... only below it
        ({}, "secrets.py", True),
    ],
)
def test_what_a_gitignore_ignores_is_never_read(
    workspace: tuple[Repository, Path], ignores: dict[str, str], name: str, read: bool
) -> None:
    repo, root = workspace
    write(root, {**ignores, name: "API_KEY = 'x'\n"})
    assert (repo.read(root / name) is not None) == read
    assert (root / name in repo.imported(root / "main.py", f"import {name[:-3].replace('/', '.')}\n", "python")) == read


def test_a_changed_gitignore_is_read_again(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    write(root, {"a.py": "x = 1\n", ".gitignore": "b.py\n"})
    assert repo.read(root / "a.py") == "x = 1\n"
    (root / ".gitignore").write_text("a.py\n")
    os.utime(root / ".gitignore", (1, 1))
    assert repo.read(root / "a.py") is None


def test_a_changed_file_is_read_again(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    path = root / "a.py"
    path.write_text("x = 1\n")
    assert repo.read(path) == "x = 1\n"
    path.write_text("x = 2\n")
    os.utime(path, (1, 1))
    assert repo.read(path) == "x = 2\n"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_python_imports(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    write(
        root,
        {
            "app/main.py": "",
            "app/stock.py": "",
            "app/util/__init__.py": "",
            "app/util/fmt.py": "",
            "lib/ledger.py": "",
        },
    )
    text = "import lib.ledger\nfrom stock import x\nfrom .util import fmt\nfrom os import path\n"
    got = repo.imported(root / "app" / "main.py", text, "python")
    assert [p.relative_to(root.resolve()).as_posix() for p in got] == [
        "lib/ledger.py",
        "app/stock.py",
        "app/util/__init__.py",
        "app/util/fmt.py",
    ]


def test_javascript_relative_imports(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    write(root, {"src/main.js": "", "src/rates.js": "", "src/lib/index.ts": "", "src/util.ts": ""})
    text = 'import { a } from "./rates.js";\nimport b from "./lib";\nconst c = require("./util");\nimport "react";\n'
    got = repo.imported(root / "src" / "main.js", text, "javascript")
    assert [p.name for p in got] == ["rates.js", "index.ts", "util.ts"]


def test_go_packages_of_the_module(workspace: tuple[Repository, Path]) -> None:
    repo, root = workspace
    write(
        root,
        {
            "go.mod": "module example.com/shop\n\ngo 1.22\n",
            "cmd/main.go": "",
            "cart/cart.go": "",
            "cart/cart_test.go": "",
        },
    )
    text = 'package main\n\nimport (\n\t"fmt"\n\t"example.com/shop/cart"\n)\n'
    got = repo.imported(root / "cmd" / "main.go", text, "go")
    assert [p.name for p in got] == ["cart.go"]


def test_an_import_outside_the_workspace_is_not_followed(workspace: tuple[Repository, Path], tmp_path: Path) -> None:
    repo, root = workspace
    (tmp_path / "outside.py").write_text("SECRET = 1\n")
    write(root, {"main.py": ""})
    assert repo.imported(root / "main.py", "from .. import outside\nimport outside\n", "python") == []
