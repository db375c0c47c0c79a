"""Tiny random block-causal checkpoints for tests, written as their releases have them:
Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B: config.json with model_type
"Fast_dLLM_Qwen" and `bd_size`, Qwen2.5's layers and tensor names, the tokenizer's
`|<MASK>|`, no mask_token_id in config.json) and SDAR (JetAstra/SDAR-*-Chat: model_type
"sdar", `block_size`, `mask_token_id`, Qwen3's layers with q/k norms). Their auto_map
points at remote code that is never run. Only the sizes are tiny, and the weights are
larger than an initializer's so that the logits differ by position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import dream_checkpoint

QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
]
FAST_DLLM_MASK = "|<MASK>|"
SDAR_MASK = "<MASK>"
UNUSED_ROWS = 8
WEIGHT_SCALE = 0.15

SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}

FAST_DLLM_FIELDS: dict[str, Any] = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
        "AutoModel": "modeling.Fast_dLLM_QwenModel",
        "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
    },
    "model_type": "Fast_dLLM_Qwen",
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "rope_scaling": None,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

SDAR_FIELDS: dict[str, Any] = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },
    "model_type": "sdar",
    "attn_implementation": "flex_attention",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "head_dim": 16,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "rope_scaling": None,
    "torch_dtype": "bfloat16",
    "use_cache": False,
    "fuse_cross_entropy": True,
}


def _randomized(model: Any, seed: int) -> None:
    """Every weight drawn again at WEIGHT_SCALE; norms near one."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else noise * WEIGHT_SCALE)


def write(
    root: Path, family: str = "fast_dllm", *, seed: int = 0, generation: dict[str, Any] | None = None, **fields: Any
) -> Path:
    """A checkpoint directory of `family` ("fast_dllm" or "sdar"): config.json (the
    family's fields; `fields` override them), model.safetensors, tokenizer.json, and
    generation_config.json when `generation` is given."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    sdar = family == "sdar"
    hf = dream_checkpoint.tokenizer([*QWEN_SPECIALS, SDAR_MASK if sdar else FAST_DLLM_MASK])
    rows = hf.get_vocab_size() + UNUSED_ROWS
    eos = hf.token_to_id("<|endoftext|>" if sdar else "<|im_end|>")  # as SDAR's and Qwen2.5-Instruct's configs
    ids = {"vocab_size": rows, "bos_token_id": hf.token_to_id("<|endoftext|>"), "eos_token_id": eos}
    if sdar:
        own = {**SDAR_FIELDS, "block_size": 4, "mask_token_id": hf.token_to_id(SDAR_MASK)}
        model: Any = Qwen3ForCausalLM(Qwen3Config(**SHAPE, **ids, head_dim=16))
    else:
        own = {**FAST_DLLM_FIELDS, "bd_size": 8, "layer_types": ["full_attention"] * SHAPE["num_hidden_layers"]}
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, **ids))
    _randomized(model, seed)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root, safe_serialization=True)
    hf.save(str(root / "tokenizer.json"))
    cfg = {**SHAPE, **ids, **own, **fields}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if generation is not None:
        (root / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return root
