"""The models folder: listing, timings per machine, and the server's default model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.models import folder
from engine.models.directory import DEFAULT_MODEL_DIR
from engine.models.folder import Timing, best, entry, machine_key, parameters, read_timing, scan, write_timing

QWEN_05B = {  # Qwen2.5-Coder-0.5B's shape (494M weights, the head tied)
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "vocab_size": 151936,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def model_dir(root: Path, name: str, cfg: dict[str, object], quantization: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    cfg = dict(cfg)
    if quantization:
        cfg["diffusion_lsp"] = {"quantization": quantization}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "weights.bin").write_bytes(b"\0" * 1000)
    return d


def timed(d: Path, key: str, keystroke_ms: float) -> None:
    write_timing(d, key, Timing(keystroke_p50_ms=keystroke_ms, cold_p50_ms=4 * keystroke_ms, load_s=1.0, when="x"))


def test_parameters_estimate_qwen_05b() -> None:
    n = parameters(QWEN_05B)
    assert n is not None and 490e6 < n < 500e6
    untied = parameters({**QWEN_05B, "tie_word_embeddings": False})
    assert untied is not None and untied - n == 151936 * 896
    assert parameters({"model_type": "qwen2"}) is None


def test_scan_lists_model_directories_with_what_they_are(tmp_path: Path) -> None:
    model_dir(tmp_path, "b-qwen", QWEN_05B, "int8")
    model_dir(tmp_path, "a-odd", {"model_type": "bert"})
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    entries = scan(tmp_path, "k")
    assert [e.name for e in entries] == ["a-odd", "b-qwen"]
    odd, qwen = entries
    assert odd.problem is not None and "bert" in odd.problem and odd.backend is None
    assert qwen.problem is None and qwen.backend == "dream" and qwen.quantization == "int8"
    assert qwen.size_bytes >= 1000 and qwen.timing is None
    assert scan(tmp_path / "missing", "k") == []


def test_timing_is_kept_per_machine(tmp_path: Path) -> None:
    d = model_dir(tmp_path, "m", QWEN_05B)
    timed(d, "laptop", 800)
    timed(d, "server", 90)
    assert read_timing(d, "laptop") == Timing(800, 3200, 1.0, "x")
    assert read_timing(d, "server") is not None and read_timing(d, "server").keystroke_p50_ms == 90  # type: ignore[union-attr]
    assert read_timing(d, "other") is None
    (d / folder.TIMING_FILE).write_text("{not json")
    assert read_timing(d, "laptop") is None
    timed(d, "laptop", 700)  # a broken file is replaced, not a crash
    assert read_timing(d, "laptop") is not None


def test_best_is_the_largest_measured_model_within_the_target(tmp_path: Path) -> None:
    small = {**QWEN_05B, "num_hidden_layers": 2}
    fast_small = model_dir(tmp_path, "small", small)
    big8 = model_dir(tmp_path, "big-int8", QWEN_05B, "int8")
    big4 = model_dir(tmp_path, "big-int4", QWEN_05B, "int4")
    slow = model_dir(tmp_path, "huge", {**QWEN_05B, "num_hidden_layers": 48})
    model_dir(tmp_path, "unmeasured", {**QWEN_05B, "num_hidden_layers": 96})
    for d, ms in ((fast_small, 100), (big8, 900), (big4, 500), (slow, 5000)):
        timed(d, "here", ms)
    entries = scan(tmp_path, "here")
    chosen = best(entries, 2000)
    assert chosen is not None and chosen.name == "big-int8"  # 8 bits before 4 at the same size; the huge one too slow
    chosen = best(entries, 600)
    assert chosen is not None and chosen.name == "big-int4"
    chosen = best(entries, 200)
    assert chosen is not None and chosen.name == "small"
    assert best(entries, 50) is None  # nothing fast enough: the shipped model
    assert best(scan(tmp_path, "elsewhere"), 2000) is None  # timings of another machine do not count


def test_default_model_reads_the_folder_from_the_environment(tmp_path: Path) -> None:
    d = model_dir(tmp_path, "m", QWEN_05B, "int8")
    timed(d, machine_key("cpu"), 400)
    chosen = folder.default_model(2000, "cpu", {"DIFFUSION_LSP_MODELS": str(tmp_path)})
    assert chosen is not None and chosen.path == d
    assert folder.default_model(2000, "cuda", {"DIFFUSION_LSP_MODELS": str(tmp_path)}) is None
    assert folder.default_model(2000, "cpu", {"DIFFUSION_LSP_MODELS": str(tmp_path / "none")}) is None


def test_models_command_measures_and_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.commands.cli import main

    shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "shipped-copy")
    model_dir(tmp_path, "broken", {"model_type": "bert"})
    assert main(["models", "--dir", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed["models"]] == ["broken", "shipped-copy"]
    assert not any(m["default"] for m in listed["models"])  # nothing measured: the shipped model
    assert main(["models", "--dir", str(tmp_path), "--measure", "shipped-copy", "--json"]) == 0
    rows = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    shipped = rows["shipped-copy"]
    assert shipped["keystroke_p50_ms"] > 0 and shipped["cold_p50_ms"] > 0 and shipped["load_s"] > 0
    assert shipped["default"] is True and rows["broken"]["default"] is False
    assert rows["broken"]["problem"]
    timing = read_timing(tmp_path / "shipped-copy", machine_key("cpu"))
    assert timing is not None and timing.keystroke_p50_ms == shipped["keystroke_p50_ms"]
    assert main(["models", "--dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "* shipped-copy" in table and "the server's default" in table


def test_entry_of_an_unreadable_config_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("[1, 2]")
    e = entry(d, "k")
    assert e.problem is not None and e.backend is None
