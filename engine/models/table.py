"""The backend table: which backend loads which kind of checkpoint, what it takes and
what it needs installed.

A leaf: it imports nothing of torch and nothing of the engine but its errors, so the
settings, the command line and `pull` read it without loading a backend. Each row names
its loader as "module:function"; engine.denoisers.loading imports that module only when a
model of its kind is loaded. Adding a backend is one module (engine/denoisers/NAME.py with
a `load_dir(path, cfg, device=..., quantization=...) -> LoadedModel`) and one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ModelLoadError

# config.json model_type values
EMBEDDED_MODEL_TYPE = "diffusion_coder"  # the architecture this project trains and ships
DG_MODEL_TYPE = "diffusion_gemma"
DREAM_MODEL_TYPES = ("Dream", "dream")  # the Dream family: a diffusion-trained Qwen2
AUTOREGRESSIVE_MODEL_TYPES = ("qwen2", "llama")  # plain checkpoints, run by the dream backend too
LLADA_MODEL_TYPE = "llada"  # LLaDA (GSAI-ML): a Llama-style mask predictor, logits unshifted
# block-causal models (attention bidirectional within a block, causal across blocks)
FAST_DLLM_MODEL_TYPE = "Fast_dLLM_Qwen"  # Fast-dLLM v2 (NVlabs): Qwen2.5 layers, blocks of config.json's bd_size
SDAR_MODEL_TYPE = "sdar"  # SDAR (JetAstra): Qwen3 layers, blocks of config.json's block_size
BLOCK_CAUSAL_MODEL_TYPES = (FAST_DLLM_MODEL_TYPE, SDAR_MODEL_TYPE)
GGUF_ARCHITECTURES = ("qwen2", "llama")  # the GGUF files convert-gguf reads (their general.architecture)
ONNX_LM_MODEL_TYPE = "onnx_lm"  # one of those exported for onnxruntime (diffusion-infill export-onnx)

WEIGHT_QUANTIZATIONS = ("none", "int8", "4bit")  # engine/denoisers/quant.py: every transformers backend
AUTO = "auto"  # the first row that loads the checkpoint's model_type
NO_QUANTIZATION = "none"
TORCH = "torch: pip install 'diffusion-lsp[torch]'"


@dataclass(frozen=True)
class Backend:
    """One row: a backend and the checkpoints it loads."""

    name: str
    loader: str  # "module:function", imported when used
    model_types: tuple[str, ...]  # config.json model_type values it loads
    kind: str  # its checkpoints in words, for errors
    quantizations: tuple[str, ...] = (NO_QUANTIZATION,)
    needs: str = ""  # what to install when its module does not import ("" : the base install)
    released: str = ""  # released checkpoints of its kind, by name, for `pull` and the docs
    pulled: bool = True  # `pull` takes its checkpoints from the Hub (not: what this project makes)
    exports: tuple[str, ...] = ()  # the model_types `export-onnx` turns into an onnx_lm directory

    @property
    def a_kind(self) -> str:
        """ "a Dream, Qwen2 or Llama", "an embedded-architecture" """
        return ("an " if self.kind[0].lower() in "aeiou" else "a ") + self.kind


TABLE: tuple[Backend, ...] = (
    Backend(
        "onnx",
        "engine.denoisers.onnx:load_dir",
        (EMBEDDED_MODEL_TYPE,),
        "embedded-architecture",
        released="the shipped model",
        pulled=False,
    ),
    Backend(
        "onnx",
        "engine.denoisers.onnx_lm:load_dir",
        (ONNX_LM_MODEL_TYPE,),
        "exported Qwen2, Llama or Dream",
        released="`export-onnx` and `pull --ready` make it, from a checkpoint or a GGUF file",
        pulled=False,
    ),
    Backend(
        "torch",
        "engine.denoisers.torch:load_dir",
        (EMBEDDED_MODEL_TYPE,),
        "embedded-architecture",
        needs=TORCH,
        released="the shipped model",
        pulled=False,
    ),
    Backend(
        "diffusion_gemma",
        "engine.denoisers.diffusion_gemma:load_dir",
        (DG_MODEL_TYPE,),
        "DiffusionGemma",
        quantizations=WEIGHT_QUANTIZATIONS,
        needs="torch and transformers>=5.23: pip install 'diffusion-lsp[torch]'",
        released="DiffusionGemma 26B",
    ),
    Backend(
        "dream",
        "engine.denoisers.dream:load_dir",
        (*DREAM_MODEL_TYPES, *AUTOREGRESSIVE_MODEL_TYPES),
        "Dream, Qwen2 or Llama",
        quantizations=WEIGHT_QUANTIZATIONS,
        needs="torch and transformers: pip install 'diffusion-lsp[torch]'",
        released="Dream-v0, DiffuCoder, Dream-Coder, DreamOn, Qwen2.5-Coder",
        exports=(*DREAM_MODEL_TYPES, *AUTOREGRESSIVE_MODEL_TYPES),
    ),
    Backend(
        "llada",
        "engine.denoisers.llada:load_dir",
        (LLADA_MODEL_TYPE,),
        "LLaDA",
        quantizations=WEIGHT_QUANTIZATIONS,
        needs="torch and transformers: pip install 'diffusion-lsp[torch]'",
        released="LLaDA 8B Base and Instruct",
    ),
    Backend(
        "block_causal",
        "engine.denoisers.block_causal:load_dir",
        BLOCK_CAUSAL_MODEL_TYPES,
        "Fast-dLLM v2 or SDAR",
        quantizations=WEIGHT_QUANTIZATIONS,
        needs="torch and transformers: pip install 'diffusion-lsp[torch]'",
        released="Fast-dLLM v2, SDAR",
    ),
)

BACKENDS: tuple[str, ...] = (AUTO, *dict.fromkeys(row.name for row in TABLE))  # a name may have a row per format
QUANTIZATIONS: tuple[str, ...] = tuple(dict.fromkeys(q for row in TABLE for q in row.quantizations))
# {model_type: the row `auto` picks}
LOADERS: dict[str, Backend] = {t: row for row in reversed(TABLE) for t in row.model_types}
# {model_type: the row that loads it}, for the checkpoints `pull` takes from the Hub
PULLED: dict[str, Backend] = {t: LOADERS[t] for row in TABLE if row.pulled for t in row.model_types}
EXPORTED: tuple[str, ...] = tuple(dict.fromkeys(t for row in TABLE for t in row.exports))  # export-onnx takes


def kinds(rows: tuple[Backend, ...] = TABLE, backends: bool = True) -> str:
    """The checkpoints `rows` load, each kind once, with its backends, for lists in
    words: "embedded-architecture (onnx, torch); exported Qwen2, Llama or Dream (onnx); ..."."""
    names: dict[str, list[str]] = {}
    for r in rows:
        names.setdefault(r.kind, [])
        if r.name not in names[r.kind]:
            names[r.kind].append(r.name)
    return "; ".join(f"{k} ({', '.join(n)})" if backends else k for k, n in names.items())


def quantized_rows() -> tuple[Backend, ...]:
    """The rows whose checkpoints load in fewer bits."""
    return tuple(r for r in TABLE if len(r.quantizations) > 1)


def described(model_type: str) -> str:
    """What a model_type `pull` takes is, for its message: "Dream, Qwen2 or Llama
    (Dream-v0, ...), the dream backend"."""
    r = PULLED[model_type]
    said = f"{r.kind}" + (f" ({r.released})" if r.released else "") + f", the {r.name} backend"
    if model_type in AUTOREGRESSIVE_MODEL_TYPES:
        said += "; an autoregressive model: `diffusion-infill adapt` trains it into a Dream-architecture infiller"
    return said


def row(name: str, model_type: object = None) -> Backend:
    """The row of a backend by name: the one that loads `model_type` where the backend has
    several, else its first."""
    rows = [r for r in TABLE if r.name == name]
    if not rows:
        raise ModelLoadError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return next((r for r in rows if model_type in r.model_types), rows[0])


def choose(model_type: object, backend: str = AUTO, quantization: str = NO_QUANTIZATION, where: str = "") -> Backend:
    """The row that loads a checkpoint of `model_type` with the requested backend and
    quantization, or a ModelLoadError that says what to choose instead."""
    wanted = None if backend == AUTO else row(backend, model_type)
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
    found = LOADERS.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        if wanted is not None:
            raise ModelLoadError(f"{where} is not {wanted.a_kind} checkpoint (model_type {model_type!r})")
        raise ModelLoadError(f"{where}: unknown model_type {model_type!r}")
    if wanted is not None and model_type not in wanted.model_types:
        raise ModelLoadError(
            f"{where} is not {wanted.a_kind} checkpoint but {found.a_kind} one (model_type {model_type!r}): "
            f"use backend {found.name} (or auto), not {backend}"
        )
    chosen = wanted or found
    if quantization not in chosen.quantizations:
        # one kind per backend, apart: a kind is itself a list ("Dream, Qwen2 or Llama")
        takers = "; ".join(f"{r.kind} ({r.name})" for r in TABLE if quantization in r.quantizations)
        raise ModelLoadError(
            f"quantization {quantization!r} is for these checkpoints: {takers}. {where} is {chosen.a_kind} "
            f"checkpoint (backend {chosen.name} takes: {', '.join(chosen.quantizations)})"
        )
    return chosen
