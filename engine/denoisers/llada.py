"""The llada backend: LLaDA checkpoints (GSAI-ML/LLaDA-8B-Base and -Instruct) run through
transformers' own Llama modules, with no remote code.

LLaDA is a mask predictor trained from scratch: Llama's layers (RMSNorm, rotary positions,
SwiGLU, no biases) with full (bidirectional) attention and no shift: the hidden state at
position i predicts token i itself (Dream's predict i + 1). The Hub's checkpoints ship their
own config (`model_type: "llada"`, OLMo-style field names) and tensor names, which this module
maps onto `LlamaConfig` and `LlamaForCausalLM` (`llama_config`, `KEY_MAPPING`):

    config.json (LLaDA)                    LlamaConfig
    d_model                                hidden_size (head_dim = d_model / n_heads)
    n_layers, n_heads                      num_hidden_layers, num_attention_heads
    n_kv_heads (None: multi_query_attention ? 1 : n_heads)   num_key_value_heads
    mlp_hidden_size (None: mlp_ratio * d_model)              intermediate_size
    embedding_size (None: vocab_size)      vocab_size (the embedding's rows)
    max_sequence_length                    max_position_embeddings
    rope_theta, rms_norm_eps               rope_parameters.rope_theta, rms_norm_eps
    weight_tying                           tie_word_embeddings
    activation_type silu                   hidden_act silu: down(silu(gate(x)) * up(x))

    tensor (model.transformer. ...)        LlamaForCausalLM
    wte, ln_f, ff_out                      model.embed_tokens, model.norm, lm_head
    blocks.N.attn_norm, ff_norm            model.layers.N.input_layernorm, post_attention_layernorm
    blocks.N.q_proj, k_proj, v_proj        model.layers.N.self_attn.q_proj, k_proj, v_proj
    blocks.N.attn_out                      model.layers.N.self_attn.o_proj
    blocks.N.ff_proj, up_proj, ff_out      model.layers.N.mlp.gate_proj, up_proj, down_proj

Only what the released checkpoints use is accepted (`SUPPORTED`: the llama block, RMS norms,
rotary positions, SiLU gating, no biases, no QK norms, unscaled logits); any other value is a
ModelLoadError naming the field. The rotary embedding is the same function (the two halves of
each head rotated, as Llama's `rotate_half`); LLaDA computes it in float32, transformers' in
the model's dtype: equal on the CPU (float32), within bfloat16 rounding on a GPU.

Layout (`LLaDALayout`). LLaDA has no fill-in-the-middle tokens: it fills masks in place, as
its own infilling does. A prompt is laid out `start P M [canvas] S`: its start token
(`<|startoftext|>`, which LLaDA's tokenizer puts before every prompt), the prefix and the
fill so far, the canvas of masks, then the suffix, all under full attention. No end-of-text
after the suffix: the suffix is the code after the cursor cut to a budget, not the end of a
document, and an `<|endoftext|>` there would tell the model the text ends where it does not.
A plain prompt is `start P M [canvas]`. Since every context token attends to the canvas, no
exact context state survives a step: `cache="exact"` (the default) runs the whole sequence at
every step, as LLaDA's generate does, and `prefill` only lays the prompt out. `cache="dual"`
(config.json's diffusion_lsp.cache) is Fast-dLLM's approximation, as the dream backend has
it: the prefix's and suffix's keys and values come from one full pass at a fill's first step
and the later steps run the canvas alone against them (C queries instead of the sequence;
unshifted, no prefix token is run with it). There is no one-token mode.

Decoding. The checkpoint's default strategy is `low_confidence`, LLaDA's published order
(engine/local/sampler.py: the masks left spread evenly over the steps left, the most
probable first), over the canvas as one block, or in semi-autoregressive blocks where
generation_config.json (`block_length`) or config.json's defaults set a block length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel
    from transformers.cache_utils import Cache, DynamicCache
except ImportError as exc:
    raise ImportError("The llada backend needs torch and transformers: pip install 'diffusion-lsp[torch]'") from exc

from engine.denoisers.base import DenoiserInfo, EncodedContext, Prompt, as_prompt
from engine.denoisers.hf_cache import CACHE_KW, expand_cache, fork_cache
from engine.denoisers.hf_load import load_pretrained
from engine.denoisers.loading import LoadedModel
from engine.denoisers.torch import OnModelDevice
from engine.errors import ModelLoadError
from engine.models.directory import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    decoding_defaults,
    first_id,
    generation_mask_id,
    require,
)
from engine.models.tokenizer import Tokenizer

STRATEGY = "low_confidence"  # LLaDA's remasking='low_confidence' (engine/local/sampler.py)
CACHE_MODES = ("exact", "dual")
# LLaDA's tokenizer names (its config.json names no BOS; the mask's id is config.json's
# mask_token_id, 126336 in LLaDA-8B-Base and -Instruct)
START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mdm_mask|>"

_BLOCK = r"^model\.transformer\.blocks\.(\d+)\."
_LAYER = r"model.layers.\1."
# LLaDA's tensor names -> LlamaForCausalLM's (transformers' key_mapping: regular expressions)
KEY_MAPPING: dict[str, str] = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    _BLOCK + r"attn_norm\.": _LAYER + "input_layernorm.",
    _BLOCK + r"ff_norm\.": _LAYER + "post_attention_layernorm.",
    _BLOCK + r"q_proj\.": _LAYER + "self_attn.q_proj.",
    _BLOCK + r"k_proj\.": _LAYER + "self_attn.k_proj.",
    _BLOCK + r"v_proj\.": _LAYER + "self_attn.v_proj.",
    _BLOCK + r"attn_out\.": _LAYER + "self_attn.o_proj.",
    _BLOCK + r"ff_proj\.": _LAYER + "mlp.gate_proj.",
    _BLOCK + r"up_proj\.": _LAYER + "mlp.up_proj.",
    _BLOCK + r"ff_out\.": _LAYER + "mlp.down_proj.",
}

# LLaDA config fields whose value changes the computation: (the value Llama's modules compute,
# LLaDA's default when the field is absent). The released checkpoints have these values.
SUPPORTED: dict[str, tuple[object, object]] = {
    "block_type": ("llama", "sequential"),
    "layer_norm_type": ("rms", "default"),
    "activation_type": ("silu", "swiglu"),
    "rope": (True, False),
    "alibi": (False, False),
    "include_bias": (False, False),
    "include_qkv_bias": (False, False),
    "bias_for_layer_norm": (False, None),  # None: as include_bias
    "layer_norm_with_affine": (True, True),
    "attention_layer_norm": (False, False),
    "input_emb_norm": (False, False),
    "scale_logits": (False, False),
    "block_group_size": (1, 1),
}


# ---------------------------------------------------------------------------- the layout


@dataclass(frozen=True)
class LLaDALayout:
    """`start P M [canvas] S` (see the module): the canvas in place under full attention."""

    start: int | None  # before the prefix; None: nothing

    @property
    def overhead(self) -> int:
        return 0 if self.start is None else 1

    @property
    def primes(self) -> bool:
        return False  # no one-token mode

    def split(self, prompt: Prompt) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(what precedes the canvas, what follows it)."""
        head = () if self.start is None else (self.start,)
        before = (*head, *prompt.context, *prompt.prefix, *prompt.middle)
        return before, () if prompt.plain else tuple(prompt.suffix)

    def ids(self, prompt: Prompt) -> tuple[int, ...]:
        before, after = self.split(prompt)
        return (*before, *after)

    def repository(
        self, encode: Callable[[str], list[int]], files: Sequence[tuple[str, str]], name: str, path: str
    ) -> tuple[int, ...]:
        return ()  # no format for other files (docs/server.md, Repository context)


# ---------------------------------------------------------------------------- the denoiser


@dataclass(frozen=True)
class LLaDAPayload:
    before: tuple[int, ...]
    after: tuple[int, ...]


class LLaDADenoiser(OnModelDevice):
    """Denoiser over a Llama model run bidirectionally: absorbing canvas with LLaDA's mask
    token, logits unshifted; `denoise` takes any batch of canvases against one state and
    returns float32 logits (B, C, V)."""

    def __init__(self, model: PreTrainedModel, layout: LLaDALayout, info: DenoiserInfo, cache: str = "exact") -> None:
        if cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}; got {cache!r}")
        self.model = model
        self.layout = layout
        self.info = info
        self.cache_mode = cache
        self._dual: tuple[tuple[Any, ...], Cache] | None = None  # (before, after, canvas length) -> K/V

    def prefill(self, prompt: Prompt | Sequence[int], state: EncodedContext | None = None) -> EncodedContext:
        """Lay the prompt out (nothing to run: under full attention no context state survives a step)."""
        before, after = self.layout.split(as_prompt(prompt))
        if len(before) + len(after) >= self.info.max_positions:
            n = len(before) + len(after)
            raise ValueError(f"context of {n} tokens exceeds max_positions={self.info.max_positions}")
        return EncodedContext((*before, *after), LLaDAPayload(before, after))

    def denoise(self, state: EncodedContext, canvas_ids: Any, self_cond: Any | None = None) -> torch.Tensor:
        """One bidirectional pass of `before canvas after`: canvas (B, C) -> float32 logits
        (B, C, V), read at the canvas's own positions."""
        if not isinstance(state.payload, LLaDAPayload):
            raise TypeError("state was not made by LLaDADenoiser.prefill")
        before, after = state.payload.before, state.payload.after
        canvas = self.canvas_tensor(canvas_ids, len(before) + len(after))
        b, c = canvas.shape
        t = len(before) + c + len(after)
        with torch.inference_mode():
            if self.cache_mode == "dual":
                return self._dual_step(before, after, canvas)
            ids = self._sequence(before, after, canvas)
            hidden = self.model.model(input_ids=ids, attention_mask=self._full_mask(b, t, t)).last_hidden_state
            return self.model.lm_head(hidden[:, len(before) : len(before) + c]).float()  # (B, C, V)

    def _full_mask(self, batch: int, queries: int, keys: int) -> torch.Tensor:
        """Every query sees every key: an additive 4D mask of zeros, taken as given by LlamaModel."""
        return torch.zeros((batch, 1, queries, keys), dtype=self.model.dtype, device=self.device)

    def _sequence(self, before: tuple[int, ...], after: tuple[int, ...], canvas: torch.Tensor) -> torch.Tensor:
        """(B, T) ids of `before canvas after` for each canvas row."""
        b = canvas.shape[0]
        head = torch.tensor(before, dtype=torch.long, device=self.device).expand(b, -1)
        tail = torch.tensor(after, dtype=torch.long, device=self.device).expand(b, -1)
        return torch.cat([head, canvas, tail], dim=1)

    def _dual_step(self, before: tuple[int, ...], after: tuple[int, ...], canvas: torch.Tensor) -> torch.Tensor:
        """The canvas alone, at its positions, against the prefix's and suffix's keys and
        values from the fill's first step (Fast-dLLM's dual cache)."""
        b, c = canvas.shape
        key = (before, after, c)
        if self._dual is None or self._dual[0] != key:
            self._dual = (key, self._context_kv(before, after, canvas[:1]))
        cache = expand_cache(self._dual[1], b) if b > 1 else fork_cache(self._dual[1])  # a copy to grow
        positions = torch.arange(len(before), len(before) + c, device=self.device).unsqueeze(0)
        held = cache.get_seq_length()
        mask = self._full_mask(b, c, held + c)
        out = self.model.model(
            input_ids=canvas, position_ids=positions, attention_mask=mask, use_cache=True, **{CACHE_KW: cache}
        )
        return self.model.lm_head(out.last_hidden_state).float()  # (B, C, V)

    def _context_kv(self, before: tuple[int, ...], after: tuple[int, ...], canvas: torch.Tensor) -> Cache:
        """One full pass of `before canvas after` (batch 1); the keys and values of all but
        the canvas (rotary positions applied, so their order in the cache does not matter)."""
        p, c = len(before), canvas.shape[1]
        ids = self._sequence(before, after, canvas)
        t = ids.shape[1]
        cache = DynamicCache(config=self.model.config)
        self.model.model(input_ids=ids, attention_mask=self._full_mask(1, t, t), use_cache=True, **{CACHE_KW: cache})
        for layer in cache.layers:
            held: Any = layer  # a DynamicLayer: (1, H, T, D) keys and values
            held.keys = torch.cat([held.keys[:, :, :p], held.keys[:, :, p + c :]], dim=2)
            held.values = torch.cat([held.values[:, :, :p], held.values[:, :, p + c :]], dim=2)
        return cache


# ---------------------------------------------------------------------------- loading


def llama_config(cfg: dict[str, Any], where: Path) -> LlamaConfig:
    """A LLaDA config.json as the LlamaConfig of the same layers (the module's table), or a
    ModelLoadError naming a field whose value Llama's modules do not compute."""
    for name, (wanted, default) in SUPPORTED.items():
        value = cfg.get(name, default)
        if name == "bias_for_layer_norm" and value is None:
            value = cfg.get("include_bias", False)
        if value != wanted:
            raise ModelLoadError(
                f"{where / CONFIG_FILE}: {name} is {value!r}; the llada backend runs LLaDA's released "
                f"architecture ({name} {wanted!r})"
            )
    try:
        d, heads, layers = int(cfg["d_model"]), int(cfg["n_heads"]), int(cfg["n_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where / CONFIG_FILE}: not a LLaDA config (d_model, n_heads, n_layers): {exc}") from exc
    kv = cfg.get("n_kv_heads") or (1 if cfg.get("multi_query_attention") else heads)
    if d % heads or heads % kv:
        raise ModelLoadError(f"{where / CONFIG_FILE}: d_model {d}, n_heads {heads}, n_kv_heads {kv} do not divide")
    rows = int(cfg.get("embedding_size") or cfg["vocab_size"])
    return LlamaConfig(
        vocab_size=rows,
        hidden_size=d,
        intermediate_size=int(cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(kv),
        head_dim=d // heads,
        hidden_act="silu",
        max_position_embeddings=int(cfg.get("max_sequence_length", 1024)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))},
        tie_word_embeddings=bool(cfg.get("weight_tying", True)),
        attention_bias=False,
        mlp_bias=False,
        eos_token_id=first_id(cfg.get("eos_token_id")),
        pad_token_id=first_id(cfg.get("pad_token_id")),
    )


class _LLaDAWeights:
    """`LlamaForCausalLM.from_pretrained` reading LLaDA's tensor names (KEY_MAPPING), for hf_load."""

    @staticmethod
    def from_pretrained(path: str, **kwargs: Any) -> Any:
        return LlamaForCausalLM.from_pretrained(path, key_mapping=KEY_MAPPING, **kwargs)


def llada_tokens(path: Path, cfg: dict[str, Any], rows: int) -> tuple[Tokenizer, LLaDALayout, DenoiserInfo]:
    """(tokenizer, layout, the denoiser's facts) of a checkpoint: the mask from config.json's
    mask_token_id (else generation_config.json's, else the tokenizer's <|mdm_mask|>), the end
    of a fill at eos_token_id, padding at pad_token_id (LLaDA pads with its end of text), the
    start at bos_token_id (else the tokenizer's <|startoftext|>); never sampled: the mask,
    the tokenizer's other special tokens and the embedding rows past the tokenizer."""
    hf = Tokenizer.read(path / TOKENIZER_FILE)
    size = hf.get_vocab_size()
    if size > rows:
        raise ModelLoadError(
            f"{path}: tokenizer.json has {size} tokens but the model only {rows}: "
            "the tokenizer does not belong to this checkpoint"
        )
    mask = first_id(cfg.get("mask_token_id"))
    mask = mask if mask is not None else generation_mask_id(path)
    mask = mask if mask is not None else hf.token_to_id(MASK_TOKEN)
    eos = first_id(cfg.get("eos_token_id"))
    eos = eos if eos is not None else hf.token_to_id(END_TOKEN)
    if mask is None or eos is None:
        missing = "mask_token_id" if mask is None else "eos_token_id"
        raise ModelLoadError(f"{path / CONFIG_FILE} defines no {missing} (nor does the tokenizer name one)")
    pad = first_id(cfg.get("pad_token_id"))
    pad = eos if pad is None else pad
    start = first_id(cfg.get("bos_token_id"))
    start = start if start is not None else hf.token_to_id(START_TOKEN)
    for name, i in (("mask", mask), ("eos", eos), ("pad", pad), ("bos", start)):
        if i is not None and not 0 <= i < rows:
            raise ModelLoadError(f"{path / CONFIG_FILE}: the {name} token id {i} is outside the model's {rows} rows")
    # no fill-in-the-middle tokens: the tokenizer's marker fields name the start (nothing reads them here)
    marker = hf.id_to_token(start if start is not None else eos) or ""
    names = {"pad": hf.id_to_token(pad) or "", "eof": hf.id_to_token(eos) or "", "mask": hf.id_to_token(mask) or ""}
    tok = Tokenizer(hf, {**names, "suffix": marker, "prefix": marker, "middle": marker})
    special = [i for i, t in hf.get_added_tokens_decoder().items() if t.special and i not in (eos, pad)]
    info = DenoiserInfo(
        vocab_size=rows,
        regime="absorbing",
        eof_id=eos,
        pad_id=pad,
        mask_id=mask,
        max_positions=int(cfg.get("max_sequence_length", 1024)),
        suppress_ids=tuple(dict.fromkeys((mask, *special, *range(size, rows)))),
    )
    return tok, LLaDALayout(start), info


def load_dir(path: Path, cfg: dict[str, Any], *, device: str = "cpu", quantization: str = "none") -> LoadedModel:
    """A LLaDA checkpoint directory: config.json's fields mapped onto Llama's (the module),
    the weights read under their LLaDA names (safetensors only, local files only, no remote
    code, every tensor of the architecture found), on `device` at `quantization` after the
    memory check (engine.denoisers.hf_load). Decoding defaults: strategy low_confidence,
    generation_config.json's steps and temperature (engine.models.directory.decoding_defaults),
    then config.json's own "diffusion_lsp": {"defaults": {...}}; its "cache" is "exact" (the
    default) or "dual"."""
    require(path, TOKENIZER_FILE)
    own = cfg.get("diffusion_lsp", {})
    cache = own.get("cache", "exact")
    if cache not in CACHE_MODES:
        raise ModelLoadError(f"{path / CONFIG_FILE}: diffusion_lsp.cache must be one of {', '.join(CACHE_MODES)}")
    config = llama_config(cfg, path)
    tok, layout, info = llada_tokens(path, cfg, int(config.vocab_size))
    model = load_pretrained(
        path, _LLaDAWeights, config, cfg, device=device, quantization=quantization, build=LlamaForCausalLM
    )
    defaults = {**decoding_defaults(path).defaults, "strategy": STRATEGY, **own.get("defaults", {})}
    den = LLaDADenoiser(model, layout, info, cache=cache)
    return LoadedModel(path=path, tokenizer=tok, denoiser=den, backend="llada", defaults=defaults)
