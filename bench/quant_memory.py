"""The memory each 7-8B diffusion coder needs at each quantization: weights and the peak
to run, computed by engine.denoisers.quant.estimate on the architecture built on the meta
device (no weights read, nothing downloaded). Prints JSON; docs/models.md holds the table.

    python bench/quant_memory.py
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.denoisers import quant

# The published shapes (config.json of each checkpoint).
# Dream-v0, Dream-Coder, DreamOn, DiffuCoder and Fast-dLLM v2 7B: Qwen2.5(-Coder)-7B's shape
QWEN25_7B: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
LLADA_8B: dict[str, Any] = {  # LLaDA-8B Base and Instruct: Llama blocks, no grouped keys and values
    "vocab_size": 126464,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
}
SHAPES = {
    "qwen2.5-7b shape (Dream family)": (Qwen2ForCausalLM, Qwen2Config, QWEN25_7B),
    "llada-8b shape": (LlamaForCausalLM, LlamaConfig, LLADA_8B),
}
GB = 1e9


def rows() -> list[dict[str, Any]]:
    out = []
    for name, (cls, config_cls, shape) in SHAPES.items():
        meta = quant.meta_model(cls, config_cls(**shape))
        for device, dtype in (("cuda or mps (bfloat16)", torch.bfloat16), ("cpu (float32)", torch.float32)):
            for q in quant.QUANTIZATIONS:
                est = quant.estimate(meta, q, dtype)  # type: ignore[arg-type]
                out.append(
                    {
                        "shape": name,
                        "device": device,
                        "quantization": q,
                        "params_b": round(est.params / GB, 2),
                        "quantized_params_b": round(est.quantized_params / GB, 2),
                        "weights_gb": round(est.weights / GB, 2),
                        "peak_gb": round(est.runtime / GB, 2),
                        "weights_gib": round(est.weights / quant.GIB, 2),
                        "peak_gib": round(est.runtime / quant.GIB, 2),
                    }
                )
    return out


if __name__ == "__main__":
    json.dump({"torch": torch.__version__, "rows": rows()}, sys.stdout, indent=1)
    sys.stdout.write("\n")
