"""How closely exports of one checkpoint (`diffusion-infill export-onnx`) follow a reference
export of it (float32: `--quantize none`), token by token: over windows of held-out code
written as the middle of an empty fill, the share of positions where an export's most
likely next token is the reference's, and the mean KL divergence of its next-token
distribution from the reference's. Finer than the held-out eval, whose fills change
wholesale when one near-tie flips. Prints JSON; never asserted in tests.

    python bench/export_fidelity.py --reference DIR --model DIR [--model DIR ...] [--windows N] [--tokens T]

The code: the standard library's json/, email/ and http/ packages (the held-out eval's),
every third file with more than 600 tokens, the tokens from the 300th on.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.denoisers.base import Prompt
from engine.denoisers.loading import load_model

PACKAGES = ("json", "email", "http")


def windows(tokenize: Callable[[str], Sequence[int]], count: int, tokens: int) -> list[list[int]]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for p in PACKAGES for f in (lib / p).rglob("*.py"))
    out: list[list[int]] = []
    for f in files[::3]:
        ids = tokenize(f.read_text(encoding="utf-8"))
        if len(ids) > 300 + tokens:
            out.append(list(ids[300 : 300 + tokens]))
        if len(out) == count:
            break
    return out


def log_probs(den: Any, texts: list[list[int]]) -> list[np.ndarray]:
    """Per window, the log-probabilities (T, V) of each next token, the window written as
    the middle of a fill with no prefix and no suffix."""
    out = []
    state = den.prefill(Prompt(prefix=(), suffix=()))  # extend leaves it as it was
    for ids in texts:
        _, logits = den.extend(state, ids)
        z = np.asarray(logits, dtype=np.float64)
        z -= z.max(axis=-1, keepdims=True)
        out.append(z - np.log(np.exp(z).sum(axis=-1, keepdims=True)))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--reference", type=Path, required=True, help="the float32 export")
    p.add_argument("--model", type=Path, action="append", required=True, help="an export to compare (repeat)")
    p.add_argument("--windows", type=int, default=12)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    loaded = load_model(args.reference)
    texts = windows(loaded.tokenizer.encode, args.windows, args.tokens)
    reference = log_probs(loaded.denoiser, texts)
    del loaded  # one model in memory at a time
    rows = {}
    for model in args.model:
        agree = kl = 0.0
        for ref, got in zip(reference, log_probs(load_model(model).denoiser, texts), strict=True):
            agree += float((got.argmax(-1) == ref.argmax(-1)).sum())
            kl += float((np.exp(ref) * (ref - got)).sum())
        n = sum(len(t) for t in texts)
        rows[str(model)] = {"top1_agreement": round(agree / n, 4), "mean_kl": round(kl / n, 5)}
    report = {
        "reference": str(args.reference),
        "positions": sum(len(t) for t in texts),
        "models": rows,
        "when": time.strftime("%Y-%m-%d"),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
