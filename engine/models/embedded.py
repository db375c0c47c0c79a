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

The length head (``length_classes`` > 0) reads the hidden state of the last context token,
the middle marker, and predicts how many tokens the middle has: the canvas is then sized
to the fill instead of to the span's budget (the length is the known weak point of
diffusion infilling). It is one (d, K) matrix, nearly free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

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
    # Classes of the length head (0: none): the middle's token count 0..length_classes-1,
    # predicted from the middle marker's hidden state, the last context token.
    length_classes: int = 0

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


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the rotary angles, each (T, D/2), for positions (T,) float: computed
    once per forward pass and shared by every layer."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    return freqs.cos(), freqs.sin()


Rotation = tuple[torch.Tensor, torch.Tensor]  # rope_tables' (cos, sin)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of interleaved pairs (x[2i], x[2i+1]). x: (B, H, T, D)."""
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

    def qkv_heads(self, x: torch.Tensor, rot: Rotation | None) -> tuple[torch.Tensor, ...]:
        """q, k (rotated by `rot`, rope_tables' (cos, sin); None: not rotated) and v, each (B, H, T, D)."""
        b, t, _ = x.shape
        h, d = self.cfg.n_heads, self.cfg.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        return (q, k, v) if rot is None else (rope(q, *rot), rope(k, *rot), v)

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


def cached_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, rot: Rotation
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of T new tokens (q, k, v: (1, H, T, D), q and k not yet rotated; `rot`
    their rotation) over every cached token (past: (1, H, P, D), rotated) and, causally,
    the new ones. Returns the output (1, H, T, D) and the keys and values with the new
    tokens appended (1, H, P + T, D).

    The export replaces this with onnxruntime's fused GroupQueryAttention (rotation
    included), which computes the same thing without materialising the (T, P + T) mask
    (engine/training/export.py)."""
    q, k = rope(q, *rot), rope(k, *rot)
    p, t = past_k.shape[2], q.shape[2]
    keys, values = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    mask = torch.cat((torch.ones(t, p, dtype=torch.bool, device=q.device), causal), dim=1)  # (T, P+T)
    return attend(q, keys, values, mask), keys, values


CausalAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Rotation],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]


def attend_with_context(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor
) -> torch.Tensor:
    """Bidirectional attention of a canvas (q, k, v: (B, H, C, D)) over itself and the
    cached context (1, H, P, D), shared by the B rows. One softmax over both blocks of
    scores, so it equals attention over [context; canvas], but the context is never copied
    (no concatenation, no expansion to B rows): each step reads it once."""
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    p = ctx_k.shape[2]
    probs = torch.softmax(torch.cat((q @ ctx_k.transpose(-1, -2), q @ k.transpose(-1, -2)), dim=-1), dim=-1)
    return probs[..., :p] @ ctx_v + probs[..., p:] @ v  # (B, H, C, D)


def dual_layout(
    ctx_valid: torch.Tensor, canvas_valid: torch.Tensor, mid_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions (T,), attention mask (B, 1, T, T)) of `DiffusionCoder.forward_dual`'s
    sequence [context (P) ; canvas (C) ; middle (M)], from each part's valid keys (B, *):
    positions [0..P-1, P..P+C-1, P..P+M-1]; the context causal, the canvas seeing the
    context and itself, the middle the context and itself causally; invalid keys never
    seen (a row with none sees itself, so softmax stays finite)."""
    p, c, m = ctx_valid.shape[1], canvas_valid.shape[1], mid_valid.shape[1]
    t = p + c + m
    dev = ctx_valid.device
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
    key_valid = torch.cat((ctx_valid, canvas_valid, mid_valid), dim=1)
    mask = allowed[None, None] & key_valid[:, None, None, :]  # (B, 1, T, T)
    # a padded row sees nothing; let it see itself so softmax stays finite
    mask = mask | torch.eye(t, dtype=torch.bool, device=dev)[None, None]
    return positions, mask


class DualOutput(NamedTuple):
    canvas: torch.Tensor  # (B, C, V)
    ar: torch.Tensor | None  # (N, V): the selected next-token positions
    length: torch.Tensor | None  # (B, K): the length head at the middle marker


class DiffusionCoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.length_head: nn.Linear | None = None
        if cfg.length_classes > 0:
            self.add_length_head(cfg.length_classes)
        nn.init.normal_(self.embed.weight, std=0.02)
        for layer in self.layers:
            assert isinstance(layer, Block)
            for lin in (layer.qkv, layer.gate_up):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (layer.out, layer.down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def add_length_head(self, classes: int) -> None:
        """A length head of `classes` outputs that starts from zero (a uniform guess, and no
        gradient into the trunk until it has learnt something)."""
        head = nn.Linear(self.cfg.d_model, classes)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.length_head = head.to(self.embed.weight.device)
        self.cfg = replace(self.cfg, length_classes=classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed.weight)  # tied output head: (..., d) -> (..., V)

    def length_logits(self, x: torch.Tensor, probe: bool = False) -> torch.Tensor:
        """Length-head logits (..., K) from final hidden states (..., d) at the middle marker;
        `probe`: no gradient into the trunk (the states and the final norm)."""
        assert self.length_head is not None
        if not probe:
            return self.length_head(self.norm(x))
        x = x.detach()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm.eps) * self.norm.weight.detach()
        return self.length_head(normed)

    def encode(
        self,
        input_ids: torch.Tensor,
        past_keys: Sequence[torch.Tensor] | torch.Tensor,
        past_values: Sequence[torch.Tensor] | torch.Tensor,
        logits_from: torch.Tensor | None = None,
        attention: CausalAttention = cached_causal_attention,
        length: bool = False,
    ) -> tuple[Any, ...]:
        """input_ids (1, T); past: one (1, H, P, D) per layer (a list, or stacked as
        (L, 1, H, P, D)) -> present keys and values, a list of (1, H, P+T, D) each.

        With ``logits_from`` (an int64 scalar tensor s, 0 <= s < T) also the next-token
        logits of new tokens s..T-1, (1, T - s, V): the autoregressive mode of the same
        weights (T - 1 for the next token only; 0 to score a whole continuation). With
        ``length`` (and a length head) last the length head's logits at the last new
        token, (1, K): the fill's token count when that token is the middle marker."""
        p, t = past_keys[0].shape[2], input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device, dtype=torch.float32) + p
        rot = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(input_ids)  # (1, T, C)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, None)
            out, k, v = attention(q, k, v, past_keys[i], past_values[i], rot)
            keys.append(k)
            values.append(v)
            x = layer.finish(x, out)
        result: tuple[Any, ...] = (keys, values)
        if logits_from is not None:
            rows = torch.arange(t, device=input_ids.device)
            picked = torch.index_select(x, 1, rows[rows >= logits_from])  # (1, T - s, d)
            result = (*result, self.logits(picked))
        if length and self.length_head is not None:
            result = (*result, self.length_logits(x[:, -1]))
        return result

    def denoise(
        self,
        canvas_ids: torch.Tensor,
        ctx_keys: Sequence[torch.Tensor] | torch.Tensor,
        ctx_values: Sequence[torch.Tensor] | torch.Tensor,
    ) -> torch.Tensor:
        """canvas_ids (B, C); context: one (1, H, P, D) per layer -> logits (B, C, V)."""
        c = canvas_ids.shape[1]
        p = ctx_keys[0].shape[2]
        positions = torch.arange(c, device=canvas_ids.device, dtype=torch.float32) + p
        rot = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(canvas_ids)  # (B, C, d)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, rot)
            x = layer.finish(x, attend_with_context(q, k, v, ctx_keys[i], ctx_values[i]))
        return self.logits(x)

    def forward_dual(
        self,
        ctx_ids: torch.Tensor,
        ctx_valid: torch.Tensor,
        canvas_ids: torch.Tensor,
        mid_ids: torch.Tensor | None = None,
        mid_valid: torch.Tensor | None = None,
        ar_select: torch.Tensor | None = None,
        canvas_valid: torch.Tensor | None = None,
    ) -> DualOutput:
        """The training pass of both uses of the weights at once (every computed token
        supervised): the causal context stream, the canvas, and the middle continuing
        the context stream after the middle marker, in one sequence

            [context (P, left-padded) ; canvas (C) ; middle (M, right-padded)]

        with positions [0..P-1, P..P+C-1, P..P+M-1]: canvas and middle both follow the
        context, as they do at inference (denoise, and autoregressive decoding through
        encode). The context is causal; the canvas sees the context and itself (never
        the middle, or it would learn to copy the answer); the middle sees the context
        and itself causally (never the canvas).

        ``canvas_valid`` (B, C) bool cuts each row's canvas to its own length (a canvas
        sized to the fill): positions past it are never attended to.

        Returns the canvas logits (B, C, V); when ``ar_select`` (B, P+C+M) bool is given,
        the logits of the selected positions only (N, V) for the next-token loss (padding
        and the canvas are never projected onto the vocabulary for nothing); and the
        length head's logits at the middle marker, the last context position (B, K).
        """
        b, p = ctx_ids.shape
        c = canvas_ids.shape[1]
        if mid_ids is None:
            mid_ids = ctx_ids.new_zeros((b, 0))
            mid_valid = ctx_valid.new_zeros((b, 0))
        assert mid_valid is not None
        if canvas_valid is None:
            canvas_valid = torch.ones(b, c, dtype=torch.bool, device=ctx_ids.device)
        x = self.embed(torch.cat((ctx_ids, canvas_ids, mid_ids), dim=1))  # (B, T, d)
        positions, mask = dual_layout(ctx_valid, canvas_valid, mid_valid)
        rot = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        for layer in self.layers:
            assert isinstance(layer, Block)
            q, k, v = layer.qkv_heads(x, rot)
            x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        canvas_logits = self.logits(x[:, p : p + c])
        # the length head reads the middle marker's state without training it: that state
        # also predicts the fill's first token (the autoregressive mode). Run 6 let the
        # length loss into it and its one-token mode began most function bodies with an
        # empty line (MODEL_CARD.md); this is the suspected cause, not a proven one
        length = self.length_logits(x[:, p - 1], probe=True) if self.length_head is not None else None  # (B, K)
        if ar_select is None:
            return DualOutput(canvas_logits, None, length)
        picked = self.norm(x[ar_select])  # (N, d)
        return DualOutput(canvas_logits, picked @ self.embed.weight.T, length)

    def empty_cache(self, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        shape = (cfg.n_layers, 1, cfg.n_heads, 0, cfg.head_dim)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)
