"""Why bench/crossfile.py's fills miss (issue 43): for each case, the right fill's first token
where the model's greedy choice leaves it, with its rank and probability against the
choice, on the prompt the server lays out (its repository context chosen as the server
chooses it, middle priming as the model's default), in-process. Prints JSON: a row per
case (`matched`: how much of the right fill the greedy choices wrote first; no rank where
they wrote all of it), and the ranks' counts. Never asserted in tests.

    python bench/crossfile_misses.py --model .weights-cache/qwen2.5-coder-0.5b-int8 [--context off]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 80


def server_files(case: Any, fixtures: Path) -> tuple[list[tuple[str, str]], str, str]:
    """What the server hands engine.repository.select for a case (the files the current one
    imports, paths relative to the project's folder), the current path, the project's name."""
    from lsp_server.repository import Repository

    repo = Repository()
    repo.set_folders(sorted(p for p in fixtures.iterdir() if p.is_dir()))
    path = (fixtures / case.project / case.file).resolve()
    folder = repo.folder_of(path)
    assert folder is not None
    out = []
    for imported in repo.imported(path, case.text, case.language):
        text = repo.read(imported)
        if text is not None:
            out.append((str(imported.relative_to(folder)), text))
    return out, str(path.relative_to(folder)), folder.name


def first_miss(gen: Any, req: Any, want: str) -> dict[str, Any]:
    """Follow the right fill token by token while the greedy choice writes it."""
    from engine.fill import FillOptions

    opts = FillOptions()
    den, tok = gen.den, gen.tok
    given = gen._priming(opts, req, gen.default_sampler(False))
    prompt, _ = gen.build_context(opts, req, [], 32, given)
    state = den.prefill(prompt, None)
    healed = given[1] if given else ""
    right = healed + want.rstrip() + "\n"  # the fill must then end its line
    texts = tok.token_texts
    barred = np.zeros(len(texts), dtype=bool)
    barred[[i for i in den.info.suppress_ids if i < len(texts)]] = True
    logits = np.asarray(den.next_logits(state), dtype=np.float64).reshape(-1)[: len(texts)]
    pos = 0
    for _ in range(MAX_TOKENS):
        scores = np.where(barred, -np.inf, logits)
        if pos < len(healed):  # spelling the given characters: only tokens that spell them
            allowed = np.full_like(scores, -np.inf)
            ids = gen.spelling.allowed(healed[pos:])
            allowed[ids] = scores[ids]
            scores = allowed
        p = np.exp(scores - scores.max())
        p /= p.sum()
        greedy = int(np.argmax(scores))
        rest = right[pos:]
        fits = [i for i, t in enumerate(texts) if t and rest.startswith(t) and not barred[i]]
        if rest == "\n" and greedy == tok.special.eof:
            break
        if greedy not in fits:
            best = max(fits, key=lambda i: p[i]) if fits else None
            rank = int(np.flatnonzero(np.argsort(-p) == best)[0]) + 1 if best is not None else None
            return {
                "matched": right[len(healed) : pos],
                "greedy": texts[greedy],
                "p_greedy": round(float(p[greedy]), 4),
                "right": texts[best] if best is not None else None,
                "p_right": round(float(p[best]), 4) if best is not None else 0.0,
                "rank_right": rank,
            }
        pos += len(texts[greedy])
        state, out = den.extend(state, [greedy])
        logits = np.asarray(out[-1], dtype=np.float64).reshape(-1)[: len(texts)]
    return {"matched": right[len(healed) : pos], "rank_right": None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--context", choices=("on", "off"), default="on", help="repository context (default on)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from crossfile import FIXTURES, cut_cases  # noqa: E402 (bench/ on the path)

    from engine.denoisers.loading import load_model
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import LocalGenerator
    from engine.repository import select

    gen = LocalGenerator(load_model(args.model))
    rows = []
    for case in cut_cases():
        prefix, suffix = case.text[: case.at], case.text[case.at :]
        files, current, name = server_files(case, FIXTURES)
        budget = gen.repository_chars(FillOptions())
        pieces = select(files, prefix, suffix, budget, current, []) if args.context == "on" else []
        req = InfillRequest(prefix, suffix, case.language, extra_files=pieces, repository=name, path=current)
        row = {"name": case.name, "want": case.want, **first_miss(gen, req, case.want)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    ranks = Counter(str(r["rank_right"]) for r in rows if r["rank_right"] is not None)
    report = {"model": str(args.model), "context": args.context, "cases": len(rows), "ranks": dict(ranks), "rows": rows}
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
