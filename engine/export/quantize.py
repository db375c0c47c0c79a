"""The weight products of an exported language model (an `onnx_lm` directory) in 8 or 4 bits:
the arrays and the nodes, shared by both exporters (engine/training/export_lm.py, which
traces a transformers model with torch, and engine/export/graph.py, which writes the graph
from a GGUF file's tensors with numpy alone). numpy, onnx and onnxruntime only.

- **Integer products** (`--quantize int8`, every projection of every layer): the weight in
  int8 per output column (WEIGHT_LEVELS), each token's activations quantized to u8 by its
  own scale (its largest magnitude over 127, zero point 128), the int32 product back to
  float32 by both scales. onnxruntime's dynamic quantization takes one scale for the whole
  chunk, so that one token's outlier costs every other token its precision, and a token's
  result depended on the chunk it was encoded in; per token, it does neither. The products
  of one input (q, k and v; gate and up) share its quantization.
- **MatMulNBits** (the head at 8 bits; everything at 4): onnxruntime's weight-only blocks
  (BLOCK_SIZE along the input, symmetric), quantized by onnxruntime's own kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# weights per quantization block (onnxruntime's MatMulNBits)
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # MatMulNBits: activations quantized to int8 for the arithmetic (fast on AVX2)
# the integer products' weights in [-63, 63] (7 bits), as the u8-by-s8 product of x86 CPUs
# without VNNI adds two products in 16 bits and saturates on 8 (onnxruntime's
# `reduce_range`); with 8 bits, measured on a VNNI CPU, the held-out eval was no better
WEIGHT_LEVELS = 63
PREFIX = "pt/"  # the names the integer products add to a graph

Node = Any  # onnx.NodeProto
Tensor = Any  # onnx.TensorProto


def integer_levels(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A weight (K, N) as int8 levels (K, N) and a float32 scale per output column (N,)."""
    dense = np.asarray(dense, dtype=np.float32)
    column = np.maximum(np.abs(dense).max(axis=0), 1e-12) / WEIGHT_LEVELS
    levels = np.clip(np.round(dense / column), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return levels, column.astype(np.float32)


def nbits_blocks(dense: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """A weight (K, N) as MatMulNBits' symmetric blocks: the packed levels (N, K/BLOCK_SIZE,
    blob) and the scales (N, K/BLOCK_SIZE), by onnxruntime's own kernel."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    dense = np.ascontiguousarray(dense, dtype=np.float32)
    rows, cols = dense.shape
    blocks = -(-rows // BLOCK_SIZE)
    if blocks * BLOCK_SIZE != rows:
        dense = np.pad(dense, ((0, blocks * BLOCK_SIZE - rows), (0, 0)))
    per_byte = 8 // bits
    packed = np.zeros((cols, blocks, BLOCK_SIZE // per_byte), dtype=np.uint8)
    zero_points = np.zeros((cols, -(-blocks // per_byte)), dtype=np.uint8)  # unused: symmetric
    scales = np.zeros((cols, blocks), dtype=np.float32)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    kernel(packed, dense, scales, zero_points, BLOCK_SIZE, cols, rows, True)
    return packed, scales


def matmul_nbits(x: str, packed: str, scales: str, out: str, k: int, n: int, bits: int, name: str = "") -> Node:
    """The MatMulNBits node of `x` (..., K) by a weight stored by `nbits_blocks`."""
    from onnx import helper

    return helper.make_node(
        "MatMulNBits", [x, packed, scales], [out], name=name, domain="com.microsoft",
        K=k, N=n, bits=bits, block_size=BLOCK_SIZE, accuracy_level=ACCURACY_LEVEL,
    )  # fmt: skip


class IntegerProducts:
    """Emits integer products into a node list. `store(name, array)` keeps a weight array
    (an initializer, or external data written at once); the small constants are
    `constants()`, added to the graph once at the end."""

    def __init__(self, store: Callable[[str, np.ndarray], None]) -> None:
        self._store = store
        self._tokens: dict[str, tuple[str, str]] = {}  # input -> (its u8 tokens, their scales (..., 1))
        self._weights: dict[str, str] = {}  # a weight's key -> its levels' prefix (one copy when shared)
        self._products = 0

    @staticmethod
    def constants() -> list[Tensor]:
        from onnx import numpy_helper

        return [
            numpy_helper.from_array(np.array(1e-8, np.float32), PREFIX + "eps"),
            numpy_helper.from_array(np.array(1 / 127, np.float32), PREFIX + "inv127"),
            numpy_helper.from_array(np.array(1.0, np.float32), PREFIX + "one"),
            numpy_helper.from_array(np.array(128, np.uint8), PREFIX + "zp"),
        ]

    def weight(self, key: str, dense: Callable[[], np.ndarray]) -> str:
        """The prefix of the levels of the weight `key` (K, N), quantized and stored the first
        time it is asked for (`dense` is called only then)."""
        if key not in self._weights:
            self._weights[key] = q = f"{PREFIX}w{len(self._weights)}/"
            levels, column = integer_levels(dense())
            self._store(q + "w", levels)
            self._store(q + "wscale", column)
        return self._weights[key]

    def product(self, nodes: list[Node], x: str, weight: str, out: str) -> None:
        """Append to `nodes` the product of `x` (..., K) by the stored weight `weight` (a
        prefix from `weight()`) as `out` (..., N)."""
        from onnx import TensorProto, helper

        if x not in self._tokens:
            p = f"{PREFIX}{len(self._tokens)}/"
            nodes += [
                helper.make_node("Abs", [x], [p + "abs"]),
                helper.make_node("ReduceMax", [p + "abs"], [p + "max"], name=p + "max", axes=[-1], keepdims=1),
                helper.make_node("Max", [p + "max", PREFIX + "eps"], [p + "max1"]),
                helper.make_node("Mul", [p + "max1", PREFIX + "inv127"], [p + "scale"]),
                helper.make_node("Div", [x, p + "scale"], [p + "unit"]),
                helper.make_node("QuantizeLinear", [p + "unit", PREFIX + "one", PREFIX + "zp"], [p + "u8"]),
            ]
            self._tokens[x] = (p + "u8", p + "scale")
        u8, scale = self._tokens[x]
        p = f"{PREFIX}p{self._products}/"
        self._products += 1
        nodes += [
            helper.make_node("MatMulInteger", [u8, weight + "w", PREFIX + "zp"], [p + "i32"]),
            helper.make_node("Cast", [p + "i32"], [p + "f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [p + "f", scale], [p + "tokens"]),
            helper.make_node("Mul", [p + "tokens", weight + "wscale"], [out]),
        ]
