"""The exported model's two costs (`diffusion-infill export-onnx`): encoding a context
(prompt tokens a second) and one more token of the one-token mode, at a few context
lengths, on a held-out file. Prints JSON; never asserted in tests.

    python bench/onnx_lm_step.py --model DIR [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from engine.denoisers.base import Prompt
from engine.denoisers.loading import load_model


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=10, help="tokens decoded one at a time after each context")
    args = p.parse_args()
    loaded = load_model(args.model)
    den, tok = loaded.denoiser, loaded.tokenizer
    src = (Path(sysconfig.get_paths()["stdlib"]) / "email" / "_header_value_parser.py").read_text()
    ids = tok.encode(src)
    rows = []
    for n in (64, 256, 768):
        prompt = Prompt(prefix=tuple(ids[:n]), suffix=tuple(ids[n : n + n // 3]))
        t = time.perf_counter()
        state = den.prefill(prompt)
        encode_s = time.perf_counter() - t
        steps = []
        for i in range(args.repeats):
            t = time.perf_counter()
            state, _ = den.extend(state, [ids[n + i]])  # type: ignore[attr-defined]
            steps.append((time.perf_counter() - t) * 1000)
        rows.append(
            {
                "context_tokens": len(prompt.prefix) + len(prompt.suffix) + 3,
                "encode_ms": round(encode_s * 1000),
                "prompt_tokens_per_s": round((len(prompt.prefix) + len(prompt.suffix)) / encode_s),
                "one_token_p50_ms": round(statistics.median(steps), 1),
            }
        )
    json.dump({"model": str(args.model), "rows": rows, "when": time.strftime("%Y-%m-%d")}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
