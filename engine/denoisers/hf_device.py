"""Where the transformers backends run, and in which dtype: the one place that resolves a
`device` setting (cpu, cuda, cuda:N, mps, auto) for them, so every backend accepts the same
choices and refuses an absent device with the same clear message.

- cpu: float32 (the backends' CPU path; a checkpoint's bfloat16 is widened once at load);
- cuda: the checkpoint's own dtype (bfloat16 for every released diffusion coder);
- mps (Apple's GPU): bfloat16 where this Mac and torch support it (macOS 14 and later),
  else float16. Not measured on a Mac here (docs/gpu.md).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from engine.errors import ModelLoadError

DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?|mps"  # the settings and the command line say the same
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def mps_reason() -> str | None:
    """Why Apple's GPU cannot be used here (None: it can)."""
    mps: Any = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return "this torch was built without MPS (Apple's GPU) support"
    if not mps.is_available():
        return "this machine has no MPS device (it needs a Mac with Apple silicon and macOS 12.3 or later)"
    return None


def resolve_device(device: str, where: object) -> str:
    """The device to load on: "auto" is cuda, else mps, else cpu; a named one must be
    there, or a ModelLoadError says why and what to set instead."""
    device = str(device)
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise ModelLoadError(f"unknown device {device!r} for {where}; choose {DEVICE_CHOICES}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_reason() is None else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} requested for {where}, but CUDA is not available: set device to cpu"
            )
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} requested for {where}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    if device == "mps":
        reason = mps_reason()
        if reason is not None:
            raise ModelLoadError(f"device 'mps' requested for {where}, but {reason}: set device to cpu")
    return device


def mps_dtype() -> torch.dtype:
    """bfloat16 where the Apple GPU computes in it, else float16."""
    try:
        torch.ones(1, dtype=torch.bfloat16, device="mps")
    except (RuntimeError, TypeError):
        return torch.float16
    return torch.bfloat16


def stored_dtype(cfg: dict[str, Any]) -> torch.dtype:
    """The dtype a checkpoint's config.json says its weights are in (bfloat16 when unsaid)."""
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) and found.is_floating_point else torch.bfloat16


def compute_dtype(device: str, stored: torch.dtype) -> torch.dtype:
    """The dtype a model computes in on `device` (see the module)."""
    if device == "mps":
        return mps_dtype() if stored in (torch.bfloat16, torch.float32) else torch.float16
    if device.startswith("cuda"):
        return stored
    return torch.float32
