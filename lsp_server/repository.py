"""Where repository context comes from (issue 43; docs/server.md, Repository context): the
other open documents, and the files the current one imports that lie inside a workspace
folder, read from disk. The pieces of them a fill gets are chosen by engine.repository.

Only files inside the workspace folders are read: never a path outside them (a `..` or a
link that leads out is refused), nothing under an ignored folder (IGNORED_DIRS), nothing a
`.gitignore` of the folder ignores (the folder's own and those of the folders on the way
down, each matched as git matches it, by pathspec), no file over MAX_FILE_BYTES, none that
is not UTF-8 text. A file is read again only when its modification time changed, a
`.gitignore` too. The `repositoryContext` setting turns it all off.

What the current file imports, by language:
- Python: `import a.b` and `from a.b import c` (from the file's folder and from each
  workspace folder; `from . import x`, `from .m import x` from the file's package);
- JavaScript and TypeScript: relative `import ... from "./m"` and `require("./m")` (with
  the usual extensions and `index` files);
- Go: the packages of the workspace's module (`go.mod`'s module path) that the file
  imports, their `.go` files but tests.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from pathspec import GitIgnoreSpec

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 200_000
MAX_IMPORTED = 12  # files read for one document
IGNORED_DIRS = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox", "dist", "build", "vendor"}
)
_PY_IMPORT = re.compile(r"^\s*(?:from\s+(\.*)([\w.]*)\s+import\s+([\w, ()*]+)|import\s+([\w.]+))", re.M)
_JS_IMPORT = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(?\s*|\brequire\s*\(\s*)["'](\.{1,2}/[^"']+)["']""")
_GO_IMPORT = re.compile(r'"([\w./-]+)"')
_GO_MODULE = re.compile(r"^module\s+(\S+)", re.M)
JS_EXTENSIONS = ("", ".js", ".ts", ".jsx", ".tsx", ".mjs", ".cjs", "/index.js", "/index.ts")


class Repository:
    """The workspace's files as repository context, read from disk within its folders."""

    def __init__(self) -> None:
        self.folders: list[Path] = []
        self._read: dict[Path, tuple[float, str | None]] = {}
        self._ignores: dict[Path, tuple[float, GitIgnoreSpec | None]] = {}  # a folder's .gitignore, by its mtime

    def set_folders(self, folders: list[Path]) -> None:
        self.folders = [f.resolve() for f in folders if f.is_dir()]

    def folder_of(self, path: Path) -> Path | None:
        """The workspace folder that holds `path` (None: none does)."""
        try:
            resolved = path.resolve()
        except OSError:
            return None
        for folder in self.folders:
            if resolved.is_relative_to(folder):
                rest = resolved.relative_to(folder).parts
                return None if IGNORED_DIRS.intersection(rest) or self._ignored(folder, rest) else folder
        return None

    def _ignored(self, folder: Path, rest: tuple[str, ...]) -> bool:
        """Whether a `.gitignore` on the way from `folder` down to the file at `rest` ignores it."""
        here = folder
        for depth in range(len(rest)):
            spec = self._ignore_spec(here)
            if spec is not None and spec.match_file("/".join(rest[depth:])):
                return True
            here = here / rest[depth]
        return False

    def _ignore_spec(self, directory: Path) -> GitIgnoreSpec | None:
        """The patterns of `directory`'s .gitignore (None: it has none)."""
        path = directory / ".gitignore"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._ignores.get(directory)
        if cached is None or cached[0] != mtime:
            try:
                spec: GitIgnoreSpec | None = GitIgnoreSpec.from_lines(path.read_text(encoding="utf-8").splitlines())
            except (OSError, UnicodeDecodeError, ValueError):
                spec = None
            cached = self._ignores[directory] = (mtime, spec)
        return cached[1]

    def read(self, path: Path) -> str | None:
        """The text of a file inside the workspace, or None (outside it, ignored, too big,
        binary, unreadable)."""
        if self.folder_of(path) is None:
            return None
        try:
            stat = path.resolve().stat()
        except OSError:
            return None
        cached = self._read.get(path)
        if cached is not None and cached[0] == stat.st_mtime:
            return cached[1]
        text: str | None = None
        if stat.st_size <= MAX_FILE_BYTES and path.is_file():
            try:
                data = path.read_bytes()
                text = None if b"\0" in data else data.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        self._read[path] = (stat.st_mtime, text)
        return text

    def imported(self, path: Path, text: str, language: str) -> list[Path]:
        """The files `text` (the document at `path`) imports, inside the workspace."""
        if language == "python":
            found = self._python(path, text)
        elif language in ("javascript", "typescript", "tsx", "javascriptreact", "typescriptreact"):
            found = self._javascript(path, text)
        elif language == "go":
            found = self._go(path, text)
        else:
            found = []
        out: list[Path] = []
        for f in found:
            if f != path and f not in out and f.is_file() and self.folder_of(f) is not None:
                out.append(f)
        return out[:MAX_IMPORTED]

    def _python(self, path: Path, text: str) -> list[Path]:
        roots = [path.parent, *self.folders]
        out = []
        for m in _PY_IMPORT.finditer(text):
            dots, module, names, plain = m.group(1), m.group(2), m.group(3), m.group(4)
            if plain:
                out += _python_module(roots, plain)
                continue
            base = [path.parent.joinpath(*([".."] * (len(dots) - 1)))] if dots else roots
            if module:
                out += _python_module(base, module)
            for name in re.findall(r"\w+", names or ""):  # `from pkg import module`
                out += _python_module(base, f"{module}.{name}" if module else name)
        return out

    def _javascript(self, path: Path, text: str) -> list[Path]:
        out = []
        for spec in _JS_IMPORT.findall(text):
            target = path.parent / spec
            out += [Path(f"{target}{ext}") for ext in JS_EXTENSIONS if Path(f"{target}{ext}").is_file()][:1]
        return out

    def _go(self, path: Path, text: str) -> list[Path]:
        folder = self.folder_of(path)
        mod = folder / "go.mod" if folder is not None else None
        module_text = self.read(mod) if mod is not None else None
        m = _GO_MODULE.search(module_text or "")
        if folder is None or m is None:
            return []
        out = []
        for spec in _GO_IMPORT.findall(text):
            if spec == m.group(1) or spec.startswith(m.group(1) + "/"):
                package = folder / spec[len(m.group(1)) :].lstrip("/")
                if package.is_dir():
                    out += sorted(p for p in package.glob("*.go") if not p.name.endswith("_test.go"))
        return out


def _python_module(roots: list[Path], dotted: str) -> list[Path]:
    """`a.b` as `a/b.py` or `a/b/__init__.py` under the first root that has it."""
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        return []
    for root in roots:
        module = root.joinpath(*parts)
        for candidate in (module.with_suffix(".py"), module / "__init__.py"):
            if candidate.is_file():
                return [candidate.resolve()]
    return []
