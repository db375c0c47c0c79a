"""The dream backend on tiny random Dream / Qwen2 / Llama checkpoints: the layouts, the
shifted logits, full attention, the causal mode against transformers' own classes, the
dual cache, loading and errors, and fills through the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import Qwen2ForCausalLM  # noqa: E402

from engine.denoisers.base import Prompt  # noqa: E402
from engine.denoisers.dream import DreamDenoiser, DreamPayload  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from engine.fill import FillOptions, InfillRequest  # noqa: E402
from engine.local.generator import local_engine  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nfor i in range(10):\n    print(i)\n"


@pytest.fixture(scope="module")
def dream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint.write(tmp_path_factory.mktemp("dream") / "tiny-dream", autoregressive=True)


@pytest.fixture(scope="module")
def loaded(dream_dir: Path) -> Any:
    torch.set_num_threads(1)
    return load_model(dream_dir)


@pytest.fixture(scope="module")
def reference(dream_dir: Path) -> Any:
    """The same weights as transformers' own Qwen2ForCausalLM."""
    from engine.denoisers.dream import qwen2_config

    cfg = json.loads((dream_dir / "config.json").read_text())
    return Qwen2ForCausalLM.from_pretrained(dream_dir, config=qwen2_config(cfg), dtype=torch.float32).eval()


def context(loaded: Any, prefix: str = PREFIX, suffix: str = SUFFIX) -> Prompt:
    tok = loaded.tokenizer
    return Prompt(prefix=tuple(tok.encode(prefix)), suffix=tuple(tok.encode(suffix)))


def full_logits(model: Any, ids: list[int] | Any, causal: bool) -> Any:
    """(T, V) logits of transformers' model on one sequence, causal or with full attention."""
    seq = torch.as_tensor(ids).reshape(1, -1)
    with torch.no_grad():
        if causal:
            return model(input_ids=seq).logits[0]
        t = seq.shape[1]
        zeros = torch.zeros((1, 1, t, t))
        return model(input_ids=seq, attention_mask={"full_attention": zeros}).logits[0]


# ----------------------------------------------------------------------------- layouts


def test_loads_as_the_dream_backend_with_the_checkpoints_ids(loaded: Any, dream_dir: Path) -> None:
    cfg = json.loads((dream_dir / "config.json").read_text())
    den = loaded.denoiser
    assert loaded.backend == "dream" and isinstance(den, DreamDenoiser)
    assert den.info.regime == "absorbing" and den.info.mask_id == cfg["mask_token_id"]
    assert den.info.eof_id == cfg["eos_token_id"] and den.info.vocab_size == cfg["vocab_size"]
    tok = loaded.tokenizer.hf
    assert den.sp.start == tok.token_to_id("<|beginoftext|>")  # Dream's evaluations put it first
    # never sampled: the mask, the markers, chat tokens, and the rows past the tokenizer
    for name in ("<|mask|>", "<|fim_prefix|>", "<|im_start|>", "<|im_end|>"):
        assert tok.token_to_id(name) in den.info.suppress_ids
    assert cfg["vocab_size"] - 1 in den.info.suppress_ids and den.info.eof_id not in den.info.suppress_ids
    assert loaded.languages is None and loaded.defaults == {}


def test_the_prompt_is_laid_out_in_place_and_in_fim_order(loaded: Any) -> None:
    sp, den = loaded.tokenizer.special, loaded.denoiser
    s, p, m = (11, 12), (21, 22, 23), (31,)
    parts = den.layout.parts(Prompt(prefix=p, suffix=s, middle=m))
    assert parts.before == (den.sp.start, *p, *m) and parts.after == (*s, den.info.eof_id)
    assert parts.causal == (sp.prefix, *p, sp.suffix, *s, sp.middle, *m)
    assert den.layout.ids(Prompt(prefix=p, suffix=s, middle=m)) == parts.causal  # what a state covers
    plain = den.layout.parts(Prompt(prefix=(5, 6, 7), plain=True))  # no markers: a prompt, all prefix
    assert plain.before == plain.causal == (den.sp.start, 5, 6, 7) and plain.after == ()
    assert den.prefill([5, 6, 7]).token_ids == plain.causal  # bare ids are a plain prompt


# ----------------------------------------------------------------------------- the two modes


def test_the_causal_mode_equals_qwen2_for_causal_lm(loaded: Any, reference: Any) -> None:
    den = loaded.denoiser
    ctx = context(loaded)
    state = den.prefill(ctx)
    middle = loaded.tokenizer.encode("a + b")
    longer, logits = den.extend(state, middle)
    want = full_logits(reference, [*den.layout.ids(ctx), *middle], causal=True)
    torch.testing.assert_close(den.next_logits(state), want[-len(middle) - 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, want[-len(middle) :], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(den.next_logits(longer), want[-1], atol=1e-4, rtol=1e-4)
    assert longer.token_ids == (*den.layout.ids(ctx), *middle)


def test_denoise_is_full_attention_with_logits_shifted_by_one(loaded: Any, reference: Any) -> None:
    den = loaded.denoiser
    ctx = context(loaded)
    parts = den.layout.parts(ctx)
    canvas = torch.full((2, 6), den.info.mask_id)
    canvas[1, 2] = loaded.tokenizer.encode("a")[0]
    got = den.denoise(den.prefill(ctx), canvas)
    assert got.shape == (2, 6, den.info.vocab_size) and got.dtype == torch.float32
    for row in range(2):
        seq = [*parts.before, *canvas[row].tolist(), *parts.after]
        logits = full_logits(reference, seq, causal=False)[None]
        shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # Dream's generate(): i from i - 1
        p = len(parts.before)
        torch.testing.assert_close(got[row], shifted[0, p : p + 6], atol=1e-4, rtol=1e-4)
    # bidirectional: the suffix and later canvas tokens change the first position's logits
    other = den.denoise(den.prefill(context(loaded, suffix="\nclass Point:\n")), canvas)
    assert not torch.allclose(other[0, 0], got[0, 0], atol=1e-4)
    assert not torch.allclose(got[0, 0], got[1, 0], atol=1e-4)


def test_dual_cache_matches_exact_on_the_first_step_and_keeps_the_context(dream_dir: Path, loaded: Any) -> None:
    exact = loaded.denoiser
    dual = DreamDenoiser(exact.model, exact.sp, autoregressive=False, cache="dual")
    state = dual.prefill(context(loaded))
    canvas = torch.full((3, 5), exact.info.mask_id)
    first = dual.denoise(state, canvas)
    torch.testing.assert_close(first, exact.denoise(state, canvas), atol=1e-4, rtol=1e-4)
    # a later step runs the canvas against the first step's context keys and values:
    # with the canvas unchanged it is the exact step again; changed, only an approximation
    again = dual.denoise(state, canvas)
    torch.testing.assert_close(again, first, atol=1e-4, rtol=1e-4)
    moved = canvas.clone()
    moved[:, :3] = torch.tensor(loaded.tokenizer.encode("return a + b")[:3])
    approx, want = dual.denoise(state, moved), exact.denoise(state, moved)
    assert not torch.allclose(approx, first, atol=1e-4)  # the canvas was run again
    assert (approx - want).abs().max() < (first - want).abs().max()  # closer to the exact step than no step
    assert dual._dual is not None and dual._dual[0] == (state.token_ids, 5)


def test_encode_reuses_the_causal_cache_and_never_mutates_a_state(loaded: Any) -> None:
    den = loaded.denoiser
    first = den.prefill(context(loaded))
    before = [layer.keys.clone() for layer in first.payload.cache.layers]
    typed = den.prefill(context(loaded, prefix=PREFIX + "a"), first)
    fresh = den.prefill(context(loaded, prefix=PREFIX + "a"))
    torch.testing.assert_close(den.next_logits(typed), den.next_logits(fresh), atol=1e-5, rtol=1e-5)
    for old, layer in zip(before, first.payload.cache.layers, strict=True):
        torch.testing.assert_close(layer.keys, old, atol=0, rtol=0)
    assert isinstance(typed.payload, DreamPayload) and typed.nbytes > 0


# ----------------------------------------------------------------------------- fills


@pytest.mark.parametrize("strategy", ["entropy_bound", "confidence", "autoregressive", "verified"])
def test_fills_through_the_engine(loaded: Any, strategy: str) -> None:
    engine = local_engine(loaded, FillOptions(canvas_tokens=8, strategy=strategy, use_drafter=False))
    r = engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, candidates=2))
    assert r.steps >= 1 and r.candidates
    assert all(len(c.token_ids) <= 8 for c in r.candidates)
    assert all(t not in loaded.denoiser.info.suppress_ids for c in r.candidates for t in c.token_ids)


def test_verified_greedy_fill_is_the_one_token_fill(loaded: Any) -> None:
    # on the same prompt: middle priming, which the one-token strategy alone uses, changes it
    def fill(strategy: str) -> str:
        opts = FillOptions(canvas_tokens=10, strategy=strategy, use_drafter=False, middle_priming=False)
        engine = local_engine(loaded, opts)
        return engine.fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX)).candidates[0].text

    assert fill("verified") == fill("autoregressive")


# ----------------------------------------------------------------------------- other checkpoints, errors


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_an_autoregressive_checkpoint_decodes_one_token_at_a_time(tmp_path: Path, model_type: str) -> None:
    root = dream_checkpoint.write(tmp_path / model_type, model_type, mask=False)
    model = load_model(root)
    den = model.denoiser
    assert model.backend == "dream" and den.info.autoregressive
    assert model.defaults == {"strategy": "autoregressive"}
    assert den.info.mask_id == model.tokenizer.vocab_size  # its first unused row
    r = local_engine(model, FillOptions(canvas_tokens=6)).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.steps >= 1


def test_load_errors_name_the_problem(tmp_path: Path, dream_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="use backend dream"):
        load_model(dream_dir, backend="onnx")
    with pytest.raises(ModelLoadError, match="unknown quantization"):
        load_model(dream_dir, quantization="2bit")
    with pytest.raises(ModelLoadError, match="not a Dream, Qwen2 or Llama"):
        load_model(None, backend="dream")
    bare = dream_checkpoint.write(tmp_path / "bare")
    (bare / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no safetensors"):
        load_model(bare)
    cut = dream_checkpoint.write(tmp_path / "cut")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(cut / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(cut / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lack 1 tensors"):
        load_model(cut)
    bad = dream_checkpoint.write(tmp_path / "bad", cache="fast")
    with pytest.raises(ModelLoadError, match="diffusion_lsp.cache"):
        load_model(bad)


def test_a_dream_checkpoints_one_token_mode_is_off_unless_its_config_says(tmp_path: Path) -> None:
    model = load_model(dream_checkpoint.write(tmp_path / "d"))
    assert not model.denoiser.info.autoregressive
    state = model.denoiser.prefill([1, 2, 3])
    with pytest.raises(NotImplementedError, match="one-token mode is off"):
        model.denoiser.next_logits(state)
    r = local_engine(model, FillOptions(canvas_tokens=6)).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX))
    assert r.steps >= 1


def test_the_cli_fills_from_a_dream_checkpoint(dream_dir: Path, tmp_path: Path, capsys: Any) -> None:
    from engine.commands.cli import main

    (tmp_path / "p.py").write_text(PREFIX)
    (tmp_path / "s.py").write_text(SUFFIX)
    argv = ["fill", "--model", str(dream_dir), "--prefix-file", str(tmp_path / "p.py")]
    argv += ["--suffix-file", str(tmp_path / "s.py"), "--canvas-tokens", "6", "--strategy", "confidence", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] >= 1 and out["canvas_tokens"] == 6 and isinstance(out["middle"], str)
    assert main([*argv[:3], "--backend", "torch", *argv[3:]]) == 2
    assert "use backend dream" in capsys.readouterr().err
