"""Tiny random LLaDA checkpoints for tests, written as the Hub has them (GSAI-ML/LLaDA-8B-Base
and -Instruct): config.json with LLaDA's own fields (model_type "llada", d_model, n_layers,
mlp_hidden_size, ...; its auto_map points at remote code that is never run), the weights under
LLaDA's tensor names (model.transformer.wte, blocks.N.q_proj, attn_out, ff_proj, up_proj,
ff_out, ...), sharded with an index as the 8B is, and a byte-level BPE with LLaDA's special
token names. Only the sizes are tiny."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import dream_checkpoint

SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|mdm_mask|>",
]
UNUSED_ROWS = 8  # embedding rows past the tokenizer (LLaDA's 126,464 rows hold a smaller tokenizer)
WEIGHT_SCALE = 0.15  # larger than an initializer's 0.02, so that the logits differ by position

# config.json of LLaDA-8B, but for the sizes (which `write` sets)
HUB_FIELDS: dict[str, Any] = {
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        "AutoModel": "modeling_llada.LLaDAModelLM",
    },
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "embedding_dropout": 0.0,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mlp_ratio": 4,
    "model_type": "llada",
    "multi_query_attention": None,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "use_cache": False,
    "weight_tying": False,
}


def tensors(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """Random weights of a LLaDA config under LLaDA's names: (out, in) matrices."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    d, heads = cfg["d_model"], cfg["n_heads"]
    kv = (d // heads) * (cfg["n_kv_heads"] or heads)
    hidden, rows = cfg["mlp_hidden_size"], cfg["embedding_size"]

    def matrix(out: int, inp: int) -> Any:
        return torch.randn(out, inp, generator=gen) * WEIGHT_SCALE

    def norm() -> Any:
        return 1.0 + 0.1 * torch.randn(d, generator=gen)

    out = {"model.transformer.wte.weight": torch.randn(rows, d, generator=gen)}
    for i in range(cfg["n_layers"]):
        block = f"model.transformer.blocks.{i}."
        out |= {
            block + "attn_norm.weight": norm(),
            block + "q_proj.weight": matrix(d, d),
            block + "k_proj.weight": matrix(kv, d),
            block + "v_proj.weight": matrix(kv, d),
            block + "attn_out.weight": matrix(d, d),
            block + "ff_norm.weight": norm(),
            block + "ff_proj.weight": matrix(hidden, d),
            block + "up_proj.weight": matrix(hidden, d),
            block + "ff_out.weight": matrix(d, hidden),
        }
    out["model.transformer.ln_f.weight"] = norm()
    if not cfg["weight_tying"]:
        out["model.transformer.ff_out.weight"] = matrix(rows, d)
    return out


def write(
    root: Path, *, seed: int = 0, shards: int = 2, generation: dict[str, Any] | None = None, **fields: Any
) -> Path:
    """A checkpoint directory: config.json (LLaDA's fields; `fields` override them),
    model-0000K-of-0000N.safetensors with model.safetensors.index.json (one
    model.safetensors when `shards` is 1), tokenizer.json, and generation_config.json
    when `generation` is given."""
    from safetensors.torch import save_file

    hf = dream_checkpoint.tokenizer(SPECIALS)
    rows = hf.get_vocab_size() + UNUSED_ROWS
    eos = hf.token_to_id("<|endoftext|>")
    cfg = {
        **HUB_FIELDS,
        "d_model": 64,
        "n_heads": 4,
        "n_kv_heads": 2,
        "n_layers": 2,
        "mlp_hidden_size": 96,
        "max_sequence_length": 512,
        "vocab_size": rows,
        "embedding_size": rows,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "mask_token_id": hf.token_to_id("<|mdm_mask|>"),
        **fields,
    }
    weights = tensors(cfg, seed)
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(weights)
    if shards == 1:
        save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    else:
        index: dict[str, str] = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = names[k::shards]
            save_file({n: weights[n].contiguous() for n in part}, str(root / file), metadata={"format": "pt"})
            index |= dict.fromkeys(part, file)
        total = sum(int(t.numel() * t.element_size()) for t in weights.values())
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2)
        )
    hf.save(str(root / "tokenizer.json"))
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if generation is not None:
        (root / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return root
