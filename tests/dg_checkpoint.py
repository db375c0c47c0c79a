"""A tiny random DiffusionGemma checkpoint for the tests (3 layers, two of them sliding-window
with a window of WINDOW, 4 experts, vocab VOCAB, canvas CANVAS), and its directory as a user
would have one. Needs torch and transformers with DiffusionGemma: import it after the
tests' importorskip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 256
CANVAS = 16
WINDOW = 8


def tiny_config() -> Any:
    """The tiny model's DiffusionGemmaConfig."""
    from transformers import DiffusionGemmaConfig

    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        max_position_embeddings=512,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=16,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        initializer_range=0.3,  # peaked logits: the entropy bound accepts varying numbers of tokens
    )
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
        patch_size=4,
    )
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS, initializer_range=0.3)


def checkpoint_dir(model: Any, root: Path) -> Path:
    """A DiffusionGemma checkpoint directory as a user would have one: config, safetensors,
    and a tokenizer.json whose special tokens use Gemma's names."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    model.save_pretrained(root, safe_serialization=True)
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<bos>", "<|fim_suffix|>", "<|fim_prefix|>", "<|fim_middle|>"]
    hf.train_from_iterator(
        ["def f(x):\n    return x + 1\n"] * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=specials)
    )
    assert hf.get_vocab_size() <= VOCAB
    hf.save(str(root / "tokenizer.json"))
    return root
