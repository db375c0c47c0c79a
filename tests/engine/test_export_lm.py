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
pytest.importorskip("onnx_ir")

from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.onnx_lm import OnnxLMDenoiser  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.models.loading import load_model  # noqa: E402
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
        rs, gs = ref.encode(prompt), den.encode(prompt)
        assert gs.token_ids == rs.token_ids  # the same layout: prefix-suffix-middle
        np.testing.assert_allclose(den.next_logits(gs), ref.next_logits(rs).numpy(), atol=tol)
        (_, la), (g2, lb) = ref.extend(rs, [12, 13, 14]), den.extend(gs, [12, 13, 14])
        np.testing.assert_allclose(lb, la.numpy(), atol=tol)
        # a cut back to the first new token gives the logits after it, as the uncut state did
        np.testing.assert_allclose(den.next_logits(den.cut(g2, len(gs.token_ids) + 1)), lb[0], atol=1e-5)


@pytest.mark.parametrize("quantize", list(TOLERANCE))
@pytest.mark.parametrize("model_type", ["qwen2", "Dream"])
def test_the_canvas_equals_torch(
    model_type: str, quantize: str, sources: dict[str, Path], exported: dict[tuple[str, str], Path]
) -> None:
    """Full attention over `start P [canvas] S eos`, logits shifted by one (the dream backend's
    exact step; its Llama path takes no full-attention mask in this transformers)."""
    ref = load_model(sources[model_type], backend="dream").denoiser
    den = load_model(exported[model_type, quantize]).denoiser
    canvas = np.full((2, 6), den.info.mask_id, dtype=np.int64)
    canvas[1, 2] = 20
    for prompt in PROMPTS:
        want = ref.denoise(ref.encode(prompt), torch.as_tensor(canvas)).numpy()
        got = den.denoise(den.encode(prompt), canvas)
        assert got.shape == want.shape == (2, 6, den.info.vocab_size)
        np.testing.assert_allclose(got, want, atol=TOLERANCE[quantize])


def _typed(prompt: Prompt, *tokens: int) -> Prompt:
    return Prompt(prefix=(*prompt.prefix, *tokens), suffix=prompt.suffix)


def test_a_keystroke_moves_the_suffix_instead_of_encoding_it_again(exported: dict[tuple[str, str], Path]) -> None:
    """Typing at the cursor: the prefix's new token and the middle marker are run, the
    suffix's keys and values are moved (rotated to their new positions); the logits stay
    near the exact ones, and the cached state is never written."""
    den = load_model(exported["qwen2", "none"]).denoiser
    first = den.encode(PROMPTS[3])
    cached = [a.copy() for a in first.payload.kv]
    typed = _typed(PROMPTS[3], 7)
    moved, exact = den.encode(typed, first), den.encode(typed)
    assert moved.payload.stale == 1 and exact.payload.stale == 0
    assert moved.token_ids == exact.token_ids and moved.payload.kv[0].shape == exact.payload.kv[0].shape
    # the prefix's keys and values are exact; the suffix's missed one token of it
    head = 1 + len(typed.prefix)
    np.testing.assert_allclose(moved.payload.kv[0][:, :, :head], exact.payload.kv[0][:, :, :head], atol=1e-5)
    np.testing.assert_allclose(den.next_logits(moved), den.next_logits(exact), atol=0.05)
    for a, b in zip(first.payload.kv, cached, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_moved_suffix_without_staleness_is_exact(exported: dict[tuple[str, str], Path]) -> None:
    """Deleting the typed token again puts the prefix back: moved twice, the suffix is where
    it was, and only the rotation's rounding separates it from the exact keys."""
    den = load_model(exported["qwen2", "none"]).denoiser
    first = den.encode(PROMPTS[3])
    back = den.encode(PROMPTS[3], den.encode(_typed(PROMPTS[3], 7), first))
    assert back.payload.stale == 2  # what the suffix missed is counted, not measured
    np.testing.assert_allclose(den.next_logits(back), den.next_logits(first), atol=1e-4)


def test_too_stale_a_suffix_is_encoded_exactly_again(exported: dict[tuple[str, str], Path]) -> None:
    from engine.denoisers.onnx_lm import MAX_STALE_TOKENS

    den = load_model(exported["qwen2", "none"]).denoiser
    state = den.encode(PROMPTS[3])
    prompt = PROMPTS[3]
    for i in range(MAX_STALE_TOKENS + 1):
        prompt = _typed(prompt, 5 + i % 40)
        state = den.encode(prompt, state)
    assert state.payload.stale == 0  # the last keystroke went past the limit: exact again
    np.testing.assert_allclose(den.next_logits(state), den.next_logits(den.encode(prompt)), atol=1e-5)
    # an edit of the suffix encodes it exactly, reusing only the exact prefix
    edited = Prompt(prefix=prompt.prefix, suffix=prompt.suffix[:-1])
    np.testing.assert_allclose(
        den.next_logits(den.encode(edited, state)), den.next_logits(den.encode(edited)), atol=1e-5
    )


def test_suffix_reuse_exact_encodes_the_suffix_again(exported: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    import shutil

    out = shutil.copytree(exported["qwen2", "none"], tmp_path / "exact")
    cfg = json.loads((out / "config.json").read_text())
    cfg["diffusion_lsp"]["suffix_reuse"] = "exact"
    (out / "config.json").write_text(json.dumps(cfg))
    den = load_model(out).denoiser
    typed = _typed(PROMPTS[3], 7)
    again = den.encode(typed, den.encode(PROMPTS[3]))
    assert again.payload.stale == 0
    np.testing.assert_allclose(den.next_logits(again), den.next_logits(den.encode(typed)), atol=1e-5)


@pytest.mark.parametrize("strategy", ["autoregressive", "verified", "entropy_bound"])
def test_fills_through_the_engine_as_the_dream_backend_does(
    strategy: str, sources: dict[str, Path], exported: dict[tuple[str, str], Path]
) -> None:
    opts = FillOptions(canvas_tokens=8, strategy=strategy)
    req = InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n\nprint(1)\n")
    want = local_engine(load_model(sources["qwen2"], backend="dream"), opts).fill(req)
    got = local_engine(load_model(exported["qwen2", "none"]), opts).fill(req)
    assert got.steps >= 1 and got.text == want.text


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
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.onnx", "model.onnx.data", "tokenizer.json"]
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops and "MatMul" in ops  # weights in 4 bits; attention's products stay float


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
