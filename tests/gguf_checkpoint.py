"""A checkpoint directory (tests/dream_checkpoint.py's tiny Qwen2 or Llama) written as a GGUF
file the way llama.cpp's convert_hf_to_gguf.py writes one: its tensor names, a Llama model's
q and k rows permuted for its rotary embedding, the byte-level BPE as token, type and merge
lists, the rows past the tokenizer named [PADn]. numpy, safetensors and gguf only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# transformers' names -> llama.cpp's, per layer
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of a Llama q or k projection (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, _, layer, rest = name.split(".", 3)  # model.layers.N.rest
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def write(checkpoint: Path, path: Path, *, pre: str = "gpt-2", types: dict[str, Any] | None = None) -> Path:
    """The GGUF file of `checkpoint` at `path`; `types` gives some tensors (llama.cpp's
    names) a quantized type (gguf.GGMLQuantizationType), the rest stay F32."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    arch = cfg["model_type"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test model")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # the vocabulary in id order; the added tokens are control tokens; the rows past it [PADn]
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a["content"] for a in tok["added_tokens"]}
    by_id.update(added)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    kinds = [
        gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED
        for i in range(cfg["vocab_size"])
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(kinds)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    for name, value in load_file(str(checkpoint / "model.safetensors")).items():
        target = gguf_name(name)
        value = value.astype(np.float32)
        if arch == "llama" and target.endswith("attn_q.weight"):
            value = permute(value, heads)
        elif arch == "llama" and target.endswith("attn_k.weight"):
            value = permute(value, kv_heads)
        kind = (types or {}).get(target)
        if kind is None:
            w.add_tensor(target, value)
        else:
            w.add_tensor(target, gguf.quants.quantize(value, kind), raw_dtype=kind)
    finish(w)
    return path


def finish(w: Any) -> None:
    """Write a gguf.GGUFWriter's header, metadata and tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def perturbed(checkpoint: Path, seed: int = 1) -> Path:
    """The checkpoint with noise on every tensor (biases and norms too, which a fresh model
    has at 0 and 1), in place: a product of the wrong tensor then shows."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    weights = load_file(str(checkpoint / "model.safetensors"))
    noisy = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.05).astype(v.dtype) for k, v in weights.items()}
    save_file(noisy, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    return checkpoint
