"""CUDA-graph capture of one whole DiffusionGemma denoising step, for one (batch, canvas) shape.

An eager step of the 26B-A4B model costs the same at a 32-token canvas as at 256 tokens:
it is bound by kernel-launch overhead (hundreds of small kernels per layer), not by work.
A CUDA graph replays all of them with one launch. That needs fixed shapes and no host
reads inside the step, which `dg_static.static_step` provides; this module owns the
static input/output tensors, the warm-up and the capture.

Off CUDA (or with `capture=False`) the same object runs the step eagerly from the same
static inputs, so the copy-in / copy-out logic is exercised by the CPU tests too.
"""

from __future__ import annotations

import time

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from engine.denoisers.dg_static import StaticContext, static_step

WARMUP_ITERS = 3  # eager runs on a side stream before capture (lazy inits, cuBLAS workspaces)


def graph_unavailable_reason(device: torch.device) -> str | None:
    """Why a CUDA graph cannot be captured on `device`, or None when it can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; the model is on {device.type}"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


class StepGraph:
    """A denoising step with static inputs (canvas, self-conditioning logits and mask) and output.

    `capture_s` is the warm-up + capture time (0 when run eagerly). `captured` says
    whether `run` replays a CUDA graph.
    """

    def __init__(
        self,
        model: DiffusionGemmaForBlockDiffusion,
        ctx: StaticContext,
        batch: int,
        canvas: int,
        cache_kw: str,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.ctx = ctx
        self.shape = (int(batch), int(canvas))
        self.cache_kw = cache_kw
        device = model.device
        vocab = int(model.config.get_text_config().vocab_size)
        embed_dtype = model.model.decoder.embed_tokens.weight.dtype
        self.canvas = torch.zeros(self.shape, dtype=torch.long, device=device)  # (B, C)
        self.self_cond = torch.zeros((*self.shape, vocab), dtype=embed_dtype, device=device)  # (B, C, V)
        self.self_cond_mask = torch.zeros((self.shape[0],), dtype=torch.bool, device=device)  # (B,)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.capture_s = 0.0
        if capture:
            reason = graph_unavailable_reason(device)
            if reason is not None:
                raise RuntimeError(reason)
            self._capture()

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _body(self) -> torch.Tensor:
        return static_step(self.model, self.ctx, self.canvas, self.self_cond, self.self_cond_mask, self.cache_kw)

    def _capture(self) -> None:
        start = time.perf_counter()
        side = torch.cuda.Stream(device=self.canvas.device)
        side.wait_stream(torch.cuda.current_stream(self.canvas.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                self._body()
        torch.cuda.current_stream(self.canvas.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            self.out = self._body()
        torch.cuda.synchronize(self.canvas.device)
        self.graph = graph
        self.capture_s = time.perf_counter() - start

    def run(self, canvas: torch.Tensor, self_cond: torch.Tensor | None) -> torch.Tensor:
        """Copy the inputs in, run the step, return a fresh (B, C, V) float32 logits tensor.

        The caller must have loaded the context into `ctx`. The output is cloned: the
        next replay overwrites the graph's output buffer, and the sampler keeps logits
        across steps (self-conditioning).
        """
        if tuple(canvas.shape) != self.shape:
            raise ValueError(f"this step was built for canvas shape {self.shape}; got {tuple(canvas.shape)}")
        self.canvas.copy_(canvas)
        if self_cond is None:
            self.self_cond_mask.fill_(False)
        else:
            self.self_cond.copy_(self_cond)
            self.self_cond_mask.fill_(True)
        if self.graph is None:
            with torch.no_grad():
                return self._body()
        self.graph.replay()
        assert self.out is not None
        return self.out.clone()
