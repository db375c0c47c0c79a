"""The block_causal backend on tiny random Fast-dLLM v2 and SDAR checkpoints in their own
formats (tests/block_checkpoint.py): loading by model_type, the prompt layout, the logits
against the families' forward written out here from its equations (block-causal mask) on
the same tensors, the exact cache of complete blocks (counted positions, equal results),
the unmasking order against the families' published generation re-implemented here on
known logits, and fills through the engine and the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from engine.decoding import SamplerConfig  # noqa: E402
from engine.denoisers.base import Autoregressive, Denoiser, DenoiserInfo, EncodedContext, Prompt, StepReuse  # noqa: E402
from engine.denoisers.block_causal import BlockCausalDenoiser  # noqa: E402
from engine.denoisers.kv import common_prefix_len  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.denoisers.onnx import NumpyRandomSource  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local import sampler  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.local.steering import Steering  # noqa: E402
from engine.models import table  # noqa: E402
from engine.models.directory import block_causal  # noqa: E402
from tests import block_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"
FAMILIES = ("fast_dllm", "sdar")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("blocks")
    return {f: block_checkpoint.write(root / f, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def models(dirs: dict[str, Path]) -> dict[str, Any]:
    return {f: load_model(d) for f, d in dirs.items()}


def prompt(model: Any, prefix: str = PREFIX, suffix: str = SUFFIX) -> Prompt:
    tok = model.tokenizer
    return Prompt(prefix=tuple(tok.encode(prefix)), suffix=tuple(tok.encode(suffix)))


def fresh(model: Any, cls: type[BlockCausalDenoiser] = BlockCausalDenoiser) -> BlockCausalDenoiser:
    """The same weights with nothing cached (in a denoiser of class `cls`)."""
    den = model.denoiser
    cfg = json.loads((model.path / "config.json").read_text())
    blocks = block_causal(model.path, cfg)
    assert blocks is not None
    return cls(den.model, den.layout, den.info, blocks)


# ----------------------------------------------------------------------------- the forward, written out


def reference_forward(root: Path, ids: list[int]) -> Any:
    """(T, V) logits of the family's model on one sequence, from the checkpoint's tensors:
    x = embed[ids]; per layer, x += o(attention) over h = rms(x) with q, k, v projections
    (biases: Fast-dLLM v2's Qwen2.5; per-head RMS norms of q and k: SDAR's Qwen3), rotary
    positions (the halves rotated), a query at position i seeing the keys of positions j
    with j // block <= i // block (block-causal), then x += down(silu(gate(h)) * up(h))
    over h = rms(x); logits = lm_head(rms(x)), at each position (the shift is read later)."""
    cfg = json.loads((root / "config.json").read_text())
    w = load_file(str(root / "model.safetensors"))
    qwen3 = cfg["model_type"] == "sdar"
    size = cfg["block_size"] if qwen3 else cfg["bd_size"]
    d, heads, kv, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    hd, t = cfg.get("head_dim", d // heads), len(ids)

    def rms(x: Any, weight: Any) -> Any:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    freqs = torch.outer(torch.arange(t, dtype=torch.float), inv)
    sin, cos = torch.cat([freqs, freqs], -1).sin(), torch.cat([freqs, freqs], -1).cos()

    def rope(x: Any) -> Any:
        return x * cos + torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1) * sin

    pos = torch.arange(t)
    allowed = pos[None, :] // size <= pos[:, None] // size
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}."

        def proj(name: str, n: int, h: Any, a: str = a) -> Any:
            out = h @ w[a + f"self_attn.{name}_proj.weight"].T
            if not qwen3:
                out = out + w[a + f"self_attn.{name}_proj.bias"]
            out = out.view(t, n, hd)
            if qwen3 and name in "qk":
                out = rms(out, w[a + f"self_attn.{name}_norm.weight"])
            return out.transpose(0, 1)  # (heads, T, hd)

        h = rms(x, w[a + "input_layernorm.weight"])
        q, k, v = rope(proj("q", heads, h)), rope(proj("k", kv, h)), proj("v", kv, h)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        scores = (q @ k.transpose(1, 2) / hd**0.5).masked_fill(~allowed, float("-inf"))
        att = torch.softmax(scores, -1) @ v
        x = x + att.transpose(0, 1).reshape(t, heads * hd) @ w[a + "self_attn.o_proj.weight"].T
        h = rms(x, w[a + "post_attention_layernorm.weight"])
        gated = torch.nn.functional.silu(h @ w[a + "mlp.gate_proj.weight"].T) * (h @ w[a + "mlp.up_proj.weight"].T)
        x = x + gated @ w[a + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


# ----------------------------------------------------------------------------- loading, layout


def test_the_table_and_the_config_fields_declare_the_families(dirs: dict[str, Path]) -> None:
    assert {table.choose(t, quantization="int8").name for t in table.BLOCK_CAUSAL_MODEL_TYPES} == {"block_causal"}
    fast = block_causal(dirs["fast_dllm"], json.loads((dirs["fast_dllm"] / "config.json").read_text()))
    sdar = block_causal(dirs["sdar"], json.loads((dirs["sdar"] / "config.json").read_text()))
    assert fast is not None and fast.size == 8 and fast.family.shifted and fast.family.architecture == "qwen2"
    assert sdar is not None and sdar.size == 4 and not sdar.family.shifted and sdar.family.architecture == "qwen3"
    assert block_causal(Path("x"), {"model_type": "Fast_dLLM_Qwen"}).size == 32  # type: ignore[union-attr]
    assert block_causal(Path("x"), {"model_type": "qwen2", "bd_size": 32}) is None
    with pytest.raises(ModelLoadError, match="bd_size must be a positive integer"):
        block_causal(Path("x"), {"model_type": "Fast_dLLM_Qwen", "bd_size": 0})


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_with_the_checkpoints_ids_and_published_decoding(models: dict[str, Any], family: str) -> None:
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    model = models[family]
    den, hf = model.denoiser, model.tokenizer.hf
    assert model.backend == "block_causal" and isinstance(den, Denoiser) and isinstance(den, StepReuse)
    assert den.info.block_size == den.block and den.info.block_start_settled == (family == "fast_dllm")
    assert not isinstance(den, Autoregressive) and not den.info.autoregressive and den.info.regime == "absorbing"
    assert isinstance(den.model, Qwen3ForCausalLM if family == "sdar" else Qwen2ForCausalLM)
    mask = block_checkpoint.SDAR_MASK if family == "sdar" else block_checkpoint.FAST_DLLM_MASK
    assert den.info.mask_id == hf.token_to_id(mask) and den.info.mask_id in den.info.suppress_ids
    if family == "sdar":
        assert model.defaults == {
            "strategy": "confidence",
            "confidence_threshold": 0.85,
            "max_steps": 1024,
            "block_length": 4,
        }
    else:
        assert den.info.eof_id == hf.token_to_id("<|im_end|>")
        assert model.defaults == {
            "strategy": "confidence",
            "confidence_threshold": 0.9,
            "block_length": 8,
            "max_steps": 1024,
        }


def test_the_prompt_is_prefix_suffix_middle_before_the_canvas(models: dict[str, Any]) -> None:
    den, hf = models["fast_dllm"].denoiser, models["fast_dllm"].tokenizer.hf
    pre, suf, mid = (hf.token_to_id(f"<|fim_{n}|>") for n in ("prefix", "suffix", "middle"))
    p, s, m = (21, 22, 23), (11, 12), (31,)
    state = den.prefill(Prompt(prefix=p, suffix=s, middle=m))
    assert state.token_ids == (pre, *p, suf, *s, mid, *m)  # the canvas at sequence position 9
    with pytest.raises(ValueError, match="max_positions"):
        den.prefill(Prompt(prefix=(7,) * 600))


@pytest.mark.parametrize("family", FAMILIES)
def test_denoise_equals_the_block_causal_forward_written_out(models: dict[str, Any], family: str) -> None:
    model = models[family]
    den = fresh(model)
    ctx = den.prefill(prompt(model))
    p, shift = len(ctx.token_ids), den.shift
    canvas = torch.full((2, 13), den.info.mask_id)
    canvas[1, :5] = torch.tensor(model.tokenizer.encode("return a + b")[:5])
    got = den.denoise(ctx, canvas)
    assert got.shape == (2, 13, den.info.vocab_size) and got.dtype == torch.float32
    for row in range(2):
        want = reference_forward(model.path, [*ctx.token_ids, *canvas[row].tolist()])
        torch.testing.assert_close(got[row], want[p - shift : p - shift + 13], atol=1e-4, rtol=1e-4)
        other = want[p + shift - 1 : p + shift + 12]  # the other shift
        assert not torch.allclose(got[row], other, atol=1e-2)
    # causal across blocks: a later block's tokens never change an earlier block's logits,
    # bidirectional within one: a later token of the same block does
    edge = (p + den.block - 1) // den.block * den.block - p  # canvas index of the second block's start
    later = canvas.clone()
    later[:, edge + den.block - 1] = 5
    moved = fresh(model).denoise(ctx, later)
    torch.testing.assert_close(moved[:, : edge + shift], got[:, : edge + shift], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(moved[:, edge + shift :], got[:, edge + shift :], atol=1e-4)


# ----------------------------------------------------------------------------- the exact cache


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_reuses_the_complete_blocks_of_a_cached_context(models: dict[str, Any], family: str) -> None:
    model = models[family]
    den = fresh(model)
    first = den.prefill(prompt(model, prefix=PREFIX * 3))
    cold = den.positions_run
    assert cold == first.payload.held > 0  # the complete blocks of the context, once
    typed = prompt(model, prefix=PREFIX * 3 + "a")  # a keystroke: the same prefix, one more character
    warm = den.prefill(typed, first)
    shared = min(i for i, (a, b) in enumerate(zip(first.token_ids, warm.token_ids, strict=False)) if a != b)
    run = den.positions_run - cold
    assert run <= warm.payload.held - (shared // den.block * den.block) + den.block  # the blocks before it reused
    assert run < warm.payload.held  # not the whole context again
    canvas = torch.full((1, 9), den.info.mask_id)
    cold_den = fresh(model)
    want = cold_den.denoise(cold_den.prefill(typed), canvas)
    torch.testing.assert_close(den.denoise(warm, canvas), want, atol=1e-4, rtol=1e-4)
    assert first.payload.held == len(first.token_ids) // den.block * den.block  # the state was never written


@pytest.mark.parametrize("family", FAMILIES)
def test_each_step_runs_from_the_first_block_that_changed(models: dict[str, Any], family: str) -> None:
    model = models[family]
    den = fresh(model)
    ctx = den.prefill(prompt(model))
    p, size = len(ctx.token_ids), den.block
    canvas = torch.full((2, 3 * size), den.info.mask_id)
    fill = den.fill_state(ctx)  # one fill's: what a step leaves for the next
    den.denoise(fill, canvas)
    start = den.positions_run
    done = (p + size - 1) // size * size + size - p  # canvas positions up to the end of the second block
    canvas[:, :done] = torch.tensor(model.tokenizer.encode("return a + b\n" * 8)[:done])
    step = den.denoise(fill, canvas)  # runs from the context's last partial block (the canvas changed there)
    assert den.positions_run - start == 2 * (p + canvas.shape[1] - p // size * size)
    before = den.positions_run
    again = den.denoise(fill, canvas)  # the completed blocks are held: only the last block runs
    assert den.positions_run - before == 2 * (p + canvas.shape[1] - (p + done))
    torch.testing.assert_close(again, step, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, fresh(model).denoise(ctx, canvas), atol=1e-5, rtol=1e-5)
    before = den.positions_run
    den.denoise(ctx, canvas)  # outside a fill's state nothing of the fill's steps is reused
    assert den.positions_run - before == 2 * (p + canvas.shape[1] - p // size * size)


# ----------------------------------------------------------------------------- generation, written out

V, MASK, EOS = 40, 39, 1
PRIMES = (11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30)


def known_logits(seq: list[int], size: int, seed: int) -> np.ndarray:
    """(T, V) logits at each position of a sequence for a block-causal model: a fixed part
    per position plus a mix of the tokens of its own block and the blocks before; end of
    text and the mask far below the rest."""
    rng = np.random.default_rng(seed)
    base, mix, emb = rng.normal(0.0, 2.0, (96, V)), rng.normal(0.0, 0.5, (96, 96)), rng.normal(0.0, 1.0, (V, V))
    t = len(seq)
    pos = np.arange(t)
    seen = pos[None, :] // size <= pos[:, None] // size
    out = base[:t] + (mix[:t, :t] * seen) @ emb[np.asarray(seq)]
    out[:, [EOS, MASK]] = -30.0
    return out


class KnownBlocks:
    """A block-causal denoiser whose logits are `known_logits` (shifted or not); its info
    declares the model's blocks, and for a shifted model that a block's first token settles."""

    def __init__(self, size: int, shift: int, seed: int) -> None:
        self.size, self.shift, self.seed = size, shift, seed
        self.info = DenoiserInfo(
            vocab_size=V,
            regime="absorbing",
            eof_id=EOS,
            pad_id=EOS,
            mask_id=MASK,
            max_positions=96,
            block_size=size,
            block_start_settled=bool(shift),
        )

    def prefill(self, prompt: Any, state: Any = None) -> EncodedContext:
        return EncodedContext(tuple(prompt), None)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        p, c = len(state.token_ids), canvas.shape[1]
        rows = [known_logits([*state.token_ids, *row], self.size, self.seed) for row in np.asarray(canvas).tolist()]
        return np.stack([r[p - self.shift : p - self.shift + c] for r in rows]).astype(np.float32)

    def as_array(self, values: Any) -> Any:
        return np.asarray(values)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def fast_dllm_generate(prompt: list[int], blocks: int, size: int, sub: int, threshold: float, seed: int) -> Any:
    """Fast-dLLM v2's generate() (its modeling.py in Efficient-Large-Model/Fast_dLLM_v2_7B:
    temperature 0, no block cache, no stop token), re-implemented on `known_logits`: a
    prompt longer than a block that ends one gets its next token from the prefill first;
    then per block, masks to the block's end, decoded sub-block by sub-block, each step
    unmasking the sub-block's masks whose probability exceeds the threshold and the most
    probable one (position i read from position i - 1's logits); a completed block gives
    the next block's first token, the argmax at its last position. Returns the canvas
    positions unmasked at each step (those past the last block left out) and the tokens."""
    x, p, order = list(prompt), len(prompt), []
    if p > size and p % size == 0:
        x.append(int(known_logits(x, size, seed)[-1].argmax()))
        order.append({0})
    for _ in range(blocks):
        x += [MASK] * (size - len(x) % size)
        end = len(x)
        for lo in range(end - size, end, sub):
            while MASK in x[lo : lo + sub]:
                logits = known_logits(x, size, seed)
                shifted = np.concatenate([logits[:1], logits[:-1]])  # the shift: position i from i - 1
                probs = _softmax(shifted[lo : lo + sub])
                masked = [i for i in range(lo, lo + sub) if x[i] == MASK]
                conf = {i: probs[i - lo].max() for i in masked}
                chosen = {i for i in masked if conf[i] > threshold} | {max(masked, key=lambda i: conf[i])}
                for i in chosen:
                    x[i] = int(probs[i - lo].argmax())
                order.append({i - p for i in chosen})
        x.append(int(known_logits(x, size, seed)[-1].argmax()))  # the next block's first token
        order.append({len(x) - 1 - p})
    return order[:-1], x[:-1]


def sdar_generate(
    prompt: list[int], gen: int, size: int, steps: int, strategy: str, threshold: float, seed: int
) -> Any:
    """SDAR's block_diffusion_generate() (its generate.py: temperature 0, i.e. the argmax),
    re-implemented on `known_logits` (unshifted): the sequence padded with masks to whole
    blocks; from the block after the prompt's complete ones, at most `steps` steps a block,
    get_num_transfer_tokens(block, steps) tokens a step (base, one more for the first
    `remainder`): 'low_confidence_static' the most probable masks, 'low_confidence_dynamic'
    those above the threshold when they are at least that many. Returns the canvas positions
    unmasked at each step and the tokens."""
    p = len(prompt)
    total = -(-(p + gen) // size) * size
    x, order = [*prompt, *[MASK] * (total - p)], []
    counts = [size // steps + (1 if i < size % steps else 0) for i in range(steps)]
    for lo in range(p // size * size, total, size):
        for step in range(steps):
            masked = [i for i in range(lo, lo + size) if x[i] == MASK]
            if not masked:
                break
            probs = _softmax(known_logits(x, size, seed)[lo : lo + size])
            conf = {i: probs[i - lo].max() for i in masked}
            ranked = sorted(masked, key=lambda i: -conf[i])
            high = [i for i in masked if conf[i] > threshold]
            chosen = (
                set(high)
                if strategy == "low_confidence_dynamic" and len(high) >= counts[step]
                else set(ranked[: counts[step]])
            )
            for i in chosen:
                x[i] = int(probs[i - lo].argmax())
            order.append({i - p for i in chosen})
    return order, x


def unmasked_each_step(den: Any, prompt: list[int], length: int, cfg: SamplerConfig) -> tuple[list[set[int]], Any]:
    seen: list[np.ndarray] = []
    steer = Steering(on_step=lambda view: seen.append(np.asarray(view.canvas)[0].copy()))
    canvas = np.full((1, length), MASK, dtype=np.int64)
    result = sampler.run(den, den.prefill(prompt), canvas, cfg, NumpyRandomSource(0), steer=steer)
    before = [np.full(length, MASK), *seen[:-1]]
    got = [{int(j) for j in np.flatnonzero((a == MASK) & (b != MASK))} for a, b in zip(before, seen, strict=True)]
    return got, result


@pytest.mark.parametrize(
    ("p", "blocks", "size", "sub", "threshold", "seed"),
    [
        (11, 3, 8, 4, 0.9, 0),  # the prompt's last block shared with the canvas
        (16, 2, 8, 4, 0.9, 1),  # the prompt ends a block: its next token first
        (5, 2, 8, 8, 0.5, 2),  # one sub-block a block
        (21, 2, 16, 4, 0.7, 3),
        (13, 3, 4, 2, 1.0, 4),  # threshold 1: one token a step (the most probable)
    ],
)
def test_the_canvas_unmasks_in_fast_dllm_v2s_order(
    p: int, blocks: int, size: int, sub: int, threshold: float, seed: int
) -> None:
    prompt = list(PRIMES[:p]) if p <= len(PRIMES) else [PRIMES[i % len(PRIMES)] for i in range(p)]
    want, final = fast_dllm_generate(prompt, blocks, size, sub, threshold, seed)
    cfg = SamplerConfig(strategy="confidence", confidence_threshold=threshold, block_length=sub, max_steps=1024)
    got, result = unmasked_each_step(KnownBlocks(size, 1, seed), prompt, len(final) - p, cfg)
    assert got == want
    assert result.tokens[0].tolist() == final[p:] and result.stop_reason == "complete"


def test_the_order_needs_the_sequences_blocks_and_the_settled_token() -> None:
    """The test above can fail: blocks counted from the canvas's start, or no settled first
    token of a block, take other paths."""

    from_the_canvas, none_settled = KnownBlocks(8, 1, 0), KnownBlocks(8, 1, 0)
    from_the_canvas.info = replace(from_the_canvas.info, block_size=None)  # no blocks of its own
    none_settled.info = replace(none_settled.info, block_start_settled=False)
    prompt = list(PRIMES[:11])
    want, final = fast_dllm_generate(prompt, 3, 8, 4, 0.9, seed=0)
    cfg = SamplerConfig(strategy="confidence", confidence_threshold=0.9, block_length=4, max_steps=1024)
    for den in (from_the_canvas, none_settled):
        assert unmasked_each_step(den, prompt, len(final) - 11, cfg)[0] != want


class Wrapped:
    """A denoiser wrapping another one: the protocol forwarded, nothing else."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.info = inner, inner.info

    def prefill(self, prompt: Any, state: Any = None) -> EncodedContext:
        return self.inner.prefill(prompt, state)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        return self.inner.denoise(state, canvas, self_cond)

    def as_array(self, values: Any) -> Any:
        return self.inner.as_array(values)


def test_a_wrapping_denoiser_keeps_the_models_blocks() -> None:
    """The blocks are in the denoiser's info, which a wrapper passes on: the same order."""
    prompt = list(PRIMES[:11])
    want, final = fast_dllm_generate(prompt, 3, 8, 4, 0.9, seed=0)
    cfg = SamplerConfig(strategy="confidence", confidence_threshold=0.9, block_length=4, max_steps=1024)
    assert unmasked_each_step(Wrapped(KnownBlocks(8, 1, 0)), prompt, len(final) - 11, cfg)[0] == want


@pytest.mark.parametrize(
    ("p", "gen", "size", "steps", "strategy", "seed"),
    [
        (7, 12, 4, 4, "low_confidence_dynamic", 0),  # SDAR's published setting (blocks of 4, 4 steps)
        (8, 16, 4, 4, "low_confidence_dynamic", 1),
        (9, 20, 8, 8, "low_confidence_dynamic", 2),
        (8, 16, 8, 4, "low_confidence_static", 3),  # two a step
        (5, 11, 4, 4, "low_confidence_static", 4),
    ],
)
def test_the_canvas_unmasks_in_sdars_order(p: int, gen: int, size: int, steps: int, strategy: str, seed: int) -> None:
    prompt = list(PRIMES[:p])
    want, final = sdar_generate(prompt, gen, size, steps, strategy, 0.85, seed)
    length = len(final) - p
    blocks = -(-(p % size + length) // size)
    chosen = "confidence" if strategy == "low_confidence_dynamic" else "low_confidence"
    cfg = SamplerConfig(strategy=chosen, confidence_threshold=0.85, block_length=size, max_steps=steps * blocks)  # type: ignore[arg-type]
    got, result = unmasked_each_step(KnownBlocks(size, 0, seed), prompt, length, cfg)
    assert got == want
    assert result.tokens[0].tolist() == final[p:] and result.stop_reason == "complete"


# ----------------------------------------------------------------------------- fills


@pytest.mark.parametrize("family", FAMILIES)
def test_fills_through_the_engine_and_a_second_fill_reuses_the_prefix(models: dict[str, Any], family: str) -> None:
    model = models[family]
    request = InfillRequest(prefix=PREFIX, suffix=SUFFIX)
    engine = local_engine(replace(model, denoiser=fresh(model)), FillOptions(canvas_tokens=10, use_drafter=False))
    den = engine.generator.den  # type: ignore[attr-defined]
    first = engine.fill(request)
    assert first.candidates and all(t not in den.info.suppress_ids for c in first.candidates for t in c.token_ids)
    (state,) = engine.generator.cache._entries.values()  # type: ignore[attr-defined]  # the context it encoded
    held = state.payload.held
    before = den.positions_run
    again = engine.fill(request)
    warm = den.positions_run - before
    uncached_engine = local_engine(
        replace(model, denoiser=fresh(model)), FillOptions(canvas_tokens=10, use_drafter=False)
    )
    uncached = uncached_engine.fill(request)
    cold = uncached_engine.generator.den.positions_run  # type: ignore[attr-defined]
    # the context's complete blocks were not run again; the steps ran as the uncached fill's
    # (what a step holds for the next lives in its fill's state: nothing of the first fill's)
    assert held > 0 and warm == cold - held
    assert (
        [c.text for c in again.candidates]
        == [c.text for c in uncached.candidates]
        == [c.text for c in first.candidates]
    )


def test_generation_config_sets_the_sub_blocks_and_threshold(tmp_path: Path) -> None:
    gen = {"block_size": 8, "small_block_size": 4, "threshold": 0.5}
    model = load_model(
        block_checkpoint.write(tmp_path / "fast", generation=gen, diffusion_lsp={"defaults": {"max_steps": 64}})
    )
    assert model.defaults["block_length"] == 4 and model.defaults["confidence_threshold"] == 0.5
    assert model.defaults["max_steps"] == 64
    cfg = local_engine(model).generator.default_sampler()  # type: ignore[attr-defined]
    assert (cfg.block_length, cfg.confidence_threshold, cfg.strategy) == (4, 0.5, "confidence")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cli_fills_with_a_block_causal_checkpoint(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str
) -> None:
    from engine.commands.cli import main

    (tmp_path / "p.py").write_text(PREFIX)
    (tmp_path / "s.py").write_text(SUFFIX)
    argv = ["fill", "--model", str(dirs[family]), "--prefix-file", str(tmp_path / "p.py")]
    argv += ["--suffix-file", str(tmp_path / "s.py"), "--canvas-tokens", "6", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1
    assert main([*argv, "--quantization", "int8"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1


def test_one_token_at_a_time_is_refused_with_a_warning(models: dict[str, Any]) -> None:
    engine = local_engine(models["sdar"], FillOptions(canvas_tokens=6, strategy="autoregressive", use_drafter=False))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert any("no autoregressive mode" in w for w in r.warnings) and r.steps >= 1


def test_load_errors_name_the_problem(dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="use backend block_causal"):
        load_model(dirs["sdar"], backend="dream")
    with pytest.raises(ModelLoadError, match="block_size must be a positive integer"):
        load_model(block_checkpoint.write(tmp_path / "size", "sdar", block_size="4"))
    no_mask = block_checkpoint.write(tmp_path / "mask", "sdar", mask_token_id=None)
    tokenizer = json.loads((no_mask / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != block_checkpoint.SDAR_MASK]
    tokenizer["model"]["vocab"].pop(block_checkpoint.SDAR_MASK)
    (no_mask / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ModelLoadError, match="no mask token"):
        load_model(no_mask)


def test_the_models_command_shows_the_blocks(dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from engine.commands.cli import main

    assert main(["models", "--dir", str(dirs["sdar"].parent), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows["fast_dllm"]["backend"] == rows["sdar"]["backend"] == "block_causal"
    assert (
        rows["fast_dllm"]["blocks"] == "config.json: bd_size 8 -> Fast-dLLM v2, block-causal attention in blocks of 8"
    )
    assert rows["sdar"]["blocks"].startswith("config.json: block_size 4 -> SDAR")
    assert main(["models", "--dir", str(dirs["sdar"].parent)]) == 0
    assert "    config.json: bd_size 8 -> Fast-dLLM v2" in capsys.readouterr().out


# ----------------------------------------------------------------------------- review regressions


@pytest.mark.parametrize("scoped", [False, True], ids=["plain", "fill_state"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fills_of_other_lengths_give_the_recomputed_logits(models: dict[str, Any], family: str, scoped: bool) -> None:
    """One denoiser, fills one after the other: a context grown by the earlier canvas's own
    tokens (the same rows, the canvas starting three positions later), a long context then
    a short one (shorter rows than the earlier fill held); within a fill's state also
    canvases of another length or batch: every step's logits equal a fresh denoiser's.
    `scoped`: each fill in its own state (the sampler's, which reuses steps), else the
    context's state alone."""
    model = models[family]
    den = fresh(model)
    size, mask = den.block, den.info.mask_id
    words = torch.tensor(model.tokenizer.encode("return a + b\n" * 12)[: 3 * size])

    def fill(p: Prompt, *canvases: Any) -> None:
        state = den.prefill(p)
        state = den.fill_state(state) if scoped else state
        for canvas in canvases:
            other = fresh(model)
            want = other.denoise(other.prefill(p), canvas)
            torch.testing.assert_close(den.denoise(state, canvas), want, atol=1e-4, rtol=1e-4)

    done = torch.full((1, 3 * size), mask)
    done[0, : 2 * size] = words[: 2 * size]  # two blocks of tokens, then masks
    base = prompt(model)
    fill(base, done, done)
    grown = Prompt(prefix=base.prefix, suffix=base.suffix, middle=tuple(words[:3].tolist()))
    fill(grown, done[:, 3:], done[:, 3:])
    fill(
        prompt(model, prefix=PREFIX * 4), done, done, done[:, :size], done[:, : 2 * size + 1], done.expand(2, -1), done
    )
    fill(prompt(model, prefix="x", suffix=""), done[:, :size], done[:, :size])
    p, t = len(den.prefill(base).token_ids), len(den.prefill(base).token_ids) + 3 * size
    before = den.positions_run
    fill(base, done, done)
    context, first, second = p // size * size, t - p // size * size, t - (p + 2 * size) // size * size
    # in a fill's state the second step holds the first's two blocks of tokens: only the last block runs
    assert den.positions_run - before == context + first + (second if scoped else first)


@pytest.mark.parametrize(
    ("strategy", "steps", "want"),
    [
        ("confidence", 3, [1, 7, 1, 7, 1, 7]),  # one step a block: the settled token's is not it
        ("low_confidence", 6, [1, 4, 3, 1, 4, 3, 1, 4, 3]),  # two a block, the block's seven spread over them
    ],
)
def test_a_settled_token_takes_a_step_outside_its_blocks_share(strategy: str, steps: int, want: list[int]) -> None:
    """A shifted model's first token of a block is taken alone, in a step of its own: each
    block still has its max_steps // blocks steps for the rest of it."""
    cfg = SamplerConfig(strategy=strategy, confidence_threshold=0.9, block_length=8, max_steps=steps)  # type: ignore[arg-type]
    got, result = unmasked_each_step(KnownBlocks(8, 1, 0), list(PRIMES[:16]), 24, cfg)  # the prompt ends a block
    assert [len(s) for s in got] == want
    assert result.stop_reason == "complete" and result.steps == len(want)


@pytest.mark.parametrize("block_length", [None, 4])
def test_a_block_start_settles_only_after_every_position_before_it_is_locked(block_length: int | None) -> None:
    """Drafts (unlocked proposals) before a model's block start: its prediction reads them,
    so it is not settled, and not taken alone, until every position before it is locked."""
    info = KnownBlocks(8, 1, 5).info
    canvas = np.full((1, 12), MASK, dtype=np.int64)  # after 4 tokens: canvas position 4 begins a block
    cfg = SamplerConfig(strategy="confidence", block_length=block_length, max_steps=64)
    open_ = np.ones((1, 12), dtype=bool)  # drafts at 0..3 are open, as the masks after them
    assert not sampler._Blocks(info, 4, canvas, cfg).window(open_).lead.any()
    open_[0, :4] = False  # now locked
    lead = sampler._Blocks(info, 4, canvas, cfg).window(open_).lead
    assert lead.tolist() == [[i == 4 for i in range(12)]]


def test_a_block_length_must_divide_the_models_blocks(tmp_path: Path) -> None:
    """The sampler's blocks fall within the model's: a block length generation_config.json or
    config.json's defaults set that does not divide the model's is refused at load; the
    family's own becomes the largest divisor of the model's not above it."""
    with pytest.raises(
        ModelLoadError, match=r"generation_config.json: small_block_size 3 does not divide .* bd_size 8"
    ):
        load_model(block_checkpoint.write(tmp_path / "gen", generation={"small_block_size": 3}))
    own = {"defaults": {"block_length": 16}}
    with pytest.raises(ModelLoadError, match=r"diffusion_lsp.defaults.block_length 16 does not divide .* block_size 4"):
        load_model(block_checkpoint.write(tmp_path / "own", "sdar", diffusion_lsp=own))
    assert load_model(block_checkpoint.write(tmp_path / "wide", bd_size=12)).defaults["block_length"] == 6
    one = load_model(block_checkpoint.write(tmp_path / "one", diffusion_lsp={"defaults": {"block_length": None}}))
    assert one.defaults["block_length"] is None  # the canvas as one block


@pytest.mark.parametrize("family", FAMILIES)
def test_a_keystroke_reuses_the_context_and_fills_as_a_fresh_denoiser(models: dict[str, Any], family: str) -> None:
    """Two fills, the second after a keystroke: the context's blocks before it are not run
    again, and the fill is a fresh denoiser's (the exact cache changes no result)."""
    model = models[family]
    opts = FillOptions(canvas_tokens=10, use_drafter=False)
    engine = local_engine(replace(model, denoiser=fresh(model)), opts)
    den = engine.generator.den  # type: ignore[attr-defined]
    engine.fill(InfillRequest(prefix=PREFIX * 3, suffix=SUFFIX))
    (first,) = engine.generator.cache._entries.values()  # type: ignore[attr-defined]
    typed = InfillRequest(prefix=PREFIX * 3 + "a", suffix=SUFFIX)  # one more character at the cursor
    before = den.positions_run
    warm = engine.fill(typed)
    warm_run = den.positions_run - before
    cold_engine = local_engine(replace(model, denoiser=fresh(model)), opts)
    cold = cold_engine.fill(typed)
    cold_run = cold_engine.generator.den.positions_run  # type: ignore[attr-defined]
    (state,) = cold_engine.generator.cache._entries.values()  # type: ignore[attr-defined]
    shared = common_prefix_len(first.token_ids, state.token_ids) // den.block * den.block
    assert shared > 2 * den.block and warm_run <= cold_run - shared + den.block  # a shifted model runs one again
    assert [c.token_ids for c in warm.candidates] == [c.token_ids for c in cold.candidates]
    assert warm.steps == cold.steps


def test_what_a_fill_held_for_its_steps_goes_with_it(models: dict[str, Any]) -> None:
    """The sampler asks for a fill's own state; once the fill is done nothing refers to it
    (its canvas blocks' keys and values are freed), though its steps used it."""
    import gc
    import weakref

    model = models["sdar"]
    kept: list[weakref.ref[Any]] = []
    reused: list[bool] = []

    class Watched(BlockCausalDenoiser):
        def fill_state(self, state: EncodedContext) -> EncodedContext:
            out = super().fill_state(state)
            kept.append(weakref.ref(out.payload))
            return out

        def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any = None) -> Any:
            reused.append(getattr(state.payload, "steps", None) is not None)
            return super().denoise(state, canvas_ids, self_cond)

    den = fresh(model, Watched)
    engine = local_engine(replace(model, denoiser=den), FillOptions(canvas_tokens=10, use_drafter=False))
    engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    gc.collect()
    assert len(kept) == 1 and kept[0]() is None
    assert any(reused)  # a later step of the fill found what an earlier one held


@pytest.mark.parametrize(("window", "exact"), [(None, True), (4, False), (16, True)])
def test_a_cache_is_cropped_only_where_that_is_exact(window: int | None, exact: bool) -> None:
    """hf_cache.cropped, which every transformers backend crops through: a fork holding the
    first positions, the cache itself untouched; None where a sliding-window layer already
    dropped older tokens (the caller runs them again)."""
    from transformers import Qwen2Config
    from transformers.cache_utils import DynamicCache

    from engine.denoisers.hf_cache import cropped

    shape = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2}
    sliding = {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0} if window else {}
    cache = DynamicCache(config=Qwen2Config(**shape, **sliding))
    for layer in range(2):
        cache.update(torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), layer)
    cut = cropped(cache, 4)
    assert cache.get_seq_length() == 6 and (cut is not None) == exact
    if cut is not None:
        assert cut.get_seq_length() == 4 and cropped(cache, 9) is not None
