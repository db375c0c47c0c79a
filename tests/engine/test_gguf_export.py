"""export-onnx of a GGUF file without torch (engine/export/): the graph against the torch
exporter's on tiny random Qwen2 and Llama models written as GGUF the way llama.cpp writes
them, the dequantization against transformers' own GGUF reader, the tokenizer against
transformers' GGUF tokenizer, and the whole command in a process where torch cannot be
imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gguf")

from engine.commands.cli import main  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.export.from_gguf import export_gguf  # noqa: E402
from engine.export.gguf_source import GGUFSource  # noqa: E402
from tests import gguf_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def checkpoint(tmp: Path, model_type: str) -> Path:
    pytest.importorskip("torch")
    from tests import dream_checkpoint

    return gguf_checkpoint.perturbed(dream_checkpoint.write(tmp / model_type, model_type, mask=False))


def run(directory: Path, seed: int = 0) -> list[np.ndarray]:
    """The graph on 4 new tokens after 3 cached ones (random keys and values), causal."""
    import onnxruntime as ort

    cfg = json.loads((directory / "config.json").read_text())
    session = ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    past, new = 3, 4
    bias = np.zeros((1, 1, new, past + new), np.float32)
    bias[0, 0][np.triu_indices(new, 1, past + new)] = -1e9  # (the triangle right of the past)
    feeds: dict[str, Any] = {
        "input_ids": rng.integers(0, cfg["vocab_size"] - 10, (1, new)),
        "position_ids": np.arange(past, past + new)[None],
        "attention_bias": bias,
        "logits_at": np.arange(new),
    }
    shape = (1, cfg["num_key_value_heads"], past, cfg["head_dim"])
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return session.run(None, feeds)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
@pytest.mark.parametrize("quantize", ["none", "int8", "int4"])
def test_the_graph_is_the_torch_exporters(tmp_path: Path, model_type: str, quantize: str) -> None:
    pytest.importorskip("transformers")
    from engine.training.export_lm import export_lm

    source = checkpoint(tmp_path, model_type)
    gguf = gguf_checkpoint.write(source, tmp_path / "tiny.gguf")
    torch_out = run(export_lm(source, tmp_path / "torch", quantize))
    gguf_out = run(export_gguf(gguf, tmp_path / "gguf", quantize))
    assert len(torch_out) == len(gguf_out) == 1 + 2 * 2  # logits, then each layer's keys and values
    assert torch_out[0].shape == gguf_out[0].shape
    assert np.abs(torch_out[0]).max() > 0.01  # logits that say something: a wrong tensor would show
    for a, b in zip(torch_out, gguf_out, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    a_cfg = json.loads((tmp_path / "torch" / "config.json").read_text())
    b_cfg = json.loads((tmp_path / "gguf" / "config.json").read_text())
    for key in ("vocab_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "eos_token_id"):
        assert b_cfg[key] == a_cfg[key], key
    from engine.denoisers.loading import load_model

    a_info, b_info = (load_model(tmp_path / d).denoiser.info for d in ("torch", "gguf"))
    assert b_info == a_info  # the same special tokens, mask row and limits, as the engine reads them
    assert b_cfg["diffusion_lsp"]["export_version"] == a_cfg["diffusion_lsp"]["export_version"]
    conversion = b_cfg["diffusion_lsp"]["conversion"]
    assert conversion["seconds"] > 0 and conversion["peak_rss_mb"] > 0


def test_a_llama_read_without_its_permutation_undone_differs(tmp_path: Path) -> None:
    """The q and k rows really are permuted in a Llama file (so the test above checks the
    undoing): read as a Qwen2 file, the same tensors differ from the checkpoint's."""
    from safetensors.numpy import load_file

    source = checkpoint(tmp_path, "llama")
    gguf = gguf_checkpoint.write(source, tmp_path / "tiny.gguf")
    weights = load_file(str(source / "model.safetensors"))
    reader = GGUFSource(gguf)
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(reader.tensor("blk.0.attn_q.weight"), q)
    assert not np.array_equal(reader._tensors["blk.0.attn_q.weight"].data, q)  # as stored: permuted


QUANTIZED = ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "F16", "BF16"]


@pytest.mark.parametrize("kind", QUANTIZED)
def test_each_type_is_dequantized_as_transformers_reads_it(tmp_path: Path, kind: str) -> None:
    """A tensor stored in `kind` reads as transformers' own GGUF reader reads it, and near
    the float values it was made from."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import gguf
    from transformers.integrations.gguf.dequant import GGML_BLOCK, dequantize

    source = checkpoint(tmp_path, "qwen2")
    qtype = gguf.GGMLQuantizationType[kind]
    name = "blk.1.ffn_up.weight"
    path = gguf_checkpoint.write(source, tmp_path / "q.gguf", types={name: qtype})
    got = GGUFSource(path).tensor(name)
    raw = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    package = gguf.quants.dequantize(raw.data, qtype)  # the gguf package's own reader
    np.testing.assert_array_equal(got, package.reshape(got.shape))
    if int(qtype) in GGML_BLOCK:  # a block type: transformers' reader too (its own code, in torch)
        flat = torch.from_numpy(np.ascontiguousarray(raw.data).reshape(-1))
        theirs = dequantize(flat, int(qtype)).numpy()
        np.testing.assert_allclose(got, theirs.reshape(got.shape), atol=1e-6)
    from safetensors.numpy import load_file

    original = load_file(str(source / "model.safetensors"))["model.layers.1.mlp.up_proj.weight"]
    assert got.shape == original.shape
    tolerance = {"Q4_0": 0.05, "Q4_1": 0.05, "Q5_0": 0.03, "Q5_1": 0.03}.get(kind, 0.01)
    assert 0 < np.abs(got - original).max() < tolerance  # stored in fewer bits, read back near


def test_the_tokenizer_is_the_one_the_checkpoint_has(tmp_path: Path) -> None:
    """tokenizer.json built from the GGUF lists encodes as the checkpoint's own tokenizer
    and as transformers' GGUF tokenizer, special tokens whole."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    source = checkpoint(tmp_path, "qwen2")
    path = gguf_checkpoint.write(source, tmp_path / "tiny.gguf")
    ours = GGUFSource(path).tokenizer()
    original = Tokenizer.from_file(str(source / "tokenizer.json"))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    texts = [
        "def add(a, b):\n    return a + b\n",
        "class Point:\n\tdef __init__(self, x, y):  # é ü 数字\n        self.x = x\n",
        "<|fim_prefix|>for i in range(10):<|fim_suffix|>\n<|fim_middle|>",
    ]
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == original.encode(text, add_special_tokens=False).ids
        assert ids == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids, skip_special_tokens=False) == original.decode(ids, skip_special_tokens=False)
    assert ours.token_to_id("<|fim_middle|>") == original.token_to_id("<|fim_middle|>")
    assert len(ours.encode("<|fim_middle|>", add_special_tokens=False).ids) == 1


def test_a_sentencepiece_llama_file_is_exported_and_fills_what_its_weights_say(tmp_path: Path) -> None:
    """tests/real_engine.py's tiny Llama GGUF (a sentencepiece vocabulary, every row a token):
    exported without torch, a mask row added past the vocabulary, and the fill its weights
    make (x has the highest logit whatever the prompt)."""
    from engine.denoisers.loading import load_model
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine
    from tests.real_engine import write_gguf

    gguf = write_gguf(tmp_path / "tiny-llama.gguf")
    out = export_gguf(gguf, tmp_path / "export", "int8")
    model = load_model(out)
    cfg = json.loads((out / "config.json").read_text())
    assert model.backend == "onnx" and cfg["mask_token_id"] == cfg["vocab_size"] - 1 == model.tokenizer.vocab_size
    fill = local_engine(model, FillOptions(canvas_tokens=5)).fill(InfillRequest(prefix="a = ", suffix="\n"))
    assert fill.text == "xxxxx"


def sentencepiece_gguf(path: Path) -> Path:
    """A GGUF whose tokenizer is a sentencepiece BPE as Llama 2's files have it: <unk>, <s>,
    </s>, the 256 byte tokens, then pieces learned on a little code ("\u2581" for a space),
    each scored by when it was learned; no merges listed."""
    import gguf
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from tests.dream_checkpoint import TEXT

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    learner.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    pieces = sorted(learner.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [p for p, _ in pieces if p not in tokens]
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, *[gguf.TokenType.BYTE] * 256]
    kinds += [gguf.TokenType.NORMAL] * (len(tokens) - len(kinds))
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(kinds)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    gguf_checkpoint.finish(w)
    return path


def test_a_sentencepiece_tokenizer_is_transformers_llama_tokenizer(tmp_path: Path) -> None:
    """The sentencepiece vocabulary of a Llama 2 style file, its merges derived from the
    scores, encodes (and decodes) as transformers' GGUF tokenizer does; characters the
    pieces lack fall back to byte tokens."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    path = sentencepiece_gguf(tmp_path / "spm.gguf")
    ours = GGUFSource(path).tokenizer()
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    texts = [
        "def add(a, b):\n    return a + b\n",
        "class Point:\n    def __init__(self, x, y):\n        self.x = x  # é 数\n",
        "  for i in range(10):\tprint(i)",
    ]
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert len(ids) < len(text)  # merged pieces, not bytes
        assert ours.decode(ids) == theirs.decode(ids)
    assert any(t.startswith("<0x") for t in ours.encode("é", add_special_tokens=False).tokens)  # byte fallback


def test_files_it_cannot_read_are_refused_clearly(tmp_path: Path) -> None:
    import gguf

    (tmp_path / "not.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EngineError, match="not a GGUF file"):
        GGUFSource(tmp_path / "not.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    gguf_checkpoint.finish(w)
    with pytest.raises(EngineError, match="holds a 'phi3' model"):
        GGUFSource(tmp_path / "phi.gguf")
    code = main(["export-onnx", "--model", str(tmp_path / "phi.gguf"), "--out", str(tmp_path / "out")])
    assert code != 0 and not (tmp_path / "out" / "config.json").exists()


def without_torch(tmp: Path) -> dict[str, str]:
    """An environment in which `import torch` and `import transformers` fail, in every
    process started with it (the language server the client starts too): packages of those
    names that raise ImportError, first on PYTHONPATH."""
    for name in ("torch", "transformers"):
        package = tmp / "blocked" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f'raise ImportError("{name} is not installed in this environment")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "blocked"), str(ROOT)])}


def test_it_exports_loads_and_serves_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    """The base install's promise: a GGUF file exported, loaded and served by the language
    server (through the quick start's client) with no torch to import anywhere."""
    source = checkpoint(tmp_path, "qwen2")
    gguf = gguf_checkpoint.write(source, tmp_path / "tiny.gguf", pre="qwen2")
    env, out = without_torch(tmp_path), tmp_path / "export"

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    assert "torch is not installed" in python("-c", "import torch").stderr  # the environment is as it says
    done = python("-m", "engine.commands.cli", "export-onnx", "--model", str(gguf), "--out", str(out))
    assert done.returncode == 0 and done.stdout.strip() == str(out), done.stderr
    assert json.loads((out / "config.json").read_text())["diffusion_lsp"]["conversion"]["tool"] == "gguf"
    # the language server, started by the client with the same environment, fills from it
    from lsp_server.client import StdioClient

    sample = ROOT / "fixtures" / "code" / "inventory.py"
    client = StdioClient([sys.executable, "-m", "lsp_server", "--model", str(out)], env=env)
    try:
        client.initialize({}, root=sample.parent)
        client.open(sample.as_uri(), sample.read_text(encoding="utf-8"))
        client.inline_completion(sample.as_uri(), 26, 0)  # what a random model writes may be refused: not asserted
        stats = client.request("workspace/executeCommand", {"command": "diffusion.stats", "arguments": []})
    finally:
        assert client.close() == 0
    assert stats["model_loaded"] and stats["load_error"] is None, stats
    assert str(out) in stats["model"] and "onnx" in stats["model"] and stats["engine_calls"] >= 1, stats
