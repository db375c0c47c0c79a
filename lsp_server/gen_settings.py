"""Write every client's copy of the settings from `OPTIONS`, the one description of them.

`python -m lsp_server.gen_settings` rewrites the generated regions below; `--check` writes
nothing and exits 1 naming each file whose region is stale (CI runs it). A new setting is a
field of `Settings` and an `Option` in lsp_server/settings.py, then this command.

What is generated, and where:

- editors/vscode/package.json: every `diffusionLsp.<key>` property of
  `contributes.configuration` whose name has no further dot (JSON has no comments: the VS Code
  client's own settings are the dotted ones, `server.python`, `trace.file`, and are kept);
- editors/vscode/src/config.ts: `SERVER_KEYS`, the keys the client sends;
- editors/emacs/diffusion-lsp.el: one defcustom per setting and `diffusion-lsp-settings`,
  the plist sent as initializationOptions (a setting at nil is not sent; booleans always are);
- editors/nvim/doc/diffusion_lsp.txt: the body of the `*diffusion-lsp-settings*` section, from
  its tag line to the next rule (Vim help has no comments to mark it);
- the settings tables of docs/server.md, docs/remote.md (the remote engine's settings) and the
  editors' READMEs;
- README.md's table of backends, from the backend table (engine/models/table.py), between
  `backends:begin` and `backends:end`.

Every other region lies between a line holding `settings:begin` and one holding
`settings:end`, comments in the syntax of its file. The descriptions are plain text with `code` in backticks:
Markdown and Vim help keep the backticks, Emacs docstrings quote `like this'.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.table import TABLE

from .settings import OPTIONS, Client, Option, Settings, schema_property

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python -m lsp_server.gen_settings"
SECTION = "diffusionLsp"
ELISP_WIDTH = 80  # the Emacs client's line width for code
DOC_WIDTH = 70  # Emacs docstrings: the default fill-column
HELP_WIDTH = 78  # Vim help: the file's textwidth (its modeline)
HELP_INDENT = 18  # Vim help: the column of a setting's description, past the longest key
SENTENCE_END = r"(?<=\.)(?<!e\.g\.) (?=[A-Z`])"  # the space after a sentence: "... it. `vllm`: ..."

_DEFAULTS = Settings()


def _default(opt: Option) -> Any:
    return getattr(_DEFAULTS, opt.name)


def _client_default(opt: Option, client: Client) -> Any:
    return dict(opt.client_defaults).get(client, _default(opt))


def _wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """`text` filled to `width`, never breaking inside a `code` span."""
    nbsp = "\u00a0"
    kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", nbsp), text)
    lines = textwrap.wrap(
        kept,
        width,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(nbsp, " ") for line in lines]


def _plain(text: str) -> str:
    return text.replace("`", "")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---- Markdown tables ----


def _md_cell(text: str) -> str:
    if "|" in text or "\n" in text:
        raise ValueError(f"a table cell cannot hold | or a line break: {text!r}")
    return text


def _md_values(opt: Option) -> str:
    if opt.choices is not None:
        return ", ".join(f"`{c}`" for c in opt.choices)
    if opt.kind == "integer":
        return f"{opt.minimum}-{opt.maximum}"
    if opt.kind == "threshold":
        return f"`auto`, {opt.minimum}-{opt.maximum}"
    if opt.kind == "boolean":
        return "`true`, `false`"
    if opt.kind == "strings":
        return "list of strings"
    return "directory" if opt.path else "string"


def _json_default(value: Any, opt: Option) -> str:
    """A default as the docs show it: the unset phrase, `auto`, 2000, true, `[]`."""
    if value is None:
        return opt.unset
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return str(value)


def _lua_default(value: Any, opt: Option) -> str:
    if value is None:
        return f"nil: {opt.unset}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"`'{value}'`"
    if isinstance(value, list):
        return "`{}`" if not value else "`{ " + ", ".join(f"'{v}'" for v in value) + " }`"
    return str(value)


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return out


def docs_table(options: Sequence[Option], remote_only: bool = False) -> list[str]:
    """The settings table of docs/server.md (docs/remote.md: `remote_only`)."""
    rows = [
        [f"`{o.key}`", _json_default(_default(o), o), _md_values(o), o.description]
        for o in options
        if o.remote or not remote_only
    ]
    return _table(("key", "default", "values", "meaning"), rows)


def vscode_table(options: Sequence[Option]) -> list[str]:
    rows = []
    for o in options:
        value = _client_default(o, "vscode")
        default = f"null ({o.unset})" if value is None else _json_default(value, o)
        rows.append([f"`{SECTION}.{o.key}`", default, _md_values(o), o.description])
    return _table(("setting", "default", "values", "what"), rows)


def nvim_table(options: Sequence[Option]) -> list[str]:
    rows = [[f"`{o.key}`", _lua_default(_default(o), o), _md_values(o), o.description] for o in options]
    return _table(("key", "default", "values", "meaning"), rows)


def emacs_table(options: Sequence[Option]) -> list[str]:
    rows = [[f"`{elisp_variable(o)}`", f"`{o.key}`", _emacs_default_cell(o)] for o in options]
    return _table(("variable", "server setting", "default"), rows)


def _emacs_default_cell(opt: Option) -> str:
    default = _emacs_default(opt)
    if default != "nil" or opt.kind in ("boolean", "strings"):
        return default
    if opt.nullable:
        return f"nil: {opt.unset}"
    return f"nil (the server's {_json_default(_default(opt), opt)})"


# ---- VS Code ----


def vscode_property(opt: Option) -> dict[str, Any]:
    """The package.json property of one setting: the server's JSON Schema of it (types, range,
    choices: lsp_server.settings.schema_property) with VS Code's default for it, and its
    description, Markdown where it quotes code."""
    prop = schema_property(opt, _client_default(opt, "vscode"))
    text = opt.description + (f" Unset: {opt.unset}." if opt.nullable else "")
    prop["markdownDescription" if "`" in text else "description"] = text
    return prop


def _is_server_property(name: str) -> bool:
    return name.startswith(f"{SECTION}.") and "." not in name[len(SECTION) + 1 :]


def package_json(text: str, options: Sequence[Option]) -> str:
    """package.json with the server's properties generated where the first of them stood; the
    client's own properties keep their places. JSON indented by 2, as npm writes it."""
    data = json.loads(text)
    props: dict[str, Any] = data["contributes"]["configuration"]["properties"]
    generated = {f"{SECTION}.{o.key}": vscode_property(o) for o in options}
    out: dict[str, Any] = {}
    for name, prop in props.items():
        if not _is_server_property(name):
            out[name] = prop
        elif not any(_is_server_property(n) for n in out):
            out.update(generated)
    if not any(_is_server_property(n) for n in out):
        out.update(generated)
    data["contributes"]["configuration"]["properties"] = out
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def config_ts(options: Sequence[Option]) -> list[str]:
    return [
        "/** The settings the server understands, under their names in package.json and on the wire. */",
        "const SERVER_KEYS = [",
        *(f'  "{o.key}",' for o in options),
        "] as const;",
    ]


# ---- Emacs ----


def elisp_variable(opt: Option) -> str:
    return "diffusion-lsp-" + re.sub(r"(?<!^)([A-Z])", r"-\1", opt.key).lower()


def _elisp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _elisp_value(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "nil"
    if isinstance(value, str):
        return _elisp_string(value)
    return str(value)


def _emacs_default(opt: Option) -> str:
    """A boolean starts at the server's value (it is always sent); anything else at nil: unsent."""
    return _elisp_value(_default(opt)) if opt.kind == "boolean" else "nil"


def _emacs_doc(opt: Option) -> list[str]:
    """The docstring's lines, escaped for the string literal: the description (its first
    sentence on a line of its own when it fits, as checkdoc asks), then the values it takes."""
    if opt.kind in ("boolean", "strings"):
        values = ""
    else:
        what = {
            "integer": f"An integer in {opt.minimum}..{opt.maximum}",
            "string": "A directory" if opt.path else "A string",
            "threshold": f'The string "auto" or a number in {opt.minimum}..{opt.maximum}',
        }
        if opt.choices is not None:
            what["string"] = "One of " + ", ".join(_elisp_value(c) for c in opt.choices)
        unset = opt.unset if opt.nullable else f"the server's default ({_elisp_value(_default(opt))})"
        values = f"{what[opt.kind]}; nil: {_plain(unset)}."
    first, *rest = re.split(SENTENCE_END, opt.description, maxsplit=1)
    if len(first) <= ELISP_WIDTH - 4 and rest:
        lines = [first, *_wrap(rest[0], DOC_WIDTH)]
    elif len(opt.description) <= ELISP_WIDTH - 4:
        lines = [opt.description]
    else:
        lines = _wrap(opt.description, DOC_WIDTH)
    # Emacs quotes `like this', and puts two spaces after a sentence
    lines = [re.sub(r"`([^`]*)`", r"`\1'", line) for line in lines] + _wrap(values, DOC_WIDTH)
    lines = [re.sub(SENTENCE_END, "  ", line) for line in lines]
    lines = [line.replace("\\", "\\\\").replace('"', '\\"') for line in lines]
    # an open parenthesis in column 0 of a docstring confuses Emacs's defun finding: escape it
    return [("\\" + line) if line.startswith("(") else line for line in lines]


def _emacs_type(opt: Option) -> list[str]:
    if opt.kind == "boolean":
        return ["  :type 'boolean)"]
    if opt.kind == "strings":
        return ["  :type '(repeat string))"]
    tag = _capital(_plain(opt.unset)) if opt.nullable else "Server default"
    if opt.choices is not None:
        alternatives = [f"(const {_elisp_string(c)})" for c in opt.choices]
    elif opt.kind == "threshold":
        alternatives = ['(const "auto")', "number"]
    else:
        alternatives = ["integer" if opt.kind == "integer" else "directory" if opt.path else "string"]
    head = f"  :type '(choice (const :tag {_elisp_string(tag)} nil)"
    one_line = f"{head} {' '.join(alternatives)}))"
    if len(one_line) <= ELISP_WIDTH:
        return [one_line]
    indent = " " * len("  :type '(choice ")
    lines, line = [head], indent
    for alt in alternatives:
        if line != indent and len(line) + 1 + len(alt) + 2 > ELISP_WIDTH:
            lines.append(line)
            line = indent
        line += ("" if line == indent else " ") + alt
    lines.append(line + "))")
    return lines


def emacs_defcustom(opt: Option) -> list[str]:
    doc = _emacs_doc(opt)
    doc[0] = '  "' + doc[0]
    doc[-1] += '"'
    return [f"(defcustom {elisp_variable(opt)} {_emacs_default(opt)}", *doc, *_emacs_type(opt)]


def _elisp_sent(opt: Option) -> str:
    """The plist value of one setting, or nil to leave it out."""
    var = elisp_variable(opt)
    if opt.kind == "boolean":
        return f",(if {var} t :json-false)"
    if opt.kind == "strings":
        return f",(and {var} (vconcat {var}))"
    if opt.path:
        return f",(and {var} (expand-file-name {var}))"
    return f",{var}"


def emacs_settings(options: Sequence[Option]) -> list[str]:
    out: list[str] = []
    for opt in options:
        out += [*emacs_defcustom(opt), ""]
    pairs = [f"(:{o.key} . {_elisp_sent(o)})" for o in options]
    indent = " " * len("  (let ((pairs `(")
    out += [
        "(defun diffusion-lsp-settings ()",
        "  \"The `diffusionLsp' settings object (a plist) sent to the server.",
        "Settings left at nil are omitted, so the server's defaults apply; the",
        'booleans are always sent."',
        f"  (let ((pairs `({pairs[0]}",
        *(indent + p for p in pairs[1:]),
    ]
    out[-1] += ")))"
    out.append("    (cl-loop for (key . value) in pairs when value append (list key value))))")
    return out


# ---- Neovim help ----


def _help_values(opt: Option) -> str:
    if opt.choices is not None:
        values = "one of " + ", ".join(f"`'{c}'`" for c in opt.choices)
    else:
        values = {
            "integer": f"integer {opt.minimum}..{opt.maximum}",
            "threshold": f"`'auto'` or a number {opt.minimum}..{opt.maximum}",
            "boolean": "boolean",
            "strings": "list of strings",
            "string": "directory" if opt.path else "string",
        }[opt.kind]
    return f"{values}, default {_lua_default(_default(opt), opt).replace('`', '')}"


def nvim_help(options: Sequence[Option]) -> list[str]:
    out = _wrap(
        "The server's `diffusionLsp` settings, {opts}.settings: sent as initializationOptions and "
        "answered to the server's workspace/configuration requests. The server names an invalid value "
        "in a message and uses its default. All are optional; leave one out (nil) for its default.",
        HELP_WIDTH,
    )
    indent = " " * HELP_INDENT
    for opt in options:
        out.append("")
        out += _wrap(_help_values(opt), HELP_WIDTH, indent, first=f"{opt.key:<{HELP_INDENT}}")
        out += _wrap(opt.description, HELP_WIDTH, indent)
    return [*out, ""]


# ---- regions ----


def _between_markers(text: str, body: list[str], path: str, name: str = "settings") -> str:
    """`text` with the lines between its `name`:begin and `name`:end lines replaced."""
    lines = text.split("\n")
    begin = [i for i, line in enumerate(lines) if f"{name}:begin" in line]
    end = [i for i, line in enumerate(lines) if f"{name}:end" in line]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        raise ValueError(f"{path}: expected one {name}:begin line and one {name}:end line after it")
    return "\n".join([*lines[: begin[0] + 1], *body, *lines[end[0] :]])


def backends_table(_options: Sequence[Option] = ()) -> list[str]:
    """The README's table of the checkpoints each backend loads, from the backend table
    (engine/models/table.py), one row per kind of checkpoint."""
    rows = []
    for r in TABLE:
        types = ", ".join(f"`{t}`" for t in r.model_types)
        weights = ", ".join(f"`{q}`" for q in r.quantizations)
        extra = "; `export-onnx` makes an `onnx` directory of it" if r.exports else ""
        what_, _, command = r.needs.partition(": ")
        install = "the base install" if not r.needs else f"{what_}: `{command}`" if command else what_
        what = r.kind + (f" ({r.released})" if r.released else "") + extra
        rows.append([f"`{r.name}`", types, what, weights, install])
    return _table(["backend", "model_type", "checkpoints", "weights", "needs"], rows)


def _help_section(text: str, body: list[str], path: str) -> str:
    """`text` with the lines between the *diffusion-lsp-settings* tag and the next rule replaced."""
    lines = text.split("\n")
    tags = [i for i, line in enumerate(lines) if line.rstrip().endswith("*diffusion-lsp-settings*")]
    if len(tags) != 1:
        raise ValueError(f"{path}: expected one line ending with the tag *diffusion-lsp-settings*")
    rules = [i for i in range(tags[0] + 1, len(lines)) if re.fullmatch(r"=+", lines[i])]
    stop = rules[0] if rules else len(lines)
    return "\n".join([*lines[: tags[0] + 1], *body, *lines[stop:]])


@dataclass(frozen=True)
class Target:
    path: str  # relative to the repository root
    render: Callable[[str, Sequence[Option]], str]  # (the file's text, options) -> its new text


def _region(path: str, body: Callable[[Sequence[Option]], list[str]]) -> Target:
    return Target(path, lambda text, options: _between_markers(text, body(options), path))


TARGETS: tuple[Target, ...] = (
    Target("editors/vscode/package.json", package_json),
    _region("editors/vscode/src/config.ts", config_ts),
    _region("editors/emacs/diffusion-lsp.el", emacs_settings),
    Target("editors/nvim/doc/diffusion_lsp.txt", lambda text, o: _help_section(text, nvim_help(o), "nvim help")),
    _region("docs/server.md", docs_table),
    _region("docs/remote.md", lambda o: docs_table(o, remote_only=True)),
    _region("editors/vscode/README.md", vscode_table),
    _region("editors/emacs/README.md", emacs_table),
    _region("editors/nvim/README.md", nvim_table),
    Target("README.md", lambda text, _o: _between_markers(text, backends_table(), "README.md", "backends")),
)


def generate(root: Path = ROOT, options: Sequence[Option] = OPTIONS) -> dict[str, tuple[str, str]]:
    """For each generated file (its path relative to `root`): (its text now, the text it should have)."""
    out = {}
    for target in TARGETS:
        text = (root / target.path).read_text(encoding="utf-8")
        out[target.path] = (text, target.render(text, options))
    return out


def stale(root: Path = ROOT, options: Sequence[Option] = OPTIONS) -> list[str]:
    """The generated files whose text differs from what `options` gives."""
    return [path for path, (now, want) in generate(root, options).items() if now != want]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale file")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this checkout)")
    args = parser.parse_args(argv)
    changed = []
    for path, (now, want) in generate(args.root).items():
        if now == want:
            continue
        changed.append(path)
        if args.check:
            sys.stderr.write(f"{path}: stale settings; run `{COMMAND}`\n")
        else:
            (args.root / path).write_text(want, encoding="utf-8")
            sys.stdout.write(f"wrote {path}\n")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
