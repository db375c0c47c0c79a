"""The real language server with a scripted model: for LSP tests whose outcome must not
depend on what the shipped weights happen to write.

    python tests/lsp/scripted_server.py --script SCRIPT.json [diffusion-lsp options]
    python tests/lsp/scripted_server.py --script-json '{"default": "x = 1"}' [...]

runs `lsp_server`'s own main (real pygls over stdio, real settings, engine, sampler,
spans and syntax validation), with one thing replaced: the model loader the fill service
calls (`engine.opener.load_model`). The model it loads has the real tokenizer and
config.json of the model directory (the shipped one unless the settings name another;
a directory that does not exist fails to load as it would for real), and a
`ScriptedDenoiser` whose logits are peaked on the tokens of a chosen fill, then
end-of-fill, then padding, so the real absorbing sampler writes exactly that fill.
Whether the server then uses it (validation, truncation, blank fills, edits) is the
server's logic, which is what the tests check.

The script (a JSON object):

    {
      "rules": [                              first match wins
        {"after": "def area(w, h):\\n    ",    the text before the fill ends with this
         "before": "\\n",                      the text after the fill starts with this
         "contains": "perimeter",             the text around the fill (prefix + suffix,
                                              as the model sees it) contains this
         "fill": "return w * h",              what to write; a list: one fill per candidate
                                              row (the last repeats for further rows)
         "delay_ms": 2000},                   this rule's own step delay (a slow fill)
        ...
      ],
      "default": "pass",                      when no rule matches ("" when absent)
      "delay_ms": 0,                          sleep in each denoising step (a slow model)
      "defaults": {...}                       infill/sampler defaults over SCRIPTED_DEFAULTS
    }

Every key of a rule other than "fill" is optional; all the given ones must hold. The
prefix and suffix are decoded from the context token ids `encode` is given, so they are
what the engine kept of the document (trimmed to the context budget).

A blank fill ("") is written as it is only where the fill's line holds other text: on
a line of nothing but indentation (a hole's line, too) the engine bars end-of-fill at
the first position, and the fake's logits are flat there, so it writes an arbitrary
token instead. Fills longer than the canvas (canvas_tokens) are cut to it.

`scripted_command(script)` is the server command line for pytest-lsp's
ClientServerConfig or lsp_server.client.StdioClient.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: sys.path[0] is tests/lsp
    sys.path.insert(0, str(ROOT))

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, RandomSource, as_prompt, host_array  # noqa: E402
from engine.denoisers.kv import denoiser_info  # noqa: E402
from engine.denoisers.layouts import suffix_first  # noqa: E402
from engine.denoisers.loading import LoadedModel  # noqa: E402
from engine.denoisers.onnx import NumpyRandomSource  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.models.directory import DEFAULT_MODEL_DIR, TOKENIZER_FILE, read_config  # noqa: E402
from engine.models.table import BACKENDS  # noqa: E402
from engine.models.tokenizer import Tokenizer  # noqa: E402

PEAK = 30.0  # logit of the scripted token; every other token has 0: p(scripted) ~ 1 - V e^-30
# Infill and sampler defaults of the scripted model: pinned here, not read from the
# shipped config.json, so that a new shipped model (other defaults) changes no outcome.
SCRIPTED_DEFAULTS: dict[str, Any] = {
    "canvas_tokens": 32,
    "context_tokens": 256,
    "max_steps": 32,
    "strategy": "entropy_bound",
    "entropy_bound": 1.0,
    "drafter": False,
}


@dataclass(frozen=True)
class Rule:
    fills: tuple[str, ...]
    after: str | None = None
    before: str | None = None
    contains: str | None = None
    delay_ms: float | None = None

    def matches(self, prefix: str, suffix: str) -> bool:
        return (
            (self.after is None or prefix.endswith(self.after))
            and (self.before is None or suffix.startswith(self.before))
            and (self.contains is None or self.contains in prefix + suffix)
        )


def _fills(value: Any, where: str) -> tuple[str, ...]:
    fills = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else ()
    if not fills or not all(isinstance(f, str) for f in fills):
        raise ValueError(f"{where}: a fill is a string or a non-empty list of strings; got {value!r}")
    return fills


@dataclass(frozen=True)
class Script:
    rules: tuple[Rule, ...] = ()
    default: tuple[str, ...] = ("",)
    delay_ms: float = 0.0
    defaults: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Script:
        unknown = set(raw) - {"rules", "default", "delay_ms", "defaults"}
        if unknown:
            raise ValueError(f"unknown script keys: {sorted(unknown)}")
        rules = []
        for i, r in enumerate(raw.get("rules", [])):
            extra = set(r) - {"fill", "after", "before", "contains", "delay_ms"}
            if extra or "fill" not in r:
                raise ValueError(
                    f"rule {i}: needs 'fill', may have after/before/contains/delay_ms; got keys {sorted(r)}"
                )
            delay = float(r["delay_ms"]) if "delay_ms" in r else None
            rules.append(
                Rule(_fills(r["fill"], f"rule {i}"), r.get("after"), r.get("before"), r.get("contains"), delay)
            )
        return cls(
            rules=tuple(rules),
            default=_fills(raw.get("default", ""), "default"),
            delay_ms=float(raw.get("delay_ms", 0)),
            defaults=tuple({**SCRIPTED_DEFAULTS, **raw.get("defaults", {})}.items()),
        )

    def fills_for(self, prefix: str, suffix: str) -> tuple[tuple[str, ...], float]:
        """The fills for this context and the delay of each denoising step (ms)."""
        rule = next((r for r in self.rules if r.matches(prefix, suffix)), None)
        if rule is None:
            return self.default, self.delay_ms
        return rule.fills, self.delay_ms if rule.delay_ms is None else rule.delay_ms


class ScriptedDenoiser:
    """A Denoiser (engine/denoisers/base.py) with known logits: the context chooses the
    fills (`Script.fills_for`), and each canvas row's logits are peaked on its fill's
    tokens, then end-of-fill, then padding. The logits do not depend on the canvas, so
    every strategy, a refinement and a warm start all end at the scripted text."""

    def __init__(self, tokenizer: Tokenizer, info: DenoiserInfo, script: Script) -> None:
        self.tok = tokenizer
        self.info = info
        self.script = script
        self.layout = suffix_first(tokenizer)  # the shipped model's order, with its markers

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        prompt = as_prompt(prompt)
        prefix, suffix = self.tok.decode([*prompt.prefix, *prompt.middle]), self.tok.decode(list(prompt.suffix))
        texts, delay_ms = self.script.fills_for(prefix, suffix)
        fills = [self.tok.encode(f) for f in texts]
        return EncodedContext(token_ids=self.layout.ids(prompt), payload=(fills, delay_ms), nbytes=64)

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> Any:
        fills: list[list[int]]
        fills, delay_ms = state.payload
        if delay_ms:
            time.sleep(delay_ms / 1000)
        b, c = np.asarray(canvas_ids).shape
        logits = np.zeros((b, c, self.info.vocab_size), dtype=np.float32)
        for row in range(b):
            ids = fills[min(row, len(fills) - 1)]
            want = [*ids, self.info.eof_id] + [self.info.pad_id] * c
            logits[row, np.arange(c), want[:c]] = PEAK
        return logits

    def as_array(self, values: Any) -> np.ndarray:
        return host_array(values)

    def random_source(self, seed: int | None) -> RandomSource:
        return NumpyRandomSource(seed)


def scripted_loader(script: Script) -> Any:
    """A stand-in for engine.models.directory.load_model: the directory's config.json and
    tokenizer.json, read and checked as the real loader does, with a ScriptedDenoiser."""

    def load_model(
        path: Path | None = None, backend: str = "auto", device: str = "cpu", quantization: str = "none"
    ) -> LoadedModel:
        path = Path(path) if path is not None else DEFAULT_MODEL_DIR
        if backend not in BACKENDS:
            raise ModelLoadError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        cfg = read_config(path)  # a missing directory fails here, with the real message
        tok = Tokenizer.from_file(path / TOKENIZER_FILE)
        # the real special ids and vocabulary; no autoregressive mode (the fake has no
        # next-token head, and candidates are then ranked by the canvas's confidence)
        info = replace(denoiser_info(cfg), autoregressive=False)
        if tok.vocab_size > info.vocab_size:
            raise ModelLoadError(f"{path}: tokenizer.json has more tokens than config.json says")
        den = ScriptedDenoiser(tok, info, script)
        return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="scripted", defaults=dict(script.defaults))

    return load_model


def scripted_command(script: dict[str, Any], *server_args: str) -> list[str]:
    """The command line that starts the scripted server with `script`."""
    Script.parse(script)  # a bad script fails in the test, not in the server
    return [sys.executable, str(Path(__file__).resolve()), "--script-json", json.dumps(script), *server_args]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--script", type=Path, help="the script, a JSON file")
    group.add_argument("--script-json", help="the script, as JSON text")
    args, rest = p.parse_known_args(argv)
    raw = json.loads(args.script.read_text(encoding="utf-8") if args.script else args.script_json)
    script = Script.parse(raw)

    import engine.opener
    from lsp_server.__main__ import main as server_main

    engine.opener.load_model = scripted_loader(script)
    return server_main(rest)


if __name__ == "__main__":
    sys.exit(main())
