"""Weight quantization for every transformers backend, and the memory a choice needs
before anything loads.

A 7B Dream-family checkpoint is about 15 GB in bfloat16 and DiffusionGemma 26B-A4B about
52 GB: too much for most cards and laptops. This module quantizes a loaded model's weights
itself, one mechanism for every backend (dream, diffusion_gemma), weight-only, on CPU,
CUDA and Apple's GPU alike:

- "int8": each output row scaled to int8 (symmetric, one scale per row);
- "4bit": groups of GROUP values along the input dimension scaled to 4-bit integers,
  two to a byte, one float16 scale per group (0.53 bytes a weight);

every nn.Linear of the transformer blocks (`QuantLinear`) and every fused expert
parameter (`QuantExperts`: DiffusionGemma keeps its 128 experts per layer as 3D
parameters that bitsandbytes and torchao leave in full precision, measured:
docs/measurements.md; indexing one dequantizes only that expert). Embeddings, the output
head, norms and routers stay as they are. The compute is in the model's dtype: a weight is
dequantized when it is used (memory is the point, not speed; there are no int8 or 4-bit
matmul kernels here).

`estimate(meta_model, ...)` counts every parameter of an architecture built on the meta
device (`meta_model`: no weights read) by the kind it is, and gives the bytes each setting
holds, what stays unquantized, and the peak while the largest weight is dequantized;
`check_fits` compares that with the device's free memory before loading and names a
setting that fits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.models.table import WEIGHT_QUANTIZATIONS as QUANTIZATIONS

Quantization = Literal["none", "int8", "4bit"]
GROUP = 64  # 4bit: weights per scale
RUNTIME_MARGIN = 0.10  # of the weights, for the context cache, activations and the allocator
WORKING_BYTES = 4  # a weight being dequantized is first a float32 working copy (`dequantize`)
GIB = 1 << 30


def _bytes_per_weight(q: Quantization, dtype_bytes: int, row: int) -> float:
    if q == "int8":
        return 1.0 + 4.0 / row  # int8, one float32 scale per row
    if q == "4bit":
        group = _group(row)
        return (0.5 + 2.0 / group) if group else 1.0 + 4.0 / row
    return float(dtype_bytes)


def _group(row: int) -> int:
    """The 4-bit group size for rows of `row` values (0: they cannot be grouped; int8)."""
    g = min(GROUP, row)
    return g if row % g == 0 and g % 2 == 0 else 0


# ---------------------------------------------------------------------------- quantizing


def quantize(w: torch.Tensor, q: Quantization) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scale) of `w` (..., row): int8 rows, or 4-bit groups two to a byte."""
    w = w.detach().float()
    row = w.shape[-1]
    if q == "4bit" and _group(row):
        g = _group(row)
        groups = w.reshape(*w.shape[:-1], row // g, g)
        scale = (groups.abs().amax(dim=-1) / 7.0).clamp_min(1e-12)
        ints = (torch.round(groups / scale[..., None]).clamp(-8, 7) + 8).to(torch.uint8).reshape(*w.shape)
        packed = ints[..., 0::2] | (ints[..., 1::2] << 4)
        return packed, scale.to(torch.float16)
    scale = (w.abs().amax(dim=-1) / 127.0).clamp_min(1e-12)
    return torch.round(w / scale[..., None]).clamp(-127, 127).to(torch.int8), scale


def dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float weight of `quantize`'s output, in `dtype`: computed in float32, in place,
    so that dequantizing n weights holds at most one float32 copy (4n bytes) beside the
    result (`estimate` counts it)."""
    if packed.dtype == torch.int8:
        w = packed.float()
        w.mul_(scale[..., None])
        return w.to(dtype)
    n = packed.shape[-1] * 2
    ints = torch.empty((*packed.shape[:-1], n), dtype=torch.uint8, device=packed.device)
    ints[..., 0::2] = packed & 15
    ints[..., 1::2] = packed >> 4
    w = ints.float()
    del ints
    groups = w.view(*scale.shape, n // scale.shape[-1])
    groups.sub_(8.0).mul_(scale.float()[..., None])
    return w.to(dtype)


class QuantLinear(nn.Module):
    """nn.Linear with a quantized weight, dequantized at each call."""

    def __init__(self, linear: nn.Linear, q: Quantization, done: dict[int, Any] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed, scale = _once(linear.weight, q, done)
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.bias = linear.bias

    packed: torch.Tensor
    scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, dequantize(self.packed, self.scale, x.dtype), self.bias)


class QuantExperts:
    """A fused expert parameter (E, O, I), quantized: `[e]` is expert e's weight (O, I) in
    the model's dtype (the eager experts loop indexes one expert at a time)."""

    def __init__(self, module: nn.Module, name: str, q: Quantization, done: dict[int, Any] | None = None) -> None:
        weight = getattr(module, name)
        self.module, self.name, self.dtype, self.shape = module, name, weight.dtype, tuple(weight.shape)
        packed, scale = _once(weight, q, done)
        del module._parameters[name]
        module.register_buffer(f"{name}_packed", packed)
        module.register_buffer(f"{name}_scale", scale)

    def __getitem__(self, index: Any) -> torch.Tensor:
        packed = getattr(self.module, f"{self.name}_packed")[index]
        scale = getattr(self.module, f"{self.name}_scale")[index]
        return dequantize(packed, scale, self.dtype)

    def __len__(self) -> int:
        return self.shape[0]


def _once(weight: torch.Tensor, q: Quantization, done: dict[int, Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize(weight)`, once per weight: DiffusionGemma's decoder shares its encoder's
    weights, and the quantized form is shared the same way. Keyed by the parameter's id
    without keeping it alive, so each full-precision weight is freed as soon as the last
    module using it is replaced (the host never holds the model twice); that is safe
    because only parameters the model held from the start are looked up, and no two of
    those share an id."""
    if done is None:
        return quantize(weight, q)
    key = id(weight)
    if key not in done:
        done[key] = quantize(weight, q)
    result: tuple[torch.Tensor, torch.Tensor] = done[key]
    return result


def _is_experts(module: nn.Module) -> bool:
    """A fused experts module: 3D gate_up_proj and down_proj parameters."""
    params = [getattr(module, n, None) for n in ("gate_up_proj", "down_proj")]
    return all(isinstance(p, nn.Parameter) and p.dim() == 3 for p in params)


def _quantizable(name: str, module: nn.Module) -> bool:
    """Linear layers of the transformer blocks (not embeddings, the tied output head, or
    the small self-conditioning and router projections, which stay exact)."""
    return isinstance(module, nn.Linear) and ".layers." in f".{name}." and "router" not in name


def quantize_model(model: nn.Module, q: Quantization) -> nn.Module:
    """Quantize `model` in place: its block Linear layers and fused experts. Modules are
    looked up by name as the loop goes (no list of them is held), so each replaced
    Linear, and its full-precision weight, is freed at once."""
    if q == "none":
        return model
    done: dict[int, Any] = {}
    for name in [n for n, _ in model.named_modules()]:
        module = model.get_submodule(name)
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if _quantizable(full, child):
                assert isinstance(child, nn.Linear)
                setattr(module, child_name, QuantLinear(child, q, done))
            del child
        if _is_experts(module):
            experts = {n: QuantExperts(module, n, q, done) for n in ("gate_up_proj", "down_proj")}
            for n, view in experts.items():
                object.__setattr__(module, n, view)
    done.clear()
    set_impl = getattr(model, "set_experts_implementation", None)
    if callable(set_impl):
        set_impl("eager")  # the loop that indexes one expert at a time
    return model


def cast_kept(model: nn.Module, dtype: torch.dtype) -> None:
    """The parameters `quantize_model` kept (embeddings, head, norms) in `dtype`; the
    quantized buffers and their scales are left as they are."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def held_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer the model holds (each tensor once)."""
    seen: dict[int, int] = {}
    for t in (*model.parameters(), *model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


# ---------------------------------------------------------------------------- estimating


@dataclass
class MemoryEstimate:
    quantization: Quantization
    weights: int  # bytes the loaded weights hold
    runtime: int  # the peak to run: weights, a margin, the largest weight being dequantized
    params: int
    quantized_params: int
    kept: dict[str, int] = field(default_factory=dict)  # parameters left unquantized, by kind

    def describe(self) -> str:
        kept = ", ".join(f"{k} {v / 1e9:.2f}B" for k, v in self.kept.items() if v)
        return (
            f"{self.quantization}: {size(self.weights)} of weights ({size(self.runtime)} to run); "
            f"{self.quantized_params / 1e9:.2f}B of {self.params / 1e9:.2f}B parameters quantized"
            + (f", kept as they are: {kept}" if kept else "")
        )


def size(nbytes: int) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.1f} MiB"


def meta_model(build: Callable[[Any], nn.Module], config: Any) -> nn.Module:
    """`build(config)` (a transformers model class) on the meta device: the architecture's
    parameters with no memory behind them, for `estimate`."""
    with torch.device("meta"):
        return build(config)


def _kind(full: str) -> str:
    if "embed" in full:
        return "embeddings"
    return "output head" if full.startswith("lm_head.") else "other"


def estimate(model: nn.Module, quantization: Quantization, dtype: torch.dtype) -> MemoryEstimate:
    """The memory `quantization` holds for `model`'s architecture (built by `meta_model`:
    no weights read), its kept parameters in `dtype`. The peak to run adds RUNTIME_MARGIN
    of the weights and, quantized, the largest weight while `dequantize` works on it (its
    float32 copy and the result in `dtype`; experts one at a time)."""
    dtype_bytes = torch.tensor([], dtype=dtype).element_size()
    total = quantized = largest = 0
    weights = 0.0
    kept: dict[str, int] = {"embeddings": 0, "output head": 0, "other": 0}
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # tied weights count once
                continue
            seen.add(id(p))
            n = p.numel()
            total += n
            quantizable = quantization != "none" and (
                (_is_experts(module) and pname in ("gate_up_proj", "down_proj")) or _quantizable(name, module)
            )
            if quantizable:
                quantized += n
                weights += n * _bytes_per_weight(quantization, dtype_bytes, p.shape[-1])
                per = p[0] if p.dim() == 3 else p  # experts are dequantized one at a time
                largest = max(largest, per.numel() * (WORKING_BYTES + dtype_bytes))
            else:
                weights += n * dtype_bytes
                if quantization != "none":
                    kept[_kind(f"{name}.{pname}")] += n
    w = int(weights)
    return MemoryEstimate(quantization, w, int(w * (1 + RUNTIME_MARGIN)) + largest, total, quantized, kept)


def free_memory(device: str) -> int | None:
    """Bytes free on `device` (CUDA: the driver's count; Apple's GPU: what Metal
    recommends less what torch holds there; CPU: MemAvailable), None when unknown."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        index = int(device.partition(":")[2] or 0)
        free, _ = torch.cuda.mem_get_info(index)
        return int(free)
    if device == "mps":
        mps: Any = getattr(torch, "mps", None)
        if mps is None or not hasattr(mps, "recommended_max_memory") or not torch.backends.mps.is_available():
            return None
        return int(mps.recommended_max_memory()) - int(mps.driver_allocated_memory())
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(
    model: nn.Module, quantization: Quantization, dtype: torch.dtype, device: str, path: os.PathLike[str] | str
) -> MemoryEstimate:
    """The estimate for `quantization` on `model` (a `meta_model`), or a ModelLoadError
    that says what it needs, what is free, and which setting fits (never an
    out-of-memory error half way through)."""
    chosen = estimate(model, quantization, dtype)
    free = free_memory(device)
    if free is None or chosen.runtime <= free:
        return chosen
    fits = [
        q for q in QUANTIZATIONS if QUANTIZATIONS.index(q) > QUANTIZATIONS.index(quantization)
        and estimate(model, q, dtype).runtime <= free  # type: ignore[arg-type]
    ]  # fmt: skip
    advice = f"set quantization to {fits[0]!r}" if fits else "no setting fits: use a larger device or a remote engine"
    raise ModelLoadError(
        f"{path} needs about {size(chosen.runtime)} on {device} with quantization {quantization!r} "
        f"({chosen.describe()}), but {size(free)} is free: {advice}"
    )


def check_before_loading(
    model: nn.Module,
    quantization: Quantization,
    compute: torch.dtype,
    stored: torch.dtype,
    device: str,
    path: os.PathLike[str] | str,
) -> MemoryEstimate:
    """Both checks a backend makes before it loads: the device holds the setting in the
    `compute` dtype; and, quantized, the host holds the checkpoint once in its `stored`
    dtype while it is quantized (then the weights move to the device)."""
    chosen = check_fits(model, quantization, compute, device, path)
    if quantization != "none":
        check_fits(model, "none", stored, "cpu", path)
    return chosen
