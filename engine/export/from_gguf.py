"""`diffusion-infill export-onnx --model FILE.gguf --out DIR`: a GGUF file of a Qwen2 or Llama
model straight to the `onnx_lm` directory the base install serves (config.json,
tokenizer.json, model.onnx and its weights), with numpy, onnx and the gguf package: no torch,
no transformers, and one layer in memory at a time (engine/export/graph.py).

The directory is the torch exporter's (engine/training/export_lm.py), graph version and all,
so the server, `pull` and `models` treat both alike. Its config.json records where it came
from (the file's name and sha256) and what the conversion cost here (`conversion`: seconds,
and the process's peak resident memory when it finished), which `models --json` shows.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from engine.errors import InputError
from engine.export.gguf_source import GGUFSource
from engine.export.graph import EXPORT_VERSION, write_graph
from engine.models.directory import CONFIG_FILE, LM_GRAPH_FILE, TOKENIZER_FILE
from engine.models.table import ONNX_LM_MODEL_TYPE

QUANTIZE = ("int4", "int8", "none")


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return round(kb / (1e6 if sys.platform == "darwin" else 1e3), 1)


def export_gguf(
    gguf: Path, out: Path, quantize: str = "int8", sha256: str | None = None, verbose: bool = False
) -> Path:
    """Write the `onnx_lm` directory `out` from the GGUF file `gguf`; `sha256`, when given,
    must be the file's. config.json is written last: a directory without it is unfinished."""
    from engine.commands.convert import sha256_of

    if quantize not in QUANTIZE:
        raise InputError(f"--quantize must be one of {', '.join(QUANTIZE)}; got {quantize!r}")
    start = time.perf_counter()
    if not gguf.is_file():
        raise InputError(f"GGUF file not found: {gguf}")
    digest = sha256_of(gguf)
    if sha256 is not None and digest != sha256.lower():
        raise InputError(f"{gguf}: sha256 is {digest}, not the expected {sha256}: refusing to convert it")
    source = GGUFSource(gguf)
    cfg = dict(source.config)  # read first: an unreadable file leaves nothing behind
    tokenizer = source.tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).unlink(missing_ok=True)  # an interrupted export again is unfinished, not old

    def say(line: str) -> None:
        sys.stderr.write(f"diffusion-infill: {gguf.name}: {line}\n")

    write_graph(source, out / LM_GRAPH_FILE, quantize, say if verbose else None)
    tokenizer.save(str(out / TOKENIZER_FILE))
    cfg["diffusion_lsp"] = {
        "source": {"gguf": gguf.name, "sha256": digest},
        "source_model_type": source.arch,
        "quantization": quantize,
        "graph": LM_GRAPH_FILE,
        "export_version": EXPORT_VERSION,
        "conversion": {
            "tool": "gguf",
            "seconds": round(time.perf_counter() - start, 2),
            "peak_rss_mb": peak_rss_mb(),
        },
    }
    exported = {**cfg, "model_type": ONNX_LM_MODEL_TYPE}
    (out / CONFIG_FILE).write_text(json.dumps(exported, indent=2) + "\n", encoding="utf-8")
    return out


def is_gguf(path: Path) -> bool:
    """A GGUF file (by its magic), not a directory."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
