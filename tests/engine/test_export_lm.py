"""`diffusion-infill export-onnx` of Qwen2, Llama and Dream checkpoints (engine/training/export_lm.py)
and the onnx backend that runs the result (engine/denoisers/onnx_lm.py), on tiny random
checkpoints: the export equals torch (the dream backend on the same weights) in float32,
stays within a stated logits error in 8 and 4 bits, fills through the engine, and loads
in the base install without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.denoisers.onnx_lm import OnnxLMDenoiser  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.training.export_lm import export_lm  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [  # token ids of the tiny tokenizer (about 90 tokens)
    Prompt(prefix=(5, 6, 7, 8), suffix=(9, 10, 11)),
    Prompt(prefix=(40, 41, 42, 43, 44, 45), suffix=(50,)),
    Prompt(prefix=(80, 70, 60), suffix=(55, 50, 45, 40, 30)),
    Prompt(prefix=tuple(range(20, 50)), suffix=tuple(range(50, 80))),
]
# The largest logit difference from float32 torch on these tiny random models (logits of
# magnitude about 0.5), measured: float32 2e-7, int8 0.006, int4 0.08.
TOLERANCE = {"none": 1e-4, "int8": 0.02, "int4": 0.15}
MODEL_TYPES = ("qwen2", "llama", "Dream")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lm")
    return {t: dream_checkpoint.write(root / t, t, autoregressive=True) for t in MODEL_TYPES}


@pytest.fixture(scope="module")
def exported(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("exported")
    return {(t, q): export_lm(sources[t], root / f"{t}-{q}", q) for t in MODEL_TYPES for q in TOLERANCE}


@pytest.mark.parametrize("quantize", list(TOLERANCE))
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_one_token_mode_equals_torch(
    model_type: str, quantize: str, sources: dict[str, Path], exported: dict[tuple[str, str], Path]
) -> None:
    ref = load_model(sources[model_type], backend="dream").denoiser
    got = load_model(exported[model_type, quantize])
    assert got.backend == "onnx" and isinstance(got.denoiser, OnnxLMDenoiser)
    den, tol = got.denoiser, TOLERANCE[quantize]
    for prompt in PROMPTS:
        rs, gs = ref.prefill(prompt), den.prefill(prompt)
        assert gs.token_ids == rs.token_ids  # the same layout: prefix-suffix-middle
        np.testing.assert_allclose(den.next_logits(gs), ref.next_logits(rs).numpy(), atol=tol)
        (_, la), (g2, lb) = ref.extend(rs, [12, 13, 14]), den.extend(gs, [12, 13, 14])
        np.testing.assert_allclose(lb, la.numpy(), atol=tol)
        # a cut back to the first new token gives the logits after it, as the uncut state did:
        # a token's result does not depend on the chunk it is run in (int8 too: each token's
        # activations are quantized by their own scale, not by the chunk's largest value)
        cut = den.next_logits(den.cut(g2, len(gs.token_ids) + 1))
        np.testing.assert_allclose(cut, lb[0], atol=1e-5)


@pytest.mark.parametrize("quantize", list(TOLERANCE))
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_canvas_equals_torch(
    model_type: str, quantize: str, sources: dict[str, Path], exported: dict[tuple[str, str], Path]
) -> None:
    """Full attention over `start P [canvas] S eos`, logits shifted by one (the dream backend's
    exact step)."""
    ref = load_model(sources[model_type], backend="dream").denoiser
    den = load_model(exported[model_type, quantize]).denoiser
    canvas = np.full((2, 6), den.info.mask_id, dtype=np.int64)
    canvas[1, 2] = 20
    for prompt in PROMPTS:
        want = ref.denoise(ref.prefill(prompt), torch.as_tensor(canvas)).numpy()
        got = den.denoise(den.prefill(prompt), canvas)
        assert got.shape == want.shape == (2, 6, den.info.vocab_size)
        np.testing.assert_allclose(got, want, atol=TOLERANCE[quantize])


def test_a_keystroke_reuses_the_cached_prefix(exported: dict[tuple[str, str], Path]) -> None:
    den = load_model(exported["qwen2", "none"]).denoiser
    first = den.prefill(PROMPTS[3])
    typed = Prompt(prefix=(*PROMPTS[3].prefix, 7), suffix=PROMPTS[3].suffix)
    again, fresh = den.prefill(typed, first), den.prefill(typed)
    np.testing.assert_allclose(den.next_logits(again), den.next_logits(fresh), atol=1e-5)
    for a, b in zip(again.payload.kv, fresh.payload.kv, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert first.payload.kv[0].shape[2] == len(first.token_ids)  # the cached state was not written


@pytest.mark.parametrize("strategy", ["autoregressive", "verified", "entropy_bound"])
def test_fills_through_the_engine_as_the_dream_backend_does(
    strategy: str, sources: dict[str, Path], exported: dict[tuple[str, str], Path]
) -> None:
    opts = FillOptions(canvas_tokens=8, strategy=strategy)
    req = InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n\nprint(1)\n")
    want = local_engine(load_model(sources["qwen2"], backend="dream"), opts).fill(req)
    got = local_engine(load_model(exported["qwen2", "none"]), opts).fill(req)
    assert got.steps >= 1 and got.text == want.text


def test_typing_on_a_primed_line_reads_only_what_was_typed(exported: dict[tuple[str, str], Path]) -> None:
    """Middle priming: the cursor's line is the fill's given start but for its last piece,
    which the fill's first tokens spell. A keystroke within that piece finds the whole
    context cached; in the exact order it reads the suffix again."""
    model = load_model(exported["qwen2", "none"])
    suffix = "\n\nprint(1)\n"
    typed = [
        InfillRequest(prefix="def add(a, b):\n    " + word, suffix=suffix, min_tokens=2) for word in ("ret", "retu")
    ]
    for primed in (True, False):
        engine = local_engine(model, FillOptions(canvas_tokens=8, middle_priming=primed))
        engine.fill(typed[0])
        r = engine.fill(typed[1])
        if primed:
            assert r.reused_tokens == r.context_tokens
        else:
            assert r.reused_tokens < r.context_tokens - len(model.tokenizer.encode(suffix))
        best = r.candidates[0]
        written = model.tokenizer.decode(best.token_ids)
        assert best.text.strip() and written.endswith(best.text)
        assert written.startswith(" retu") == primed  # the piece typed so far, spelled by the fill
    # at a line's start nothing is typed on it: the same prompt, so the same fill
    start = InfillRequest(prefix="def add(a, b):\n", suffix=suffix, min_tokens=2)
    fills = [local_engine(model, FillOptions(canvas_tokens=8, middle_priming=p)).fill(start) for p in (True, False)]
    assert fills[0].text == fills[1].text and fills[0].context_tokens == fills[1].context_tokens


def test_a_keystroke_with_repository_context_reads_only_what_was_typed(tmp_path: Path) -> None:
    """Qwen's repository layout puts the other files first: a keystroke on a primed line
    finds all of it cached, and the block is in the sequence (it is not without files)."""
    source = dream_checkpoint.write(tmp_path / "src", "qwen2", autoregressive=True, repository=True)
    model = load_model(export_lm(source, tmp_path / "onnx", "none"))
    engine = local_engine(model, FillOptions(canvas_tokens=8, middle_priming=True))
    assert engine.takes_extra_files
    files = [("util.py", "def add(a, b):\n    return a + b\n")]
    typed = [
        InfillRequest(
            prefix="def f(a, b):\n    " + word,
            suffix="\n\nprint(1)\n",
            extra_files=files,
            repository="proj",
            path="main.py",
            min_tokens=2,
        )
        for word in ("ret", "retu")
    ]
    first = engine.fill(typed[0])
    again = engine.fill(typed[1])
    assert again.reused_tokens == again.context_tokens
    alone = local_engine(model, FillOptions(canvas_tokens=8, middle_priming=True)).fill(
        InfillRequest(prefix=typed[0].prefix, suffix=typed[0].suffix, min_tokens=2)
    )
    block = len(model.tokenizer.encode("util.py\ndef add(a, b):\n    return a + b\n"))
    assert first.context_tokens >= alone.context_tokens + block


def test_the_greedy_fill_in_8_bits_is_the_float_fill_on_most_contexts(exported: dict[tuple[str, str], Path]) -> None:
    texts = ["def add(a, b):\n    return ", "class Point:\n    def __init__(self, x, y):\n        self.", "for i in "]
    same = 0
    fills = {}
    for q in ("none", "int8"):
        engine = local_engine(load_model(exported["qwen2", q]), FillOptions(canvas_tokens=8))
        fills[q] = [engine.fill(InfillRequest(prefix=t, suffix="\n")).text for t in texts]
    same = sum(a == b for a, b in zip(fills["none"], fills["int8"], strict=True))
    assert same >= 2, fills


def test_the_export_carries_what_the_base_install_needs(exported: dict[tuple[str, str], Path]) -> None:
    out = exported["Dream", "int4"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "onnx_lm" and cfg["diffusion_lsp"]["source_model_type"] == "Dream"
    assert cfg["diffusion_lsp"]["quantization"] == "int4"
    files = ["config.json", "generation_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"]
    assert sorted(p.name for p in out.iterdir()) == files  # the source's generation_config.json goes along
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops and "MatMul" in ops  # weights in 4 bits; attention's products stay float


def test_8_bits_put_the_projections_in_integer_products(exported: dict[tuple[str, str], Path]) -> None:
    """int8: every projection of every layer in integer products, with a scale per token
    (the largest magnitude over the last axis); the head in 8-bit MatMulNBits; no weight
    left in float32 but the embedding table."""
    import onnx

    model = onnx.load(str(exported["qwen2", "int8"] / "model.onnx"), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    nbits = [n.name for n in model.graph.node if n.op_type == "MatMulNBits"]
    integer = [n for n in model.graph.node if n.op_type == "MatMulInteger"]
    per_row = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    reduced = [n for n in model.graph.node if n.op_type == "ReduceMax" and n.name.startswith("pt/")]
    layers = json.loads((exported["qwen2", "int8"] / "config.json").read_text())["num_hidden_layers"]
    assert len(nbits) == 1 and nbits[0].startswith("/head/")
    assert len(integer) == 7 * layers  # q, k, v, o, gate, up, down
    assert len(per_row) == 4 * layers  # q, k and v share their input's quantization, gate and up theirs
    assert len(reduced) == len(per_row)
    assert all(next(a.ints for a in n.attribute if a.name == "axes") == [-1] for n in reduced)
    assert not [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]


def test_a_token_s_outlier_leaves_the_other_tokens_precision(tmp_path: Path) -> None:
    """Integer products scale each token by its own largest activation: a token a hundred
    times larger than the rest leaves the others' results as precise as without it (one
    scale for the chunk would round the small tokens to nothing)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from engine.training.export_lm import INTEGER_KEEPS, _integer_products

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "t", 64])  # two rows, as a canvas batch
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, "t", 16]) for n in ("y", "y2")]
    outs.append(helper.make_tensor_value_info("rows", TensorProto.FLOAT, [2, 16]))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),  # nodes without names (torch names its own)
            helper.make_node("MatMul", ["x", "w"], ["y2"]),  # and the same weight again
            helper.make_node("Gather", ["w", "ids"], ["rows"]),  # the weight read by another node (tied)
        ],
        "g", [x, ids], outs, [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _integer_products(model, INTEGER_KEEPS)
    assert [n.op_type for n in model.graph.node].count("MatMulInteger") == 2
    assert len([t for t in model.graph.initializer if t.data_type == TensorProto.INT8]) == 1  # one copy
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(tmp_path / "m.onnx"))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    small = rng.standard_normal((2, 3, 64)).astype(np.float32)
    with_outlier = np.concatenate([small, 100 * rng.standard_normal((2, 1, 64)).astype(np.float32)], axis=1)
    feeds = {"ids": np.array([0, 5])}
    alone, again, rows = session.run(None, {"x": small, **feeds})
    beside = session.run(None, {"x": with_outlier, **feeds})[0]
    np.testing.assert_array_equal(beside[:, :3], alone)
    np.testing.assert_array_equal(again, alone)
    np.testing.assert_array_equal(rows, w[[0, 5]])
    exact = small @ w
    assert np.abs(alone - exact).max() < 0.03 * np.abs(exact).max()  # 8-bit activations, 7-bit weights
    np.testing.assert_allclose(beside[:, 3], with_outlier[:, 3] @ w, atol=0.03 * np.abs(with_outlier[:, 3] @ w).max())


PROBE = """
import sys
sys.modules["torch"] = None  # the base install: importing torch fails
from engine import InfillRequest, load_model, local_engine
from engine.fill import FillOptions
model = load_model(sys.argv[1])
print(model.backend, local_engine(model, FillOptions(canvas_tokens=4)).fill(InfillRequest("x = ", "\\n")).steps)
"""


def test_the_base_install_loads_and_fills_without_torch(exported: dict[tuple[str, str], Path]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(exported["qwen2", "int4"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    backend, steps = out.stdout.split()
    assert backend == "onnx" and int(steps) >= 1


def test_the_command_exports_and_fills(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "qwen2-int8"
    run: Any = subprocess.run
    made = run(
        ["diffusion-infill", "export-onnx", "--model", str(sources["qwen2"]), "--quantize", "int8", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(out)
    (tmp_path / "prefix.py").write_text("def f():\n    return ")
    filled = run(
        ["diffusion-infill", "fill", "--model", str(out), "--json", "--canvas-tokens", "4"]
        + ["--prefix-file", str(tmp_path / "prefix.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert filled.returncode == 0, filled.stderr
    assert json.loads(filled.stdout)["steps"] >= 1


def test_export_refuses_what_it_cannot_export(tmp_path: Path) -> None:
    made = subprocess.run(
        ["diffusion-infill", "export-onnx", "--model", str(dream_checkpoint.write(tmp_path / "q", "qwen2"))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode != 0 and "give --out" in made.stderr and "Traceback" not in made.stderr


def test_an_export_is_decoded_as_its_checkpoint_is(tmp_path: Path) -> None:
    """A Qwen2 checkpoint trained for diffusion (here: its tokenizer has a mask token and
    its generation_config.json a diffusion model's fields) goes on the canvas path in the
    dream backend, and its export does the same: the decision and the decoding defaults
    travel with it."""
    source = dream_checkpoint.write(tmp_path / "diffusion-qwen2", "qwen2")  # no override: detected
    (source / "generation_config.json").write_text(json.dumps({"steps": 12, "alg": "entropy"}))
    export = export_lm(source, tmp_path / "export", "none")
    assert (export / "generation_config.json").is_file()
    for model in (load_model(source), load_model(export)):
        assert model.denoiser.info.autoregressive is False
        assert model.defaults.get("strategy") != "autoregressive" and model.defaults.get("max_steps") == 12
    plain = dream_checkpoint.write(tmp_path / "plain-qwen2", "qwen2", mask=False)
    assert load_model(export_lm(plain, tmp_path / "plain-export", "none")).denoiser.info.autoregressive is True
