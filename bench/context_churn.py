"""How often repository context would change from one line to the next if it were chosen
again on every line: for each of a file's lines in turn (the cursor where the line's text
starts), the pieces engine.repository.select chooses from the files it imports in the
workspace, within the default budget; a change means the block, which comes first in the
prompt, would be encoded again whole. Deterministic (no model, no timing). Prints JSON.

    python bench/context_churn.py FILE [FILE ...] [--workspace DIR] [--lines 80]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.local.generator import CHARS_PER_CONTEXT_TOKEN, DEFAULT_CONTEXT_TOKENS, REPOSITORY_SHARE
from engine.repository import select
from lsp_server.repository import Repository


def churn(workspace: Path, path: Path, lines: int, budget: int) -> dict[str, object]:
    repo = Repository()
    repo.set_folders([workspace])
    text = path.read_text(encoding="utf-8")
    files = [(str(p.relative_to(workspace)), repo.read(p)) for p in repo.imported(path, text, "python")]
    files = [(name, body) for name, body in files if body]
    rows = text.split("\n")
    starts = [0]
    for row in rows:
        starts.append(starts[-1] + len(row) + 1)
    first = len(rows) // 3
    previous, changes, seen = None, 0, 0
    for i in range(first, min(first + lines, len(rows))):
        at = starts[i] + len(rows[i]) - len(rows[i].lstrip())
        chosen = tuple(select(files, text[:at], text[at:], budget, str(path.relative_to(workspace))))
        changes += previous is not None and chosen != previous
        previous, seen = chosen, seen + 1
    return {"imported_files": len(files), "lines": seen, "changes": changes}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--workspace", type=Path, default=Path.cwd())
    p.add_argument("--lines", type=int, default=80, help="consecutive lines, from a third of the way down")
    args = p.parse_args()
    budget = int(DEFAULT_CONTEXT_TOKENS * REPOSITORY_SHARE * CHARS_PER_CONTEXT_TOKEN)
    workspace = args.workspace.resolve()
    report = {
        "budget_chars": budget,
        "files": {str(f): churn(workspace, f.resolve(), args.lines, budget) for f in args.files},
        "when": time.strftime("%Y-%m-%d"),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
