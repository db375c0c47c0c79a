"""The onnx and torch backends of the embedded model: same logits, same fills, same cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.denoisers.loading import load_model
from engine.fill import FillOptions, InfillRequest
from engine.local.generator import local_engine

PREFIX = "def total(self) -> float:\n    return self.price"
SUFFIX = "\n\n\ndef main() -> None:\n    pass\n"


@pytest.fixture(scope="module")
def both(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    return load_model(tiny_model_dir, backend="onnx"), load_model(tiny_model_dir, backend="torch")


def test_onnx_and_torch_give_the_same_logits(both) -> None:  # type: ignore[no-untyped-def]
    onnx_m, torch_m = both
    ids = onnx_m.tokenizer.encode(PREFIX + SUFFIX)
    s1 = onnx_m.denoiser.prefill(ids)
    s2 = torch_m.denoiser.prefill(ids)
    np.testing.assert_allclose(s1.payload[0], s2.payload[0].numpy(), atol=1e-4)
    canvas = np.random.default_rng(0).integers(0, onnx_m.tokenizer.vocab_size, (3, 12))
    a = onnx_m.denoiser.denoise(s1, canvas)
    b = torch_m.denoiser.denoise(s2, torch.as_tensor(canvas)).numpy()
    assert a.shape == (3, 12, onnx_m.tokenizer.vocab_size)
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_onnx_and_torch_give_the_same_length_head(both) -> None:  # type: ignore[no-untyped-def]
    onnx_m, torch_m = both
    assert onnx_m.denoiser.info.length_classes == 24
    ids = [*onnx_m.tokenizer.encode(PREFIX + SUFFIX), onnx_m.tokenizer.special.middle]
    a = onnx_m.denoiser.length_logits(onnx_m.denoiser.prefill(ids))
    b = torch_m.denoiser.length_logits(torch_m.denoiser.prefill(ids)).numpy()
    assert a.shape == (24,) and float(np.ptp(a)) > 0
    np.testing.assert_allclose(a, b, atol=1e-4)
    # reused from a cached state, or computed for the shorter context it was cut to
    grown = onnx_m.denoiser.prefill(ids, onnx_m.denoiser.prefill(ids[:7]))
    np.testing.assert_allclose(onnx_m.denoiser.length_logits(grown), a, atol=1e-4)
    cut = onnx_m.denoiser.prefill(ids[:-1], grown)
    np.testing.assert_allclose(
        onnx_m.denoiser.length_logits(cut), onnx_m.denoiser.length_logits(onnx_m.denoiser.prefill(ids[:-1])), atol=1e-4
    )
    assert not np.allclose(onnx_m.denoiser.length_logits(cut), a, atol=1e-3)


def test_onnx_and_torch_give_the_same_fills(both) -> None:  # type: ignore[no-untyped-def]
    fills = []
    for m in both:
        engine = local_engine(m, FillOptions(canvas_tokens=12))
        out = []
        for cut in (10, 25, len(PREFIX)):
            r = engine.fill(InfillRequest(prefix=PREFIX[:cut], suffix=SUFFIX))
            out.append((r.candidates[0].token_ids, r.steps))
        fills.append(out)
    assert fills[0] == fills[1]
    special = both[0].tokenizer.special
    never = {special.mask, special.suffix, special.prefix, special.middle}
    assert not never & {t for ids, _ in fills[0] for t in ids}


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_incremental_encode_matches_full_encode(both, backend: str) -> None:  # type: ignore[no-untyped-def]
    m = both[0] if backend == "onnx" else both[1]
    ids = m.tokenizer.encode(PREFIX + SUFFIX)
    full = m.denoiser.prefill(ids)
    head = m.denoiser.prefill(ids[:10])
    grown = m.denoiser.prefill(ids, head)  # appends to a cached prefix
    diverged = m.denoiser.prefill([*ids[:5], 7, 8, 9])  # shares 5 tokens only
    regrown = m.denoiser.prefill(ids, diverged)
    canvas = m.denoiser.as_array(np.arange(8).reshape(1, 8) % m.tokenizer.vocab_size)
    want = np.asarray(m.denoiser.denoise(full, canvas))
    for state in (grown, regrown):
        np.testing.assert_allclose(np.asarray(m.denoiser.denoise(state, canvas)), want, atol=1e-5)
    # the cached state was not changed by being extended: layer 0's keys (1, H, P, D) in
    # either layout (stacked in torch, one array per layer in onnx)
    assert tuple(head.payload[0][0].shape)[-2] == 10
    shorter = m.denoiser.prefill(ids[:10], full)  # a prefix of a cached state: a slice
    for layer in range(len(full.payload[0])):
        np.testing.assert_allclose(np.asarray(shorter.payload[0][layer]), np.asarray(head.payload[0][layer]), atol=1e-5)


def test_a_context_longer_than_a_chunk_encodes_as_one_pass(both) -> None:  # type: ignore[no-untyped-def]
    """Context past ENCODE_CHUNK tokens goes through the encoder in chunks (onnx: the fused
    GroupQueryAttention with a cache and its own rotation): the keys and the next-token
    logits equal the torch model's single causal pass over all of it."""
    from engine.denoisers.kv import ENCODE_CHUNK

    onnx_m, torch_m = both
    ids = onnx_m.tokenizer.encode((PREFIX + SUFFIX) * 40)[: 2 * ENCODE_CHUNK + 37]
    assert len(ids) == 2 * ENCODE_CHUNK + 37
    model = torch_m.denoiser.model
    empty = model.empty_cache()
    with torch.no_grad():
        keys, _, logits = model.encode(torch.tensor([ids]), *empty, torch.tensor(len(ids) - 1))
    for m in both:
        state = m.denoiser.prefill(ids)
        for layer in (0, len(keys) - 1):
            np.testing.assert_allclose(np.asarray(state.payload[0][layer]), keys[layer].numpy(), atol=1e-4)
        np.testing.assert_allclose(np.asarray(m.denoiser.next_logits(state)), logits[0, -1].numpy(), atol=1e-4)


def test_graphs_of_the_older_contract_are_refused_with_the_command_to_re_export(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A model directory whose encode.onnx takes the stacked cache (one past_keys input, the
    contract before per-layer caches) fails to load with a message naming the fix."""
    import shutil

    import onnx
    from onnx import TensorProto, helper

    from engine.errors import ModelLoadError

    old = tmp_path / "old-model"
    shutil.copytree(tiny_model_dir, old)
    names = ["input_ids", "past_keys", "past_values", "logits_from"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_keys"], ["present_keys"])],
        "old",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("present_keys", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(old / "encode.onnx"))
    with pytest.raises(ModelLoadError, match=r"older version.*diffusion-infill export-onnx --model"):
        load_model(old, backend="onnx")
