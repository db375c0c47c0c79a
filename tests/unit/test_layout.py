"""The layout keeps the runtime apart from training and evaluation: the language
server, from start to a fill with the shipped model, imports neither torch nor any
module of engine.training or engine.evaluation (docs/engine.md, Layout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import asyncio, json, sys
from engine.fill import InfillRequest
from lsp_server.server import create_server
from lsp_server.service import REGION
from lsp_server.settings import Settings
server = create_server()
assert server.fills.load(Settings()) is None, server.fills.load_error
server.fills.ready.set()
request = InfillRequest("def add(a, b):\\n    return ", "\\n", "python")
answer = asyncio.run(server.fills.fill("file:///a.py", request, REGION))
print(json.dumps(sorted(sys.modules)))
"""


def test_the_server_imports_no_torch_training_or_evaluation() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "engine.local.generator" in modules and "onnxruntime" in modules  # the probe did load and fill
    forbidden = [
        m
        for m in modules
        if m.split(".")[0] in {"torch", "transformers", "safetensors"}
        or m.startswith(("engine.training", "engine.evaluation"))
    ]
    assert forbidden == []
