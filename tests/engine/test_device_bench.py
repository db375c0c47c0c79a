"""bench/device.py --tiny on the CPU: the H200 script's code runs and writes well-formed JSON.

The real run needs an H200 (docs/gpu.md); this only checks that every part runs or is
skipped with a reason, and that our denoising step agrees with transformers' forward.
No timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "device.py"


def run_tiny(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "device.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_tiny_run_writes_every_part(tmp_path: Path) -> None:
    data = run_tiny(tmp_path, "--onnx", "--onnx-repeats", "3")
    assert data["setup"]["installed"] == "already present"
    assert data["machine"]["transformers"] and data["model"]["dtype"] == "torch.float32"
    assert data["model"]["experts_implementation"] == "grouped_mm"
    for name in ("eager", "static"):
        check = data["check"][name]
        assert check["status"] == "ok" and check["passed"] is True
        assert check["first"]["rel_error"] <= check["tolerance"] and check["first"]["argmax_agree"] == 1.0
        assert data["step"][name]["status"] == "ok" and data["step"][name]["median_ms"] > 0
    for name in ("experts_eager", "experts_batched_mm"):
        assert data["step"][name]["status"] == "ok" and data["step"][name]["passed"] is True
    # GPU-only parts are skipped on the CPU, each with its reason
    assert data["check"]["graph"] == data["step"]["graph"]
    assert data["step"]["graph"]["status"] == "skipped" and "CUDA" in data["step"]["graph"]["reason"]
    assert data["step"]["fp8"]["status"] == "skipped"
    assert data["canvas"]["generate_compiled"]["status"] == "skipped"
    for name in ("ours_eager", "ours_static", "generate_eager"):
        entry = data["canvas"][name]
        assert entry["status"] == "ok" and entry["median_ms"] > 0
    assert data["canvas"]["ours_static"]["steps"] == 16  # the full canvas: no early stop
    assert data["onnx"]["cpu"]["warm_p50_ms"] > 0 and data["onnx"]["cases"] == 3
    assert data["onnx"]["cuda"]["status"] == "skipped"
    assert data["elapsed_s"] <= data["budget_s"]


def test_budget_guard_skips_and_still_writes(tmp_path: Path) -> None:
    data = run_tiny(tmp_path, "--budget-s", "1")
    assert data["parts"]["diffusion_gemma"]["status"] == "skipped"
    assert "budget" in data["parts"]["diffusion_gemma"]["reason"]
    assert "check" not in data and data["budget_s"] == 1.0
