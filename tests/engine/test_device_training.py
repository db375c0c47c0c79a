"""engine/training/device.py --tiny on the CPU: the H200 training script's code path end to end,
and the split/join of the weights the device tool can only return in parts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.training.device import STEPS, join_file, load_run_recipe, split_file  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_split_join_roundtrip(tmp_path: Path) -> None:
    data = os.urandom(25_001)
    f = tmp_path / "model.safetensors"
    f.write_bytes(data)
    parts = split_file(f, 10_000)
    assert [p["bytes"] for p in parts] == [10_000, 10_000, 5_001] and not f.exists()
    sha = hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError):
        join_file(tmp_path, "0" * 64, keep_parts=True)  # wrong digest: nothing written
    assert not f.exists()
    assert join_file(tmp_path, sha).read_bytes() == data
    assert not list(tmp_path.glob("*.part*"))


def test_h200_recipe_loads() -> None:
    cfg, run, _ = load_run_recipe(REPO / "recipes" / "h200-model.json", tiny=False)
    assert cfg.device == "cuda" and cfg.bf16 and cfg.compile
    assert run["num_workers"] > 0 and run["part_mb"] <= 15


def test_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "engine.training.device", "--tiny", "--out", str(out), "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "train_report.json").read_text())
    assert list(report["steps"]) == list(STEPS)
    assert all(report["steps"][s]["status"] == "ok" for s in STEPS), report["steps"]
    assert len(report["returned_files"]) <= 8
    weights = report["steps"]["save"]["weights"]
    model = out / "model"
    assert len(list(model.glob("model.safetensors.part*"))) == len(weights["parts"]) > 1
    joined = subprocess.run(
        [sys.executable, "-m", "engine.training.device", "join", str(model)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert joined.returncode == 0 and "verified" in joined.stdout, joined.stderr
    target = model / "model.safetensors"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == weights["sha256"]

    from engine.denoisers.loading import load_model
    from engine.fill import InfillRequest
    from engine.local.generator import local_engine

    loaded = load_model(model, backend="torch")
    r = local_engine(loaded).fill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n"))
    assert isinstance(r.text, str) and r.steps >= 1
