"""The dream backend's costs on a checkpoint: one bidirectional denoising step at canvas C
against a context of P tokens, exact (the whole sequence every step) and with the dual
cache (the first step of a fill, then the later ones: canvas + 1 queries), and the
one-token mode (encoding the context causally, then one token). Medians over repeats,
with a float32 matrix product of the model's width timed in the same run to normalise
across machines. Prints JSON; never asserted in tests.

    python bench/dream_step.py --model DIR [--context 1024] [--canvas 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.denoisers.dream import DreamDenoiser
from engine.denoisers.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--canvas", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    den = loaded.denoiser
    assert isinstance(den, DreamDenoiser)
    tok, sp = loaded.tokenizer, loaded.tokenizer.special
    source = (ROOT / "engine" / "sampler.py").read_text()
    code = tok.encode(source)
    suffix, prefix = code[: args.context // 4], code[args.context // 4 : args.context - 3]
    ctx = [sp.suffix, *suffix, sp.prefix, *prefix, sp.middle]
    canvas = torch.full((1, args.canvas), den.info.mask_id)
    state = den.prefill(ctx)
    exact = median_ms(lambda: den.denoise(state, canvas), args.repeats)
    dual_den = DreamDenoiser(den.model, den.sp, autoregressive=False, cache="dual", suppress_ids=den.info.suppress_ids)
    dual_state = dual_den.prefill(ctx)

    def first_dual() -> None:
        dual_den._dual = None
        dual_den.denoise(dual_state, canvas)

    dual_first = median_ms(first_dual, args.repeats)
    dual_later = median_ms(lambda: dual_den.denoise(dual_state, canvas), args.repeats)
    report: dict[str, Any] = {
        "model": str(args.model),
        "parameters_m": round(sum(p.numel() for p in den.model.parameters()) / 1e6, 1),
        "context_tokens": len(ctx),
        "canvas_tokens": args.canvas,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "denoise_step_exact_ms": exact,
        "denoise_step_dual_first_ms": dual_first,
        "denoise_step_dual_later_ms": dual_later,
        "dual_later_over_exact": round(dual_later / exact, 3),
    }
    if den.info.autoregressive:
        report["encode_causal_ms"] = median_ms(lambda: den.prefill(ctx), args.repeats)
        report["one_token_ms"] = median_ms(lambda: den.extend(state, [tok.encode("x")[0]]), args.repeats)
    width = int(den.model.config.hidden_size)
    a, b = torch.randn(1024, width), torch.randn(width, width)
    report["matmul_1024xWxW_ms"] = median_ms(lambda: a @ b, 20)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
