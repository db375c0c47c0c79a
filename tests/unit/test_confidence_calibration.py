"""The calibration of fill confidence (engine/evaluation/calibration.py) and what the
held-out eval records for it (engine/evaluation/heldout.py): tables from hand-made fills,
the threshold for a target precision, and the config.json it is written to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.candidate import Candidate, scored
from engine.evaluation import calibration
from engine.evaluation.calibration import NEVER, Scored, calibrate, curve, reliability, threshold, write_threshold
from engine.evaluation.heldout import equivalent, first_line

# confidence -> right: the sure fills are mostly right, the unsure ones mostly wrong
FILLS = [
    Scored(0.95, True, True, True),
    Scored(0.9, False, True, True),  # equivalent, not exact
    Scored(0.8, False, False, True),
    Scored(0.6, True, True, True),
    Scored(0.4, False, False, False),
    Scored(0.3, False, True, True),
    Scored(0.1, False, False, False),
    Scored(0.05, False, False, None),
]


def test_reliability_bins_the_fills_by_confidence() -> None:
    rows = {(r["from"], r["to"]): r for r in reliability(FILLS)}
    assert rows[(0.9, 1.0)]["fills"] == 2 and rows[(0.9, 1.0)]["exact"] == 0.5 and rows[(0.9, 1.0)]["right"] == 1.0
    assert rows[(0.0, 0.1)]["fills"] == 1 and rows[(0.0, 0.1)]["valid"] is None  # no grammar: not counted
    assert rows[(0.1, 0.2)]["fills"] == 1  # a bin holds its lower edge
    assert sum(r["fills"] for r in rows.values()) == len(FILLS)
    assert reliability([Scored(1.0, True, True, True)])[-1]["fills"] == 1  # the last bin holds 1.0


def test_the_curve_and_the_threshold_for_a_precision() -> None:
    rows = curve(FILLS)
    assert rows[0] == {"threshold": 0.05, "shown": 1.0, "precision": 0.5, "recall": 1.0}
    assert rows[-1]["threshold"] == NEVER and rows[-1]["shown"] == 0.0 and rows[-1]["precision"] is None
    at = {r["threshold"]: r for r in rows}
    assert at[0.6] == {"threshold": 0.6, "shown": 0.5, "precision": 0.75, "recall": 0.75}
    assert threshold(rows, 0.6) == 0.3  # the lowest with 60%: 4 right of 6 shown
    assert threshold(rows, 0.75) == 0.6
    assert threshold(rows, 1.0) == 0.9
    assert threshold(curve([Scored(0.5, False, False, True)]), 0.6) is None  # never that precise


def test_where_the_precision_is_out_of_reach_the_right_fills_are_kept() -> None:
    rows = curve(FILLS)
    assert threshold(rows, 1.01) is None
    assert threshold(rows, 1.01, min_recall=0.75) == 0.6  # the highest keeping 3 of the 4 right fills
    assert threshold(rows, 1.01, min_recall=1.0) == 0.3
    assert threshold(rows, 0.75, min_recall=1.0) == 0.6  # the precision first, when it is reachable


def test_a_fill_without_a_confidence_is_always_shown() -> None:
    rows = curve([Scored(None, False, False, True), Scored(0.9, True, True, True)])
    assert rows[-1]["shown"] == 0.5 and rows[-1]["precision"] == 0.0


def test_calibrate_gives_each_kind_its_threshold() -> None:
    cal = calibrate({"single_line": FILLS, "block_body": [Scored(0.2, False, False, True)]}, precision=0.6)
    assert cal["single_line"]["threshold"] == 0.3 and cal["single_line"]["at_threshold"]["shown"] == 0.75
    assert cal["block_body"]["threshold"] is None
    table = calibration.reliability_markdown(cal, "single_line")
    assert "| 0.9–1.0 | 2 | 0.93 | 50% | 100% | 100% |" in table


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"model_type": "diffusion_coder", "defaults": {"strategy": "autoregressive"}}, ("defaults",)),
        ({"model_type": "onnx_lm", "diffusion_lsp": {"graph": "model.onnx"}}, ("diffusion_lsp", "defaults")),
    ],
)
def test_the_threshold_goes_where_the_loader_reads_defaults(
    tmp_path: Path, config: dict[str, object], where: tuple[str, ...]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_threshold(tmp_path, 0.31234, {"kind": "single_line"})
    written = json.loads((tmp_path / "config.json").read_text())
    node = written
    for key in where:
        node = node[key]
    assert node["min_confidence"] == 0.3123 and node["min_confidence_source"] == {"kind": "single_line"}
    if "graph" in json.dumps(config):
        assert written["diffusion_lsp"]["graph"] == "model.onnx"  # the rest kept
    else:
        assert written["defaults"]["strategy"] == "autoregressive"


def test_the_command_writes_the_threshold_of_an_eval_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    never_right = [Scored(0.9, False, False, True).__dict__, Scored(0.2, False, False, True).__dict__]
    report.write_text(json.dumps({"fills": {"single_line": [f.__dict__ for f in FILLS], "multi_line": never_right}}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "diffusion_coder"}))
    assert calibration.main([str(report), "--precision", "0.75", "--write", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "config.json").read_text())["defaults"]
    assert written["min_confidence"] == 0.6
    assert written["min_confidence_multiline"] == NEVER  # never right: shown only when asked for
    assert written["min_confidence_source"]["precision"] == 0.75
    assert calibration.main([str(report), "--precision", "1.01", "--write", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "config.json").read_text())["defaults"]["min_confidence"] == NEVER  # out of reach
    assert calibration.main([str(report), "--precision", "1.01", "--min-recall", "0.9", "--write", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "config.json").read_text())["defaults"]
    assert written["min_confidence"] == 0.3  # nine in ten right fills kept (all four here)
    assert written["min_confidence_source"]["recall"] == 1.0 and written["min_confidence_source"]["min_recall"] == 0.9
    report.write_text(json.dumps({"fills": {"block_body": never_right}}))
    assert calibration.main([str(report)]) == 1


@pytest.mark.parametrize(
    ("middle", "fill", "same"),
    [
        ("x = 'a'", 'x = "a"', True),  # quotes
        ("f(a, b)", "f(a,b)", True),  # spacing
        ("f(a, b)", "f(b, a)", False),
        ("x = 1  # one", "x = 1", False),  # a comment dropped is not the line a person wrote
        ("x = 1  # one", "x = 1 # one", True),
        ("print x", "print  x", True),  # the file does not parse: white space aside
        ("print x", "print y", False),
    ],
)
def test_equivalent_is_the_same_program_and_comments(middle: str, fill: str, same: bool) -> None:
    assert equivalent("def f(a, b):\n    ", middle, fill, "\n    return a\n") is same


def test_a_one_token_fill_is_scored_on_its_first_line() -> None:
    nl = 13
    logps = [math.log(p) for p in (0.9, 0.8, 0.7, 0.1, 0.6)]  # "ab\n", then a doubtful second line, end-of-fill
    cand = scored(Candidate("ab\nc", [5, 6, nl, 7], [0.9, 0.8, 0.7, 0.1]), logps)
    line = first_line(cand, frozenset({nl}))
    assert line.score == pytest.approx(0.7)  # up to and with the line break
    assert cand.score == pytest.approx(0.1)
    assert first_line(scored(Candidate("ab", [5, 6], [0.9, 0.8]), logps[:3]), frozenset({nl})).score == (
        pytest.approx(0.7)  # one line: the whole fill with its end-of-fill
    )
