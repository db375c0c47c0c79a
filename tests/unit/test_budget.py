"""The accelerator runs' time budget (engine/training/budget.py) on a fake clock."""

from __future__ import annotations

import pytest

from engine.training import budget as budget_module
from engine.training.budget import Budget


def test_budget_counts_down_from_when_it_was_made(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(budget_module.time, "perf_counter", lambda: now[0])
    budget = Budget(60)
    assert budget.left() == 60 and budget.allows(60)
    now[0] = 130.0
    assert budget.left() == 30
    assert budget.allows(30) and not budget.allows(31)
    now[0] = 200.0
    assert budget.left() == -40 and not budget.allows(0)
