"""diffusion-infill commands, and every bad input: a clear one-line error, no traceback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.commands.cli import main, split_at

from ..conftest import FIXTURE_CODE

SAMPLE = FIXTURE_CODE / "inventory.py"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_fill_at_a_line_and_column_prints_the_fill(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "fill", "--model", str(tiny_model_dir), "--file", str(SAMPLE), "--line", "35", "--col", "9", "--json",
        "--retry-candidates", "0",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= {"middle", "candidates", "steps", "total_ms", "stop_reason"}
    assert 1 <= result["steps"] <= 16  # one fill, no retry: at most the canvas
    # the language comes from the extension: candidates that do not parse are dropped
    assert all(c["syntax"] in ("ok", "truncated") for c in result["candidates"])
    assert all(len(c["token_confidence"]) <= 16 for c in result["candidates"])
    assert result["middle"] == (result["candidates"][0]["text"] if result["candidates"] else "")


def test_fill_from_prefix_and_suffix_files_and_empty_sides(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pre, suf = tmp_path / "pre.txt", tmp_path / "suf.txt"
    pre.write_text("")  # empty prefix and suffix are valid requests
    suf.write_text("")
    code, out, err = run_cli(
        capsys, "fill", "--model", str(tiny_model_dir), "--prefix-file", str(pre), "--suffix-file", str(suf)
    )
    assert code == 0, err
    assert "Traceback" not in err


def test_non_utf8_input_is_replaced_and_reported(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.py"
    bad.write_bytes("x = 'caf\xe9'\ny = ".encode("latin-1"))
    code, _, err = run_cli(
        capsys, "fill", "--model", str(tiny_model_dir), "--file", str(bad), "--line", "2", "--col", "5"
    )
    assert code == 0
    assert "not valid UTF-8" in err


def test_long_context_is_trimmed_and_canvas_is_clamped(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.py"
    big.write_text(SAMPLE.read_text() * 40)
    code, out, err = run_cli(
        capsys,
        "fill",
        "--model",
        str(tiny_model_dir),
        "--file",
        str(big),
        "--line",
        "600",
        "--col",
        "1",
        "--canvas-tokens",
        "100000",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["context_tokens"] <= 256  # the model's default budget
    assert any("canvas length 100000 is out of range" in w for w in result["warnings"])
    assert "out of range" in err  # said on stderr too


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--file", "missing.py", "--line", "1", "--col", "1"], "file not found: missing.py"),
        (["--file", str(SAMPLE), "--line", "999", "--col", "1"], "line 999 is outside the file"),
        (["--file", str(SAMPLE), "--line", "1", "--col", "999"], "column 999 is outside line 1"),
        (["--file", str(SAMPLE)], "--file needs --line and --col"),
        ([], "give --file"),
        (["--file", str(FIXTURE_CODE), "--line", "1", "--col", "1"], "is a directory"),
    ],
)
def test_bad_fill_input_gives_one_clear_line(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, "fill", "--model", str(tiny_model_dir), *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def _broken_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing_dir", "model directory not found"),
        ("no_config", "has no config.json"),
        ("no_denoise", "is missing denoise.onnx"),
        ("bad_version", "unknown format_version 99"),
        ("bad_json", "cannot read"),
        ("wrong_tokenizer", "the tokenizer does not belong to this checkpoint"),
    ],
)
def test_bad_model_directory_is_named(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], breakage: str, message: str
) -> None:
    model = tmp_path / "model"
    if breakage != "missing_dir":
        _broken_copy(tiny_model_dir, model)
    if breakage == "no_config":
        (model / "config.json").unlink()
    elif breakage == "no_denoise":
        (model / "denoise.onnx").unlink()
    elif breakage == "bad_version":
        cfg = json.loads((model / "config.json").read_text())
        cfg["format_version"] = 99
        (model / "config.json").write_text(json.dumps(cfg))
    elif breakage == "bad_json":
        (model / "config.json").write_text("{not json")
    elif breakage == "wrong_tokenizer":
        from engine.models.tokenizer import train_tokenizer

        train_tokenizer(["def f():\n    return 1\n"] * 3, vocab_size=300).hf.save(str(model / "tokenizer.json"))
    code, _, err = run_cli(capsys, "fill", "--model", str(model), "--file", str(SAMPLE), "--line", "1", "--col", "1")
    assert code == 2
    assert message in err, err
    assert str(model) in err
    assert "Traceback" not in err


def test_batch_keeps_going_past_bad_lines(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        json.dumps({"id": "a", "prefix": "def f(x):\n    return ", "suffix": "\n", "language": "python"})
        + "\n"
        + "{broken json\n"
        + json.dumps({"id": "c", "suffix": "no prefix"})
        + "\n"
        + json.dumps({"id": "d", "prefix": "", "suffix": ""})
        + "\n"
    )
    code, _, err = run_cli(capsys, "batch", "--model", str(tiny_model_dir), "--input", str(src), "--output", str(dst))
    assert code == 1  # some lines failed
    rows = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [r.get("id") for r in rows] == ["a", 2, 3, "d"]
    assert "middle" in rows[0] and "steps" in rows[0] and "total_ms" in rows[0]
    assert "error" in rows[1] and "error" in rows[2] and "middle" in rows[3]
    assert "Traceback" not in err


def test_split_at_handles_crlf_and_end_of_file() -> None:
    text = "a = 1\r\nb = 2\r\n"
    assert split_at(text, 2, 5) == ("a = 1\r\nb = ", "2\r\n")
    assert split_at(text, 3, 1) == (text, "")


def test_console_script_runs_the_shipped_model(tmp_path: Path) -> None:
    """What the README's quick start runs: the installed command, the default model."""
    exe = Path(sys.executable).parent / "diffusion-infill"
    if not exe.exists():
        pytest.skip("diffusion-infill is not installed in this environment")
    proc = subprocess.run(
        [str(exe), "fill", "--file", str(SAMPLE), "--line", "35", "--col", "16", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "middle" in json.loads(proc.stdout)


def test_batch_reads_stdin_and_writes_stdout(tiny_model_dir: Path) -> None:
    lines = [{"id": i, "prefix": f"x{i} = ", "suffix": "\n"} for i in range(3)]
    proc = subprocess.run(
        [sys.executable, "-m", "engine.commands.cli", "batch", "--model", str(tiny_model_dir)],
        input="".join(json.dumps(x) + "\n" for x in lines),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert all({"middle", "steps", "total_ms"} <= set(r) for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "-1"], "--steps: -1 is not in 1..1024"),
        (["--candidates", "0"], "--candidates: 0 is not in 1..16"),
        (["--device", "banana"], "'banana' is not a device"),
        (["--line", "0"], "--line: 0 is below 1"),
    ],
)
def test_bad_option_values_are_refused_with_the_option_named(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    base = ["fill", "--file", str(SAMPLE), "--line", "1", "--col", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_batch_survives_bad_unicode_and_names_file_errors(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(
        b'{"id": "surrogate", "prefix": "x = \\ud800"}\n'  # valid JSON, not valid Unicode
        + b'{"id": "latin1", "prefix": "caf\xe9 = "}\n'  # not UTF-8
        + b'{"id": "fine", "prefix": "y = "}\n'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"\n"  # valid JSON too deep for the parser: RecursionError
        + b'{"id": "last", "prefix": "z = "}\n'
    )
    code, _, err = run_cli(capsys, "batch", "--model", str(tiny_model_dir), "--input", str(src), "--output", str(dst))
    assert code == 1, err  # one line failed
    rows = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["surrogate", "latin1", "fine", 4, "last"]
    assert "error" in rows[3] and all("middle" in r for r in rows[:3] + rows[4:])
    assert any("not valid Unicode" in w for w in rows[0]["warnings"])
    assert "line 2 is not valid UTF-8" in err
    for args, message in (
        (["--input", str(tmp_path / "nope.jsonl")], "cannot open batch input"),
        (["--input", str(src), "--output", str(tmp_path)], "cannot open batch output"),
    ):
        code, _, err = run_cli(capsys, "batch", "--model", str(tiny_model_dir), *args)
        assert code == 2 and message in err and "Traceback" not in err


def test_split_at_counts_lines_as_editors_do() -> None:
    # a form feed or a Unicode line separator does not end a line in an editor
    assert split_at("a = 1\x0c\nb = 2\n", 2, 1) == ("a = 1\x0c\n", "b = 2\n")
    assert split_at("s = '\u2028'\nt", 2, 1) == ("s = '\u2028'\n", "t")
    assert split_at("a\rb", 2, 2) == ("a\rb", "")


def test_eval_prints_json_or_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "heldout"
    (data / "pkg").mkdir(parents=True)
    (data / "pkg" / "__init__.py").write_text("")
    shutil.copy(SAMPLE, data / "pkg" / "inventory.py")
    (data / "pkg" / "square.py").write_text(
        'def square(x):\n    """The square.\n\n    >>> square(3)\n    9\n    """\n    y = x * x\n    return y\n'
    )
    code, out, err = run_cli(capsys, "eval", "--data", str(data), "--tasks", "2", "--functions", "0", "--no-baseline")
    assert code == 0, err
    report = json.loads(out)
    for kind in ("lines", "rest_of_line", "block_body", "random_span"):  # the old keys, and new ones
        assert report[kind]["tasks"] == 2 and 0.0 <= report[kind]["syntax_valid"] <= 1.0
    assert report["single_line"]["tasks"] == 4 and report["all"]["tasks"] == 8
    assert "baseline" not in report and "function_body" not in report

    saved = tmp_path / "report.json"
    args = ["eval", "--data", str(data), "--tasks", "1", "--functions", "5", "--table", "--output", str(saved)]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert out.startswith("| kind | decoding |") and re.search(
        r"\| function_body \| (autoregressive|left_to_right) \| 1 \|", out
    )
    report = json.loads(saved.read_text())
    assert report["function_body"]["functions_kept"] == 1 and report["baseline"]["function_body"]["tasks"] == 1


def test_eval_runs_only_the_kinds_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "heldout"
    data.mkdir()
    shutil.copy(SAMPLE, data / "inventory.py")
    args = ("eval", "--data", str(data), "--tasks", "2", "--functions", "0", "--no-baseline")
    code, out, err = run_cli(capsys, *args, "--kinds", "lines, rest_of_line")
    assert code == 0, err
    report = json.loads(out)
    assert report["lines"]["tasks"] == report["rest_of_line"]["tasks"] == 2
    assert "block_body" not in report and "random_span" not in report
    code, out, err = run_cli(capsys, *args, "--kinds", "lines,nope")
    assert code == 2 and "nope" in err and "rest_of_line" in err and out == ""


def test_eval_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "eval", "--data", str(tmp_path / "missing"), "--tasks", "1")
    assert code == 2 and "eval data directory not found" in err and err.count("\n") == 1 and out == ""
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--data", str(tmp_path), "--functions", "-1"])
    assert exc.value.code == 2 and "--functions" in capsys.readouterr().err


RUNTIME_PROBE = """
import json, sys
from engine.commands.cli import main
code = main(["fill", "--model", sys.argv[1], "--prefix-file", sys.argv[2]])
print(json.dumps([code, sorted(sys.modules)]))
"""


def test_a_fill_imports_no_training_or_evaluation(tiny_model_dir: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "pre.txt"
    prefix.write_text("def add(a, b):\n    return ")
    probe = [sys.executable, "-c", RUNTIME_PROBE, str(tiny_model_dir), str(prefix)]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert code == 0 and "engine.local.generator" in modules
    assert [m for m in modules if m.startswith(("engine.training", "engine.evaluation", "torch"))] == []
