"""What the held-out eval records for calibrating confidence (engine/evaluation/heldout.py):
each fill's confidence with its outcome, per kind and pooled, and the calibration of them.
It checks the report's shape and consistency, never what the shipped weights write."""

from __future__ import annotations

from pathlib import Path

from engine.denoisers.loading import load_model
from engine.evaluation.heldout import KINDS, evaluate_dir
from engine.local.generator import local_engine
from engine.models.directory import DEFAULT_MODEL_DIR

CODE = '''"""A module to cut tasks from."""


def area(width, height):
    """The area of a rectangle."""
    if width < 0 or height < 0:
        raise ValueError("negative side")
    result = width * height
    return result


class Counter:
    def __init__(self):
        self.value = 0
        self.history = []

    def bump(self, by=1):
        for _ in range(by):
            self.value += 1
            self.history.append(self.value)
        return self.value
'''


def test_the_eval_records_each_fills_confidence_with_its_outcome(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(CODE)
    engine = local_engine(load_model(DEFAULT_MODEL_DIR))
    report = evaluate_dir(engine, tmp_path, tasks=3, seed=2, baseline=False, functions=0)
    fills = report["fills"]
    assert {len(fills[k]) for k in KINDS} == {3}
    assert len(fills["single_line"]) == 6 and len(fills["multi_line"]) == 6  # lines + rest; body + span
    for kind in KINDS:
        for f in fills[kind]:
            assert f["score"] is not None and 0.0 < f["score"] <= 1.0
            assert f["mean_logprob"] <= 0.0 and f["score"] <= 2.718281828 ** f["mean_logprob"] + 1e-6  # min <= mean
            assert f["right"] or not f["exact"]  # an exact fill is right
        assert round(sum(f["exact"] for f in fills[kind]) / 3, 4) == report[kind]["exact_match"]
    cal = report["calibration"]
    for kind, kind_fills in fills.items():
        assert sum(row["fills"] for row in cal[kind]["reliability"]) == len(kind_fills)
        assert cal[kind]["curve"][0]["shown"] == 1.0 and cal[kind]["curve"][-1]["shown"] == 0.0
    assert cal["target_precision"] > 0.5
