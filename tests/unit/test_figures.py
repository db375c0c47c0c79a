"""One source for each figure: every figure README.md states (a number with a unit: %,
ms, s, MB, MiB, GB, GiB, M, x) is stated in docs/measurements.md too, where it has its date,
machine and command, so that the README cannot drift from the measurement behind it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"(?<![\w.\-])\d[\d,]*(?:\.\d+)?\s?(?:%|ms\b|s\b|MiB\b|MB\b|GiB\b|GB\b|M\b|x\b)")


def figures(text: str) -> set[str]:
    """The figures in `text`, spaced one way ("1.2 s", "5.6M")."""
    return {re.sub(r"\s+", " ", f) for f in FIGURE.findall(text)}


def test_figures_are_found() -> None:
    assert figures("took 1.2 s, 75.5% of 5.6M; 2-core, 0.10+, 3 of 4") == {"1.2 s", "75.5%", "5.6M"}


def test_every_figure_the_readme_states_is_in_the_measurements_page() -> None:
    readme = figures((ROOT / "README.md").read_text(encoding="utf-8"))
    measured = figures((ROOT / "docs" / "measurements.md").read_text(encoding="utf-8"))
    assert readme, "the README states no figure: the check would pass on nothing"
    missing = sorted(readme - measured)
    assert not missing, f"README.md states {missing}, which docs/measurements.md does not"
