"""The accelerator benchmark: DiffusionGemma denoising variants and the shipped model on one GPU.

One run, one JSON file, one printed table (see docs/gpu.md for the command line):

    python bench/device.py [--wheels DIR] [--out FILE] [--budget-s 420] [--onnx] [--tiny]

1. setup     with --wheels, installs transformers 5.23 from carried wheels when the
             machine's transformers lacks DiffusionGemma (pip --no-index --no-deps)
2. build     the released 26B-A4B architecture with random weights, bf16 (speed does not
             depend on the weights' values); --tiny: a small config in float32 on the CPU
3. check     every variant's logits (first step, and a self-conditioned one) against
             transformers' own forward on the same weights: relative error (norm of the
             difference over norm of the reference) and argmax agreement
4. step      one denoising step, C=256 canvas against a P=4,096 cached prompt, per variant:
             eager (transformers' forward), static cache, CUDA graph, experts as a Python
             loop ("eager") or batched gather, FP8 -- each guarded: a failure or a skip is
             recorded with its reason and the next variant runs
5. canvas    the full 16-step canvas after a 1,024-token prompt: ours (encode + engine
             sampler, eager and graph) and transformers' generate(), eager and compiled
6. onnx      (--onnx) the shipped embedded model through onnxruntime: warm fill p50 with the
             CUDA execution provider when present, and its fills compared with the CPU path's

Times are medians of many runs after warm-up, taken with CUDA events on a GPU (wall clock
on the CPU). A time budget (default 420 s, the device allows 8 minutes) skips whatever
would not fit, and the JSON is rewritten after every part, so a run cut short still
leaves its results. Never asserted on in tests (tests/engine/test_device_bench.py only
checks that --tiny runs and writes well-formed JSON).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine.training.budget import Budget  # noqa: E402 - torch-free

TRANSFORMERS_PIN = "transformers==5.23.*"
BF16_REL_TOL = 5e-2  # relative error of bf16 logits after 30 layers, summation order only
FP32_REL_TOL = 1e-4
REAL = {"prompt": 4096, "canvas": 256, "gen_prompt": 1024, "gen_steps": 16, "warmup": 3, "iters": 20, "gen_iters": 3}
TINY = {"prompt": 64, "canvas": 16, "gen_prompt": 32, "gen_steps": 16, "warmup": 1, "iters": 5, "gen_iters": 2}
# Rough costs in seconds on the H200, to skip a part that would not fit the budget.
EST_S = {"check": 30, "step": 15, "graph": 30, "experts_loop": 40, "canvas": 20, "generate_eager": 15}
EST_COMPILED_S = 240  # transformers' compiled generate: its first call compiled for 186 s
EST_ONNX_S = 40


# ----------------------------------------------------------------------------- setup


def ensure_transformers(wheels: Path | None) -> dict[str, Any]:
    """Install transformers 5.23 from `wheels` when DiffusionGemma is missing (never online)."""
    info: dict[str, Any] = {"wheels": str(wheels) if wheels else None}
    if importlib.util.find_spec("transformers.models.diffusion_gemma") is not None:
        info["installed"] = "already present"
        return info
    if wheels is None:
        raise SystemExit("transformers lacks DiffusionGemma: pass --wheels DIR with the transformers 5.23 wheel")
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", str(wheels)]
    cmd += [TRANSFORMERS_PIN, *extra_wheels(wheels)]
    start = time.perf_counter()
    env = {**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1"}  # a throwaway machine's system Python
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    info.update(cmd=" ".join(cmd), rc=proc.returncode, seconds=round(time.perf_counter() - start, 1))
    if proc.returncode != 0:
        raise SystemExit(f"pip install failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    importlib.invalidate_caches()
    return info


def extra_wheels(wheels: Path) -> list[str]:
    """Other carried wheels (e.g. a newer huggingface_hub or tokenizers that 5.23 needs)."""
    return [str(p) for p in sorted(wheels.glob("*.whl")) if not p.name.startswith("transformers-")]


class Report:
    """The JSON document, rewritten to disk after every part."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"schema": 1, "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)


def guarded(report: Report, section: str, name: str, budget: Budget, estimate: float, fn: Callable[[], Any]) -> Any:
    """Run one part; record its result, its error, or why it was skipped. Never raises."""
    entries = report.data.setdefault(section, {})
    if not budget.allows(estimate):
        entries[name] = {"status": "skipped", "reason": f"budget: {budget.left():.0f} s left, needs ~{estimate} s"}
        report.save()
        return None
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # one variant failing must not end the run
        entries[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        entries[name]["traceback"] = traceback.format_exc()[-3000:]
        free_gpu_memory()
        result = None
    else:
        if isinstance(result, dict) and "status" in result:
            entries[name] = result
        else:
            entries[name] = {"status": "ok", **(result if isinstance(result, dict) else {"value": result})}
    entries[name]["seconds"] = round(time.perf_counter() - start, 2)
    report.save()
    return result


def skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def free_gpu_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- model


def build_config(tiny: bool) -> Any:
    """The released DiffusionGemma 26B-A4B text architecture (issue 6), or a tiny one."""
    from transformers import DiffusionGemmaConfig

    pattern = ["sliding_attention"] * 5 + ["full_attention"]  # 5:1 sliding / full
    if tiny:
        text = dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=6,
            layer_types=pattern,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_global_key_value_heads=1,
            head_dim=16,
            global_head_dim=32,
            sliding_window=16,
            num_experts=8,
            top_k_experts=2,
            moe_intermediate_size=32,
            max_position_embeddings=1024,
        )
        vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1)
        vision.update(
            num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64, patch_size=4
        )
        return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=TINY["canvas"])
    text = dict(
        vocab_size=262144,
        hidden_size=2816,
        intermediate_size=2112,
        num_hidden_layers=30,
        layer_types=pattern * 5,
        num_attention_heads=16,
        num_key_value_heads=8,
        num_global_key_value_heads=2,
        head_dim=256,
        global_head_dim=512,
        sliding_window=1024,
        num_experts=128,
        top_k_experts=8,
        moe_intermediate_size=704,
    )
    return DiffusionGemmaConfig(text_config=text, canvas_length=REAL["canvas"])


def build_model(tiny: bool, device: str) -> Any:
    """Random weights, built directly on the device (bf16 on CUDA, float32 on the CPU)."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DiffusionGemmaForBlockDiffusion(build_config(tiny))
    finally:
        torch.set_default_dtype(before)
    return model.eval()  # buffers made with an explicit float32 dtype stay so, as in from_pretrained


# ----------------------------------------------------------------------------- timing


def time_ms(fn: Callable[[], Any], warmup: int, iters: int, cuda: bool) -> dict[str, float]:
    """Median / p10 / p90 of `iters` runs after `warmup`, in ms (CUDA events on a GPU)."""
    import torch

    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return {"median_ms": round(statistics.median(samples), 3), "p10_ms": round(pick(0.1), 3),
            "p90_ms": round(pick(0.9), 3), "n": len(samples)}  # fmt: skip


def rel_error(got: Any, want: Any) -> dict[str, float]:
    g, w = got.float(), want.float()
    return {
        "rel_error": float((g - w).norm() / w.norm().clamp_min(1e-30)),
        "argmax_agree": float((g.argmax(-1) == w.argmax(-1)).float().mean()),
    }


# ----------------------------------------------------------------------------- parts


class Bench:
    """The DiffusionGemma parts; holds the model and the shared inputs."""

    def __init__(self, model: Any, sizes: dict[str, int], cuda: bool) -> None:
        import torch

        self.model = model
        self.sizes = sizes
        self.cuda = cuda
        self.device = model.device
        vocab = int(model.config.get_text_config().vocab_size)
        g = torch.Generator().manual_seed(1)
        self.prompt = torch.randint(3, vocab, (sizes["prompt"],), generator=g).tolist()
        self.canvas = torch.randint(0, vocab, (1, sizes["canvas"]), generator=g).to(self.device)
        self.tol = BF16_REL_TOL if model.dtype == torch.bfloat16 else FP32_REL_TOL

    def denoiser(self, **options: Any) -> Any:
        from engine.denoisers.diffusion_gemma import DiffusionGemmaDenoiser

        return DiffusionGemmaDenoiser(self.model, **options)

    def reference(self) -> tuple[Any, Any, Any]:
        """transformers' forward (encoder + decoder in one call): first and self-conditioned step."""
        import torch

        ids = torch.tensor([self.prompt], device=self.device)
        with torch.no_grad():
            first = self.model(input_ids=ids, decoder_input_ids=self.canvas).logits
            sc = (first / 0.7).to(self.model.dtype)
            second = self.model(input_ids=ids, decoder_input_ids=self.canvas, self_conditioning_logits=sc).logits
        return first, sc, second

    def check(self, den: Any, ref: tuple[Any, Any, Any]) -> dict[str, Any]:
        first, sc, second = ref
        state = den.prefill(self.prompt)
        a = rel_error(den.denoise(state, self.canvas), first)
        b = rel_error(den.denoise(state, self.canvas, sc), second)
        worst = max(a["rel_error"], b["rel_error"])
        return {"first": a, "self_cond": b, "tolerance": self.tol, "passed": worst <= self.tol}

    def step(self, den: Any) -> dict[str, Any]:
        import torch

        state = den.prefill(self.prompt)
        sz = self.sizes

        def run() -> None:
            with torch.no_grad():
                den.denoise(state, self.canvas)

        out = time_ms(run, sz["warmup"], sz["iters"], self.cuda)
        return {**out, "canvas": sz["canvas"], "prompt": sz["prompt"], "batch": 1}

    def canvas_run(self, den: Any) -> dict[str, Any]:
        """Encode a gen_prompt-token prompt, then a full gen_steps-step canvas with our sampler."""
        from engine.decoding import SamplerConfig
        from engine.local import sampler as S

        sz = self.sizes
        prompt = self.prompt[: sz["gen_prompt"]]
        cfg = SamplerConfig(
            strategy="entropy_bound", max_steps=sz["gen_steps"], entropy_bound=0.1, t_min=0.4, t_max=0.8,
            greedy=False, stability_threshold=1, stop_entropy=1e-9,
        )  # fmt: skip
        steps: list[int] = []

        def run() -> None:
            state = den.prefill(prompt)
            rng = den.random_source(0)
            res = S.run(den, state, S.initial_canvas(den, 1, sz["canvas"], rng), cfg, rng)
            steps.append(res.steps)

        out = time_ms(run, 1, sz["gen_iters"], self.cuda)
        return {**out, "steps": steps[-1], "prompt": len(prompt), "canvas": sz["canvas"]}

    def generate(self, compiled: bool) -> dict[str, Any]:
        import torch
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

        sz = self.sizes
        ids = torch.tensor([self.prompt[: sz["gen_prompt"]]], device=self.device)
        kw: dict[str, Any] = dict(
            max_new_tokens=sz["canvas"], max_denoising_steps=sz["gen_steps"], t_min=0.4, t_max=0.8,
            sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1), stability_threshold=1,
            confidence_threshold=1e-9,
        )  # fmt: skip
        if compiled:
            kw["cache_implementation"] = "static"  # transformers compiles the forward with a static cache
        first_s = time.perf_counter()
        with torch.no_grad():
            self.model.generate(ids, **kw)
        if self.cuda:
            torch.cuda.synchronize()
        first_s = time.perf_counter() - first_s

        def run() -> None:
            with torch.no_grad():
                self.model.generate(ids, **kw)

        out = time_ms(run, 0, sz["gen_iters"], self.cuda)
        return {**out, "first_call_s": round(first_s, 2), "prompt": sz["gen_prompt"], "steps": sz["gen_steps"]}


def fp8_status() -> dict[str, Any]:
    """Whether this torch and GPU could run FP8 matmuls (the FP8 variant itself is not built yet)."""
    import torch

    ok = hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return {
        "torch_has_fp8": ok,
        "scaled_grouped_mm": hasattr(torch, "_scaled_grouped_mm"),
        "capability": cap,
        "hardware_fp8": bool(cap and cap >= (8, 9)),
    }


def run_dg(report: Report, budget: Budget, tiny: bool, device: str) -> None:
    from engine.denoisers.dg_graph import graph_unavailable_reason

    sizes = TINY if tiny else REAL
    cuda = device.startswith("cuda")
    start = time.perf_counter()
    model = build_model(tiny, device)
    report.data["model"] = {
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype),
        "device": str(model.device),
        "build_s": round(time.perf_counter() - start, 1),
        "experts_implementation": model.config.get_text_config()._experts_implementation,
        "attn_implementation": model.config.get_text_config()._attn_implementation,
        "sizes": sizes,
    }
    report.save()
    bench = Bench(model, sizes, cuda)
    ref = bench.reference()
    graph_reason = graph_unavailable_reason(model.device)
    shape = [(1, sizes["canvas"])]
    room = sizes["prompt"] + sizes["canvas"]  # buffers longer than the prompt: the mask is exercised
    dens: dict[str, Callable[[], Any]] = {
        "eager": lambda: bench.denoiser(),
        "static": lambda: bench.denoiser(static_cache=True, max_prompt=room),
        "graph": lambda: bench.denoiser(cuda_graph=True, graph_shapes=shape, max_prompt=room),
    }
    built: dict[str, Any] = {}

    def make(name: str) -> Any:
        if name not in built:
            built[name] = dens[name]()
        return built[name]

    for name in ("eager", "static", "graph"):
        if name == "graph" and graph_reason is not None:
            for section in ("check", "step"):
                report.data.setdefault(section, {})[name] = skipped(graph_reason)
            continue
        est = EST_S["graph"] if name == "graph" else EST_S["check"]
        guarded(report, "check", name, budget, est, partial(lambda n: bench.check(make(n), ref), name))
        if name == "graph" and name in built:
            report.data["check"][name]["warmup_s"] = round(built[name].warmup_s, 2)
            report.data["check"][name]["graph_status"] = built[name].graph_status
        guarded(report, "step", name, budget, EST_S["step"], partial(lambda n: bench.step(make(n)), name))

    # experts: transformers' default grouped_mm is what the variants above ran
    for impl in ("eager", "batched_mm"):
        name = f"experts_{impl}"

        def experts(impl: str = impl) -> dict[str, Any]:
            text = model.config.get_text_config()
            tokens = sizes["canvas"] * int(text.top_k_experts)
            gathered = tokens * 3 * int(text.moe_intermediate_size) * int(text.hidden_size) * model.dtype.itemsize
            if impl == "batched_mm" and gathered > 4e9:
                return skipped(f"batched_mm gathers {gathered / 1e9:.0f} GB of expert weights per layer")
            try:
                den = bench.denoiser(experts=impl)
                return {**bench.check(den, ref), **bench.step(den)}
            finally:
                model.set_experts_implementation("grouped_mm")

        guarded(report, "step", name, budget, EST_S["experts_loop"], experts)

    report.data.setdefault("step", {})["fp8"] = {
        **skipped("not built: expert weights are 3D parameters and need an FP8 grouped GEMM"),
        **fp8_status(),
    }
    report.save()

    best = "graph" if "graph" in built else "static" if "static" in built else "eager"
    for name in dict.fromkeys(("eager", best)):
        if name in built:
            guarded(report, "canvas", f"ours_{name}", budget, EST_S["canvas"], partial(bench.canvas_run, built[name]))
    guarded(report, "canvas", "generate_eager", budget, EST_S["generate_eager"], lambda: bench.generate(False))
    if cuda:
        compiled_bench[0] = bench  # its compiled generate runs last: the longest part
    else:
        report.data.setdefault("canvas", {})["generate_compiled"] = skipped("compiled generate is timed on CUDA only")
        report.save()


compiled_bench: list[Any] = [None]  # the Bench kept for the compiled generate, which runs last


def run_onnx(report: Report, budget: Budget, cuda: bool, repeats: int) -> dict[str, Any]:
    """The shipped model: warm fill p50 on the CPU and (when present) onnxruntime's CUDA provider."""
    import onnxruntime as ort

    from engine.denoisers.loading import load_model
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine

    source = (REPO / "fixtures" / "code" / "inventory.py").read_text()
    lines = source.splitlines(keepends=True)
    cuts = [sum(len(x) for x in lines[:i]) + 4 for i in range(8, len(lines), max(1, len(lines) // repeats))]
    cuts = [c for c in cuts if c < len(source) - 1][:repeats]
    out: dict[str, Any] = {"providers": ort.get_available_providers(), "cases": len(cuts)}

    def measure(device: str) -> tuple[dict[str, Any], list[str]]:
        engine = local_engine(load_model(device=device), FillOptions(seed=0))
        texts: list[str] = []
        warm: list[float] = []
        for cut in cuts:
            engine.fill(InfillRequest(prefix=source[:cut], suffix=source[cut:], check_syntax=False))
            t0 = time.perf_counter()
            r = engine.fill(InfillRequest(prefix=source[: cut + 1], suffix=source[cut:], check_syntax=False))
            warm.append((time.perf_counter() - t0) * 1000)
            texts.append(r.text)
        return {"warm_p50_ms": round(statistics.median(warm), 2), "n": len(warm)}, texts

    out["cpu"], cpu_texts = measure("cpu")
    if cuda and "CUDAExecutionProvider" in out["providers"]:
        out["cuda"], gpu_texts = measure("cuda")
        out["fills_equal_cpu"] = gpu_texts == cpu_texts
        out["fills_differing"] = sum(a != b for a, b in zip(gpu_texts, cpu_texts, strict=True))
    else:
        out["cuda"] = skipped("onnxruntime has no CUDAExecutionProvider here (the CPU build; see docs/gpu.md)")
    return out


def print_table(data: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str]] = []
    for section in ("check", "step", "canvas"):
        for name, entry in data.get(section, {}).items():
            if section == "check":
                value = f"rel {entry['first']['rel_error']:.2e}" if entry.get("status") == "ok" else ""
                extra = "passed" if entry.get("passed") else entry.get("reason", entry.get("error", "FAILED"))
            else:
                value = f"{entry['median_ms']:.2f} ms" if "median_ms" in entry else ""
                extra = entry.get("status", "")
                if entry.get("status") != "ok":
                    extra = f"{extra}: {entry.get('reason', entry.get('error', ''))}"
            rows.append((section, name, value, str(extra)[:70]))
    onnx = data.get("onnx", {})
    for dev in ("cpu", "cuda"):
        if isinstance(onnx.get(dev), dict) and "warm_p50_ms" in onnx[dev]:
            rows.append(("onnx", f"warm fill {dev}", f"{onnx[dev]['warm_p50_ms']:.2f} ms", ""))
    width = [max(len(r[i]) for r in rows) if rows else 0 for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheels", type=Path, help="folder of carried wheels (transformers 5.23)")
    p.add_argument("--out", type=Path, help="JSON file (default: $OUT/device_bench.json, else ./device_bench.json)")
    p.add_argument("--budget-s", type=float, default=420.0, help="seconds; parts that would not fit are skipped")
    p.add_argument("--tiny", action="store_true", help="a tiny config on the CPU (tests, trying it out)")
    p.add_argument("--onnx", action="store_true", help="also time the shipped model through onnxruntime")
    p.add_argument("--no-dg", action="store_true", help="skip the DiffusionGemma parts")
    p.add_argument("--onnx-repeats", type=int, default=20)
    args = p.parse_args(argv)
    budget = Budget(args.budget_s)
    out = args.out or Path(os.environ.get("OUT", ".")) / "device_bench.json"
    report = Report(out)
    report.data["args"] = {k: str(v) for k, v in vars(args).items()}
    report.data["setup"] = ensure_transformers(args.wheels)
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"
    report.data["machine"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    if args.tiny:
        torch.set_num_threads(1)  # tiny matmuls gain nothing from threads on a shared machine
    report.save()
    if not args.no_dg:
        guarded(report, "parts", "diffusion_gemma", budget, 60, lambda: run_dg(report, budget, args.tiny, device))
    if args.onnx:
        report.data["onnx"] = guarded(
            report, "parts", "onnx", budget, EST_ONNX_S, lambda: run_onnx(report, budget, cuda, args.onnx_repeats)
        )
    bench = compiled_bench[0]
    if bench is not None:
        guarded(report, "canvas", "generate_compiled", budget, EST_COMPILED_S, lambda: bench.generate(True))
    report.data["elapsed_s"] = round(time.perf_counter() - budget.start, 1)
    report.data["budget_s"] = args.budget_s
    report.save()
    print_table(report.data)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
