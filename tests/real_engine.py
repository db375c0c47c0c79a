"""A real inference engine for the remote backend's tests: llama.cpp's server, run in
process through `xllamacpp` (llama.cpp's own server context and HTTP front end, the code
`llama-server` runs, as a prebuilt wheel: no build), on a tiny GGUF written here.

The model is made, not downloaded: a llama-architecture GGUF with a SentencePiece-style
vocabulary (byte tokens, the letters x and y, BOS/EOS) and llama.cpp's FIM tokens set.
Every block's output projections are zero and every token embeds to the same vector, so
the logits do not depend on the prompt: only x and y have high logits (x the highest),
so a greedy fill is x repeated, a sampled one a string of x and y, and it never writes
end-of-sequence: a fill runs to the budget it is given (``eos_logit`` gives end-of-sequence
a logit too: below x's, a sampled fill then ends by itself). Its fills are valid UTF-8 and
parse as identifiers; `letter_logprobs` is each letter's log-probability under those
fixed logits, which the engine's reported log-probabilities must equal. ``width`` sets the model's size, and so the time one token costs
(the cancellation tests want a slow one).
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FIM_PRE, FIM_SUF, FIM_MID = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
# a ChatML template (Jinja, as llama.cpp's server renders it): the server's chat route
# serves a model that carries one
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


TOP_LOGIT, OTHER_LOGIT = 6.0, -8.0  # the first letter's logit (each next one 1 lower), every other token's


def vocabulary(fim: bool = True, vocab_letters: str = "xy") -> tuple[list[str], dict[str, int], dict[str, int]]:
    """(the tokens, the FIM tokens' ids, the letters' ids): unk, bos, eos, FIM tokens, 256
    byte tokens, then a few letters."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    fim_ids: dict[str, int] = {}
    for name in (FIM_PRE, FIM_SUF, FIM_MID) if fim else ():  # (llama.cpp finds FIM tokens by their text too)
        fim_ids[name] = len(tokens)
        tokens.append(name)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    letter_ids = {}
    for ch in vocab_letters + " \u2581":
        if ch not in tokens:
            letter_ids[ch] = len(tokens)
            tokens.append(ch)
    return tokens, fim_ids, letter_ids


def letter_logprobs(fim: bool = True, vocab_letters: str = "xy", eos_logit: float | None = None) -> dict[str, float]:
    """Each letter's log-probability (and end-of-sequence's, as "</s>", with `eos_logit`),
    the same after any prompt: the model's logits are fixed (TOP_LOGIT for the first
    letter, one less for each next, `eos_logit` for end-of-sequence, OTHER_LOGIT for every
    other token), so this is their log-softmax, as an engine that reports log-probabilities
    must give it."""
    tokens, _, letter_ids = vocabulary(fim, vocab_letters)
    logits = {ch: TOP_LOGIT - i for i, ch in enumerate(vocab_letters)}
    if eos_logit is not None:
        logits["</s>"] = eos_logit
    others = len(tokens) - len(logits)
    log_z = math.log(sum(math.exp(v) for v in logits.values()) + others * math.exp(OTHER_LOGIT))
    return {ch: v - log_z for ch, v in logits.items()}


def write_gguf(
    path: Path,
    *,
    width: int = 64,
    layers: int = 1,
    fim: bool = True,
    vocab_letters: str = "xy",
    chat: bool = True,
    eos_logit: float | None = None,
) -> Path:
    """A tiny llama GGUF at `path` (see the module's docstring)."""
    import gguf

    tokens, fim_ids, letter_ids = vocabulary(fim, vocab_letters)
    control = {"<unk>": gguf.TokenType.UNKNOWN, "<s>": gguf.TokenType.CONTROL, "</s>": gguf.TokenType.CONTROL}
    control.update(dict.fromkeys(fim_ids, gguf.TokenType.CONTROL))
    types = [control.get(t, gguf.TokenType.BYTE if t.startswith("<0x") else gguf.TokenType.NORMAL) for t in tokens]
    vocab = len(tokens)
    scores = [0.0] * vocab
    for i, ch in enumerate(vocab_letters):
        scores[letter_ids[ch]] = -1.0 - i

    w = gguf.GGUFWriter(str(path), "llama")
    heads = 2
    w.add_name("diffusion-lsp test engine model")
    w.add_context_length(8192)
    w.add_embedding_length(width)
    w.add_block_count(layers)
    w.add_feed_forward_length(2 * width)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(width // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat:
        w.add_chat_template(CHATML)
    if fim:
        w.add_uint32(gguf.Keys.Tokenizer.FIM_PRE_ID, fim_ids[FIM_PRE])
        w.add_uint32(gguf.Keys.Tokenizer.FIM_SUF_ID, fim_ids[FIM_SUF])
        w.add_uint32(gguf.Keys.Tokenizer.FIM_MID_ID, fim_ids[FIM_MID])

    rng = np.random.default_rng(0)
    f32 = np.float32
    embed = np.tile(np.ones(width, dtype=f32), (vocab, 1))  # every token the same vector
    w.add_tensor("token_embd.weight", embed)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, dtype=f32))
        for name in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{i}.{name}.weight", (rng.standard_normal((width, width)) * 0.02).astype(f32))
        w.add_tensor(f"blk.{i}.attn_output.weight", np.zeros((width, width), dtype=f32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, dtype=f32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", (rng.standard_normal((2 * width, width)) * 0.02).astype(f32))
        w.add_tensor(f"blk.{i}.ffn_up.weight", (rng.standard_normal((2 * width, width)) * 0.02).astype(f32))
        w.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((width, 2 * width), dtype=f32))
    w.add_tensor("output_norm.weight", np.ones(width, dtype=f32))
    # logits = output @ norm(ones) = the row sums / sqrt-free constant: x highest, y next, the rest far below
    out = np.full((vocab, width), OTHER_LOGIT / width, dtype=f32)
    for i, ch in enumerate(vocab_letters):
        out[letter_ids[ch]] = (TOP_LOGIT - 1.0 * i) / width
    if eos_logit is not None:
        out[2] = eos_logit / width
    w.add_tensor("output.weight", out)
    from tests.gguf_checkpoint import finish

    finish(w)
    return path


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningEngine:
    url: str
    server: Any  # the xllamacpp.Server, kept alive

    def metrics(self) -> dict[str, float]:
        """llama.cpp's Prometheus counters (`llamacpp:...`), by name without the prefix."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, value = line.split()[:2]
                out[name[len("llamacpp:") :]] = float(value)
        return out

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, float]:
        """The counters once nothing is being computed; TimeoutError past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while (m := self.metrics())["requests_processing"] > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine at {self.url} was still computing after {timeout_s:g} s")
            time.sleep(0.02)
        return m


@contextlib.contextmanager
def llama_server(model: Path, *, slots: int = 1, threads: int = 1, ctx: int = 8192) -> Iterator[RunningEngine]:
    """llama.cpp's server on a free loopback port, serving `model`, until the block ends."""
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(model)
    params.n_parallel = slots
    params.n_ctx = ctx * slots
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.endpoint_metrics = True
    params.warmup = False
    port = free_port()
    params.hostnames = ["127.0.0.1"]
    params.port = port
    server = xlc.Server(params)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp's server did not come up on {url}") from None
            time.sleep(0.05)
    running = RunningEngine(url, server)
    del server
    try:
        yield running
    finally:
        running.server = None  # the last reference: the server stops (its destructor joins its loop)
