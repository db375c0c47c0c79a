"""The llada backend on tiny random checkpoints in LLaDA's own format (tests/llada_checkpoint.py):
loading by model_type, the layout, the logits against LLaDA's forward written out here from
its equations on the same tensors, the low_confidence strategy against LLaDA's generate()
written out here on known logits, fills through the engine and the command line,
quantization, the device, and errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from engine.decoding import SamplerConfig  # noqa: E402
from engine.denoisers import quant  # noqa: E402
from engine.denoisers.base import Autoregressive, Denoiser, DenoiserInfo, EncodedContext, Prompt  # noqa: E402
from engine.denoisers.llada import LLaDADenoiser  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.denoisers.onnx import NumpyRandomSource  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local import sampler  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from engine.local.steering import Steering  # noqa: E402
from tests import llada_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llada_checkpoint.write(tmp_path_factory.mktemp("llada") / "tiny-llada")


@pytest.fixture(scope="module")
def loaded(llada_dir: Path) -> Any:
    return load_model(llada_dir)


def prompt(model: Any, prefix: str = PREFIX, suffix: str = SUFFIX) -> Prompt:
    tok = model.tokenizer
    return Prompt(prefix=tuple(tok.encode(prefix)), suffix=tuple(tok.encode(suffix)))


# ----------------------------------------------------------------------------- LLaDA's forward, written out


def llada_forward(root: Path, ids: list[int]) -> Any:
    """(T, V) logits of LLaDA's LLaDAModelLM (block_type llama, as its modeling_llada.py
    computes them) on one sequence, from the checkpoint's tensors under their own names:
    x = wte[ids]; per block, x += attn_out(attention(rope(q), rope(k), v)) over
    attn_norm(x) with no mask (full attention), then x += ff_out(silu(ff_proj(h)) * up_proj(h))
    over h = ff_norm(x); logits = ff_out(ln_f(x)), read at each position itself."""
    cfg = json.loads((root / "config.json").read_text())
    w: dict[str, Any] = {}
    for file in root.glob("*.safetensors"):
        w |= load_file(str(file))
    d, heads, kv, eps = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["rms_norm_eps"]
    hd, t = d // heads, len(ids)

    def rms(x: Any, weight: Any) -> Any:  # RMSLayerNorm: in float32, then times the weight
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    freqs = torch.outer(torch.arange(t, dtype=torch.float), inv)
    sin, cos = torch.cat([freqs, freqs], -1).sin(), torch.cat([freqs, freqs], -1).cos()

    def rope(x: Any) -> Any:  # (H, T, hd): the two halves rotated (RotaryEmbedding.rotate_half)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = w["model.transformer.wte.weight"][ids]  # (T, D)
    for i in range(cfg["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        h = rms(x, w[b + "attn_norm.weight"])
        q = rope((h @ w[b + "q_proj.weight"].T).view(t, heads, hd).transpose(0, 1))  # (H, T, hd)
        k = rope((h @ w[b + "k_proj.weight"].T).view(t, kv, hd).transpose(0, 1))
        v = (h @ w[b + "v_proj.weight"].T).view(t, kv, hd).transpose(0, 1)
        k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / hd**0.5, -1) @ v  # (H, T, hd), nothing masked
        x = x + att.transpose(0, 1).reshape(t, d) @ w[b + "attn_out.weight"].T
        h = rms(x, w[b + "ff_norm.weight"])
        gated = torch.nn.functional.silu(h @ w[b + "ff_proj.weight"].T) * (h @ w[b + "up_proj.weight"].T)
        x = x + gated @ w[b + "ff_out.weight"].T
    return rms(x, w["model.transformer.ln_f.weight"]) @ w["model.transformer.ff_out.weight"].T


# ----------------------------------------------------------------------------- loading, layout


def test_loads_as_the_llada_backend_with_the_checkpoints_ids(loaded: Any, llada_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    cfg = json.loads((llada_dir / "config.json").read_text())
    den, tok = loaded.denoiser, loaded.tokenizer.hf
    assert loaded.backend == "llada" and isinstance(den, LLaDADenoiser) and isinstance(den, Denoiser)
    assert not isinstance(den, Autoregressive)  # no one-token mode
    assert isinstance(den.model, LlamaForCausalLM) and not den.model.config.tie_word_embeddings
    assert den.info.regime == "absorbing" and not den.info.autoregressive
    assert den.info.mask_id == cfg["mask_token_id"] == tok.token_to_id("<|mdm_mask|>")
    assert den.info.eof_id == den.info.pad_id == cfg["eos_token_id"]
    assert den.info.vocab_size == cfg["embedding_size"] and den.info.max_positions == cfg["max_sequence_length"]
    for name in ("<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>", "<|startoftext|>"):
        assert tok.token_to_id(name) in den.info.suppress_ids
    assert cfg["embedding_size"] - 1 in den.info.suppress_ids and den.info.eof_id not in den.info.suppress_ids
    assert loaded.defaults == {"strategy": "low_confidence"}


def test_the_prompt_is_laid_out_in_place_with_no_markers(loaded: Any, tmp_path: Path) -> None:
    den = loaded.denoiser
    start = loaded.tokenizer.hf.token_to_id("<|startoftext|>")  # the config names no BOS: the tokenizer's
    p, s, m = (21, 22, 23), (11, 12), (31,)
    assert den.layout.split(Prompt(prefix=p, suffix=s, middle=m)) == ((start, *p, *m), s)
    assert den.layout.ids(Prompt(prefix=p, suffix=s, middle=m)) == (start, *p, *m, *s)
    assert den.layout.split(Prompt(prefix=(5, 6), suffix=s, plain=True)) == ((start, 5, 6), ())
    assert den.prefill([5, 6]).token_ids == (start, 5, 6) and den.layout.overhead == 1
    with pytest.raises(ValueError, match="max_positions"):
        den.prefill(Prompt(prefix=(7,) * 600))


def test_denoise_equals_lladas_forward_unshifted_under_full_attention(loaded: Any, llada_dir: Path) -> None:
    den = loaded.denoiser
    ctx = prompt(loaded)
    before, after = den.layout.split(ctx)
    canvas = torch.full((2, 6), den.info.mask_id)
    canvas[1, 2] = loaded.tokenizer.encode("a")[0]
    got = den.denoise(den.prefill(ctx), canvas)
    assert got.shape == (2, 6, den.info.vocab_size) and got.dtype == torch.float32
    p = len(before)
    for row in range(2):
        want = llada_forward(llada_dir, [*before, *canvas[row].tolist(), *after])
        torch.testing.assert_close(got[row], want[p : p + 6], atol=1e-4, rtol=1e-4)
        assert not torch.allclose(got[row], want[p - 1 : p + 5], atol=1e-2)  # Dream's shift would not match
    # bidirectional: the suffix and a later canvas token change the first position's logits
    other = den.denoise(den.prefill(prompt(loaded, suffix="\nclass Point:\n")), canvas)
    assert not torch.allclose(other[0, 0], got[0, 0], atol=1e-4)
    assert not torch.allclose(got[0, 0], got[1, 0], atol=1e-4)


def test_the_dual_cache_matches_exact_on_the_first_step_and_keeps_the_context(loaded: Any) -> None:
    exact = loaded.denoiser
    dual = LLaDADenoiser(exact.model, exact.layout, exact.info, cache="dual")
    state = dual.prefill(prompt(loaded))
    canvas = torch.full((3, 5), exact.info.mask_id)
    first = dual.denoise(state, canvas)
    torch.testing.assert_close(first, exact.denoise(state, canvas), atol=1e-4, rtol=1e-4)
    # a later step runs the canvas alone against the first step's context keys and values:
    # the canvas unchanged, it is the exact step again; changed, an approximation of it
    torch.testing.assert_close(dual.denoise(state, canvas), first, atol=1e-4, rtol=1e-4)
    moved = canvas.clone()
    moved[:, :3] = torch.tensor(loaded.tokenizer.encode("return a + b")[:3])
    approx, want = dual.denoise(state, moved), exact.denoise(state, moved)
    assert not torch.allclose(approx, first, atol=1e-4)  # the canvas was run again
    assert (approx - want).abs().max() < (first - want).abs().max()  # closer to the exact step than no step
    before, after = dual.layout.split(prompt(loaded))
    assert dual._dual is not None and dual._dual[0] == (before, after, 5)
    with pytest.raises(ValueError, match="cache must be"):
        LLaDADenoiser(exact.model, exact.layout, exact.info, cache="none")


def test_a_bos_in_config_is_the_start_and_generation_config_sets_the_steps(tmp_path: Path) -> None:
    gen = {"steps": 16, "gen_length": 16, "block_length": 16, "remasking": "low_confidence", "temperature": 0.0}
    root = llada_checkpoint.write(tmp_path / "ck", shards=1, bos_token_id=0, generation=gen)
    model = load_model(root)
    assert model.denoiser.layout.start == 0
    assert model.defaults == {"max_steps": 16, "block_length": 16, "strategy": "low_confidence"}
    assert local_engine(model).generator.default_sampler().block_length == 16  # type: ignore[attr-defined]


def test_a_fill_in_blocks_through_the_engine(loaded: Any) -> None:
    """The engine passes the model's block length on: the canvas is decoded block after
    block, each within its share of the steps (as test_every_strategy_... has it)."""
    from dataclasses import replace

    seen: list[Any] = []

    class Seen(LLaDADenoiser):
        def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any = None) -> Any:
            seen.append(torch.as_tensor(canvas_ids)[0].clone())
            return super().denoise(state, canvas_ids, self_cond)

    den = loaded.denoiser
    defaults = {**loaded.defaults, "block_length": 3, "max_steps": 8}
    model = replace(loaded, denoiser=Seen(den.model, den.layout, den.info), defaults=defaults)
    engine = local_engine(model, FillOptions(canvas_tokens=9, use_drafter=False))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.candidates and 1 <= r.steps <= 8 and len(seen) == r.steps
    mask, width = den.info.mask_id, seen[0].shape[0]
    blocks = -(-width // 3)  # 8 // blocks steps each
    # each step's canvas against the next (the last against the fill): the blocks of the
    # positions it unmasked (padding after an end is not the step's pick)
    pad = den.info.pad_id
    after = [*seen[1:], torch.as_tensor([*r.candidates[0].token_ids, *[pad] * width][:width])]
    picked = [
        {j // 3 for j in range(width) if a[j] == mask and b[j] not in (mask, pad)}
        for a, b in zip(seen, after, strict=True)
    ]
    assert all(len(b) <= 1 for b in picked)  # one block a step
    order = [min(b) for b in picked if b]
    assert order == sorted(order) and all(order.count(k) <= 8 // blocks for k in set(order))
    assert (width, order) == (9, [0, 0, 1, 1, 2, 2])  # low_confidence: each block's masks over its two steps


# ----------------------------------------------------------------------------- LLaDA's generate(), written out


V, MASK, EOS = 40, 39, 1


def known_logits(canvas: np.ndarray, seed: int) -> np.ndarray:
    """(B, C, V) logits that depend on the whole canvas (each position sees every token):
    a fixed part per position plus a mix of every position's token; end of text and the
    mask far below the rest, so only the order of unmasking is under test."""
    rng = np.random.default_rng(seed)
    c = canvas.shape[1]
    base = rng.normal(0.0, 2.0, (c, V))
    mix, emb = rng.normal(0.0, 0.5, (c, c)), rng.normal(0.0, 1.0, (V, V))
    out = base[None] + np.einsum("ij,bjv->biv", mix, emb[canvas])
    out[..., [0, EOS, MASK]] = -30.0
    return out.astype(np.float32)


def reference_generate(gen_length: int, steps: int, block_length: int, seed: int) -> tuple[list[set[int]], Any]:
    """LLaDA's generate() (ML-GSAI/LLaDA generate.py: temperature 0, cfg_scale 0,
    remasking 'low_confidence', an empty prompt), re-implemented on `known_logits`: per
    block, get_num_transfer_tokens spreads its masks over steps // blocks steps (base, plus
    one for the first `remainder` steps); each step unmasks that many masked positions of
    the block with the highest softmax probability of their argmax. Returns the positions
    unmasked at each step and the final sequence."""
    x = torch.full((1, gen_length), MASK, dtype=torch.long)
    blocks = gen_length // block_length
    order = []
    for nb in range(blocks):
        masked = int((x[:, nb * block_length : (nb + 1) * block_length] == MASK).sum())
        per_block = steps // blocks
        counts = [masked // per_block + (1 if i < masked % per_block else 0) for i in range(per_block)]
        for i in range(per_block):
            mask_index = x == MASK
            logits = torch.from_numpy(known_logits(x.numpy(), seed)).double()
            x0 = logits.argmax(-1)
            x0_p = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
            x0_p[:, (nb + 1) * block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=torch.double))
            _, select = torch.topk(confidence[0], k=counts[i])
            x[0, select] = x0[0, select]
            order.append({int(j) for j in select})
    return [s for s in order if s], x[0]


class KnownDenoiser:
    """A denoiser whose logits are `known_logits` of the canvas."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.info = DenoiserInfo(
            vocab_size=V, regime="absorbing", eof_id=EOS, pad_id=EOS, mask_id=MASK, max_positions=512
        )

    def prefill(self, prompt: Any, state: Any = None) -> EncodedContext:
        return EncodedContext((), None)

    def denoise(self, state: EncodedContext, canvas: Any, self_cond: Any = None) -> Any:
        return known_logits(np.asarray(canvas), self.seed)

    def as_array(self, values: Any) -> Any:
        return np.asarray(values)


def unmasked_each_step(cfg: SamplerConfig, length: int, seed: int) -> tuple[list[set[int]], Any]:
    """The positions the sampler unmasks at each step on `known_logits`, and its result."""
    den = KnownDenoiser(seed)
    seen: list[np.ndarray] = []
    steer = Steering(on_step=lambda view: seen.append(np.asarray(view.canvas)[0].copy()))
    canvas = np.full((1, length), MASK, dtype=np.int64)
    result = sampler.run(den, den.prefill(None), canvas, cfg, NumpyRandomSource(0), steer=steer)
    before = [np.full(length, MASK), *seen[:-1]]
    got = [
        {int(j) for j in np.flatnonzero((old == MASK) & (new != MASK))} for old, new in zip(before, seen, strict=True)
    ]
    return got, result


@pytest.mark.parametrize(
    ("length", "steps", "block", "seed"),
    [
        (12, 12, None, 0),
        (10, 4, None, 1),
        (16, 5, None, 2),
        (7, 32, None, 3),
        (9, 1, None, 4),
        # semi-autoregressive blocks (generate()'s block_length): steps // blocks a block
        (16, 8, 4, 5),
        (12, 6, 4, 6),
        (32, 8, 8, 7),
        (20, 20, 5, 8),
        (12, 3, 4, 9),
    ],
)
def test_low_confidence_unmasks_in_lladas_order(length: int, steps: int, block: int | None, seed: int) -> None:
    want, final = reference_generate(length, steps, block_length=block or length, seed=seed)
    cfg = SamplerConfig(strategy="low_confidence", max_steps=steps, block_length=block)
    got, result = unmasked_each_step(cfg, length, seed)
    assert got == want
    assert result.tokens[0].tolist() == final.tolist() and result.stop_reason == "complete"


@pytest.mark.parametrize("strategy", ["entropy_bound", "confidence", "fixed_k", "left_to_right"])
def test_every_strategy_decodes_block_after_block_within_its_share(strategy: str) -> None:
    """Blocks are the sampler's, not low_confidence's: a block's masks are unmasked only once
    the blocks before it are done, each within steps // blocks steps (its last step takes
    what is left of it)."""
    cfg = SamplerConfig(strategy=strategy, max_steps=6, block_length=5, confidence_threshold=0.99)  # type: ignore[arg-type]
    got, result = unmasked_each_step(cfg, 15, seed=10)
    assert len(got) <= 6 and result.stop_reason == "complete"
    blocks = [{j // 5 for j in step} for step in got]
    assert all(len(b) == 1 for b in blocks)  # one block a step
    order = [b.pop() for b in blocks]
    assert order == sorted(order) and [order.count(k) for k in range(3)] == [2, 2, 2]


def test_other_strategies_unmask_in_another_order() -> None:
    """The test above can fail: fixed_k at the same average count takes another path."""
    want, _ = reference_generate(10, 4, block_length=10, seed=1)
    den = KnownDenoiser(1)
    seen: list[np.ndarray] = []
    cfg = SamplerConfig(strategy="fixed_k", k=3, max_steps=4)
    steer = Steering(on_step=lambda view: seen.append(np.asarray(view.canvas)[0].copy()))
    sampler.run(den, den.prefill(None), np.full((1, 10), MASK), cfg, NumpyRandomSource(0), steer=steer)
    before = [np.full(10, MASK), *seen[:-1]]
    got = [
        {int(j) for j in np.flatnonzero((old == MASK) & (new != MASK))} for old, new in zip(before, seen, strict=True)
    ]
    assert [len(s) for s in got] != [len(s) for s in want]


# ----------------------------------------------------------------------------- fills


@pytest.mark.parametrize(("strategy", "cache"), [(None, "exact"), ("entropy_bound", "exact"), (None, "dual")])
def test_fills_through_the_engine(loaded: Any, strategy: str | None, cache: str) -> None:
    from dataclasses import replace

    den = loaded.denoiser
    model = replace(loaded, denoiser=LLaDADenoiser(den.model, den.layout, den.info, cache=cache))
    engine = local_engine(model, FillOptions(canvas_tokens=8, strategy=strategy, use_drafter=False))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, candidates=2))
    assert 1 <= r.steps <= 32 and r.candidates
    assert all(len(c.token_ids) <= 8 for c in r.candidates)
    assert all(t not in loaded.denoiser.info.suppress_ids for c in r.candidates for t in c.token_ids)


def test_one_token_at_a_time_is_refused_with_a_warning(loaded: Any) -> None:
    engine = local_engine(loaded, FillOptions(canvas_tokens=6, strategy="autoregressive", use_drafter=False))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert any("no autoregressive mode" in w for w in r.warnings) and r.steps >= 1


def test_the_cli_fills_with_a_llada_checkpoint(
    llada_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.commands.cli import main

    (tmp_path / "p.py").write_text(PREFIX)
    (tmp_path / "s.py").write_text(SUFFIX)
    argv = ["fill", "--model", str(llada_dir), "--prefix-file", str(tmp_path / "p.py")]
    argv += ["--suffix-file", str(tmp_path / "s.py"), "--canvas-tokens", "6", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1
    assert main([*argv, "--quantization", "int8"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] >= 1


def test_the_server_settings_load_a_quantized_llada_checkpoint(llada_dir: Path) -> None:
    from lsp_server.service import FillService
    from lsp_server.settings import parse_settings

    settings, problems = parse_settings({"model": str(llada_dir), "quantization": "4bit", "backend": "llada"})
    assert problems == []
    fills = FillService()
    assert fills.load(settings) is None and fills.engine is not None
    model = fills.engine.generator.model.denoiser.model  # type: ignore[attr-defined]
    assert any(isinstance(m, quant.QuantLinear) for m in model.modules())


# ----------------------------------------------------------------------------- quantization, device


@pytest.mark.parametrize("setting", ["int8", "4bit"])
def test_quantized_llada_steps_close_to_full_precision(loaded: Any, llada_dir: Path, setting: str) -> None:
    small = load_model(llada_dir, quantization=setting)
    layers = [m for m in small.denoiser.model.modules() if isinstance(m, quant.QuantLinear)]
    assert len(layers) == 2 * 7  # every projection of both blocks; not the head or the embedding
    assert not isinstance(small.denoiser.model.lm_head, quant.QuantLinear)
    canvas = torch.full((1, 6), loaded.denoiser.info.mask_id)

    def step(model: Any, suffix: str = SUFFIX) -> Any:
        den = model.denoiser
        return den.denoise(den.prefill(prompt(model, suffix=suffix)), canvas)

    full, other = step(loaded), step(loaded, suffix="\nclass Point:\n")
    assert (step(small) - full).abs().max() < (other - full).abs().max()


def test_the_device_is_chosen_by_hf_device(llada_dir: Path) -> None:
    assert load_model(llada_dir, device="auto").denoiser.device.type == "cpu"  # no CUDA or Apple GPU here
    with pytest.raises(ModelLoadError, match="set device to cpu"):
        load_model(llada_dir, device="cuda" if not torch.cuda.is_available() else "mps")


# ----------------------------------------------------------------------------- errors


def test_load_errors_name_the_problem(llada_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="use backend llada"):
        load_model(llada_dir, backend="dream")
    with pytest.raises(ModelLoadError, match="block_type is 'sequential'"):
        load_model(llada_checkpoint.write(tmp_path / "seq", shards=1, block_type="sequential"))
    with pytest.raises(ModelLoadError, match="activation_type is 'swiglu'"):
        load_model(llada_checkpoint.write(tmp_path / "glu", shards=1, activation_type="swiglu"))
    from safetensors.torch import save_file

    root = llada_checkpoint.write(tmp_path / "torn", shards=1)
    weights = load_file(str(root / "model.safetensors"))
    del weights["model.transformer.blocks.1.up_proj.weight"]
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lack 1 tensors"):
        load_model(root)
    with pytest.raises(ModelLoadError, match="diffusion_lsp.cache must be"):
        load_model(llada_checkpoint.write(tmp_path / "cache", shards=1, diffusion_lsp={"cache": "kv"}))
    small = llada_checkpoint.write(tmp_path / "rows", shards=1, embedding_size=64, vocab_size=64)
    with pytest.raises(ModelLoadError, match="does not belong"):
        load_model(small)
