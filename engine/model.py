"""The embedded architecture (torch): training and ONNX export only, never the default runtime.

One transformer, two uses that share every weight (as DiffusionGemma's encoder and
decoder do):

- `encode`: the context, causally, appending its keys and values to a cache. Typing at the
  cursor only appends context tokens (suffix-prefix-middle order), so a keystroke encodes
  a few new tokens against the cached ones.
- `denoise`: the canvas only, bidirectionally over itself and attending to the whole
  cached context. Each denoising step costs C tokens, never P + C.

`forward_dual` runs both at once over [context; canvas; middle] with the equivalent
attention mask, which is how the model is trained: a next-token loss on the context
stream and the middle after it (so the same weights also decode one token at a time,
through `encode`), a diffusion loss on the canvas.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 384  # SwiGLU hidden width
    max_positions: int = 4096  # context + canvas
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding. x: (B, H, T, D); positions: (T,) float."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))  # (D/2,)
    freqs = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D/2, 2)
    return out.flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def qkv_heads(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        h, d = self.cfg.n_heads, self.cfg.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        return rope(q, positions, self.cfg.rope_theta), rope(k, positions, self.cfg.rope_theta), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attn.shape
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, self.cfg.d_model))  # (B, T, C)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Plain softmax attention (exports to ONNX as MatMul/Softmax). mask: True = may attend."""
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, Tq, D)


class DiffusionCoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        nn.init.normal_(self.embed.weight, std=0.02)
        for layer in self.layers:
            assert isinstance(layer, Block)
            for lin in (layer.qkv, layer.gate_up):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (layer.out, layer.down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bcd,vd->bcv", self.norm(x), self.embed.weight)  # tied output head

    def encode(
        self,
        input_ids: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        logits_from: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """input_ids (1, T); past (L, 1, H, P, D) -> present (L, 1, H, P+T, D).

        With ``logits_from`` (an int64 scalar tensor s, 0 <= s < T) also the next-token
        logits of new tokens s..T-1, (1, T - s, V): the autoregressive mode of the same
        weights (T - 1 for the next token only; 0 to score a whole continuation)."""
        p, t = past_keys.shape[3], input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device, dtype=torch.float32) + p
        # new token i sees every cached token and new tokens j <= i
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        mask = torch.cat((torch.ones(t, p, dtype=torch.bool, device=input_ids.device), causal), dim=1)  # (T, P+T)
        x = self.embed(input_ids)  # (1, T, C)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, positions)
            k = torch.cat((past_keys[i], k), dim=2)  # (1, H, P+T, D)
            v = torch.cat((past_values[i], v), dim=2)
            keys.append(k)
            values.append(v)
            x = layer.finish(x, attend(q, k, v, mask))
        if logits_from is None:
            return torch.stack(keys), torch.stack(values)
        rows = torch.arange(t, device=input_ids.device)
        picked = torch.index_select(x, 1, rows[rows >= logits_from])  # (1, T - s, d)
        return torch.stack(keys), torch.stack(values), self.logits(picked)

    def denoise(self, canvas_ids: torch.Tensor, ctx_keys: torch.Tensor, ctx_values: torch.Tensor) -> torch.Tensor:
        """canvas_ids (B, C); context (L, 1, H, P, D) -> logits (B, C, V)."""
        b, c = canvas_ids.shape
        p = ctx_keys.shape[3]
        positions = torch.arange(c, device=canvas_ids.device, dtype=torch.float32) + p
        x = self.embed(canvas_ids)  # (B, C, d)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, positions)
            k = torch.cat((ctx_keys[i].expand(b, -1, -1, -1), k), dim=2)  # (B, H, P+C, D)
            v = torch.cat((ctx_values[i].expand(b, -1, -1, -1), v), dim=2)
            x = layer.finish(x, attend(q, k, v, None))
        return self.logits(x)

    def forward_train(self, ctx_ids: torch.Tensor, ctx_valid: torch.Tensor, canvas_ids: torch.Tensor) -> torch.Tensor:
        """One pass over [context; canvas], equivalent to encode then denoise.

        ctx_ids (B, P) left-padded; ctx_valid (B, P) bool; canvas_ids (B, C) -> (B, C, V).
        """
        canvas_logits, _ = self.forward_dual(ctx_ids, ctx_valid, canvas_ids)
        return canvas_logits

    def forward_dual(
        self,
        ctx_ids: torch.Tensor,
        ctx_valid: torch.Tensor,
        canvas_ids: torch.Tensor,
        mid_ids: torch.Tensor | None = None,
        mid_valid: torch.Tensor | None = None,
        ar_select: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The training pass of both uses of the weights at once (every computed token
        supervised): the causal context stream, the canvas, and the middle continuing
        the context stream after the middle marker, in one sequence

            [context (P, left-padded) ; canvas (C) ; middle (M, right-padded)]

        with positions [0..P-1, P..P+C-1, P..P+M-1]: canvas and middle both follow the
        context, as they do at inference (denoise, and autoregressive decoding through
        encode). The context is causal; the canvas sees the context and itself (never
        the middle, or it would learn to copy the answer); the middle sees the context
        and itself causally (never the canvas).

        Returns the canvas logits (B, C, V) and, when ``ar_select`` (B, P+C+M) bool is
        given, the logits of the selected positions only (N, V) for the next-token loss:
        padding and the canvas are never projected onto the vocabulary for nothing.
        """
        b, p = ctx_ids.shape
        c = canvas_ids.shape[1]
        dev = ctx_ids.device
        if mid_ids is None:
            mid_ids = ctx_ids.new_zeros((b, 0))
            mid_valid = ctx_valid.new_zeros((b, 0))
        assert mid_valid is not None
        m = mid_ids.shape[1]
        t = p + c + m
        x = self.embed(torch.cat((ctx_ids, canvas_ids, mid_ids), dim=1))  # (B, T, d)
        positions = torch.cat(
            (
                torch.arange(p + c, device=dev, dtype=torch.float32),
                torch.arange(m, device=dev, dtype=torch.float32) + p,
            )
        )
        allowed = torch.zeros(t, t, dtype=torch.bool, device=dev)
        allowed[:p, :p] = torch.ones(p, p, dtype=torch.bool, device=dev).tril()  # context: causal
        allowed[p : p + c, : p + c] = True  # canvas: all context and all canvas
        allowed[p + c :, :p] = True  # middle: all context ...
        allowed[p + c :, p + c :] = torch.ones(m, m, dtype=torch.bool, device=dev).tril()  # ... and itself, causally
        key_valid = torch.cat((ctx_valid, torch.ones(b, c, dtype=torch.bool, device=dev), mid_valid), dim=1)
        mask = allowed[None, None] & key_valid[:, None, None, :]  # (B, 1, T, T)
        # a padded row sees nothing; let it see itself so softmax stays finite
        mask = mask | torch.eye(t, dtype=torch.bool, device=dev)[None, None]
        for layer in self.layers:
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, positions)
            x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        canvas_logits = self.logits(x[:, p : p + c])
        if ar_select is None:
            return canvas_logits, None
        picked = self.norm(x[ar_select])  # (N, d)
        return canvas_logits, picked @ self.embed.weight.T

    def empty_cache(self, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        shape = (cfg.n_layers, 1, cfg.n_heads, 0, cfg.head_dim)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)
