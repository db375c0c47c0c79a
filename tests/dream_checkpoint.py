"""Tiny random checkpoints of the Dream family for tests: Qwen2 layers, a byte-level BPE
with Qwen's special token names, written as a user would have them on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|beginoftext|>",
    "<|mask|>",
]
TEXT = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\n",
] * 10
UNUSED_ROWS = 8  # embedding rows past the tokenizer, as Qwen's padded vocabulary has


# the generation_config.json Dream-v0 publishes (its fields as the dream backend reads them)
DREAM_GENERATION = {
    "alg": "entropy",
    "alg_temp": 0.0,
    "steps": 128,
    "temperature": 0.2,
    "top_p": 0.95,
    "max_new_tokens": 256,
}


def tokenizer(specials: list[str] = SPECIALS) -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False))
    return hf


REPOSITORY_SPECIALS = ["<|repo_name|>", "<|file_sep|>"]  # Qwen2.5-Coder's repository-level markers


def write(
    root: Path, model_type: str = "Dream", *, seed: int = 0, mask: bool = True, repository: bool = False, **own: Any
) -> Path:
    """A checkpoint directory: config.json (model_type "Dream", "qwen2" or "llama"),
    model.safetensors, tokenizer.json (with Qwen's repository markers when `repository`);
    `own` goes into config.json's diffusion_lsp."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    specials = SPECIALS if mask else [s for s in SPECIALS if s not in ("<|mask|>", "<|beginoftext|>")]
    hf = tokenizer(specials + REPOSITORY_SPECIALS if repository else specials)
    vocab = hf.get_vocab_size() + UNUSED_ROWS
    eos = hf.token_to_id("<|endoftext|>")
    shape: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": eos,
    }
    torch.manual_seed(seed)
    if model_type == "llama":
        model: Any = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root, safe_serialization=True)
    hf.save(str(root / "tokenizer.json"))
    cfg = json.loads((root / "config.json").read_text())
    if model_type == "Dream":  # as Dream-org publishes it (its auto_map points at remote code we never run)
        cfg.update(
            model_type="Dream",
            architectures=["DreamModel"],
            auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        )
    if mask:
        cfg["mask_token_id"] = hf.token_to_id("<|mask|>")
    if own:
        cfg["diffusion_lsp"] = own
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    return root
