"""The dual objective (every computed token supervised), the autoregressive mode of the
same weights, and training state that carries over runs."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.decoding import SamplerConfig
from engine.denoisers.loading import load_model
from engine.local.one_token import run_autoregressive, sequence_logprob
from engine.local.steering import Steering
from engine.models.embedded import DiffusionCoder, ModelConfig
from engine.models.tokenizer import train_tokenizer
from engine.training.loop import (
    Example,
    TrainConfig,
    TrainState,
    collate,
    load_state,
    loss_terms,
    lr_at,
    make_batch,
    save_state,
    text_sampler,
    train,
)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    p.read_text(encoding="utf-8") for p in sorted((ROOT / "fixtures").rglob("*.py")) if "typing" not in p.parts
]  # typing/: held out


def tiny_model(vocab: int = 300, seed: int = 0) -> DiffusionCoder:
    torch.manual_seed(seed)
    return DiffusionCoder(ModelConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()


def empty(m: DiffusionCoder) -> tuple[torch.Tensor, torch.Tensor]:
    return m.empty_cache()


@torch.no_grad()
def test_the_canvas_never_sees_the_middle_stream() -> None:
    m = tiny_model()
    ctx = torch.tensor([[0, 0, 3, 11, 12, 4, 13, 14, 5]])
    canvas = torch.tensor([[2, 2, 9, 2, 2]])
    mid_valid = torch.tensor([[True, True, True, False]])
    a = m.forward_dual(ctx, ctx != 0, canvas, torch.tensor([[20, 21, 22, 0]]), mid_valid).canvas
    b = m.forward_dual(ctx, ctx != 0, canvas, torch.tensor([[30, 31, 32, 0]]), mid_valid).canvas
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # ... and it is exactly the inference path: encode the context, denoise the canvas
    k, v = m.encode(ctx[:, 2:], *empty(m))
    torch.testing.assert_close(a, m.denoise(canvas, k, v), rtol=0, atol=1e-5)


@torch.no_grad()
def test_the_middle_stream_is_the_autoregressive_mode_of_encode() -> None:
    """Next-token logits of the middle in the training pass equal those of decoding the
    context and then the middle one token at a time through encode."""
    m = tiny_model()
    ctx = torch.tensor([[0, 0, 3, 11, 12, 4, 13, 14, 5]])
    mid = torch.tensor([[20, 21, 22, 0]])
    select = torch.zeros(1, 9 + 5 + 4, dtype=torch.bool)
    select[0, 8] = True  # the middle marker predicts the first middle token
    select[0, 14:17] = True  # the middle's tokens predict the next one / end-of-fill
    ar = m.forward_dual(ctx, ctx != 0, torch.full((1, 5), 2), mid, mid != 0, select).ar
    stream = torch.tensor([[3, 11, 12, 4, 13, 14, 5, 20, 21, 22]])
    _, _, logits = m.encode(stream, *empty(m), torch.tensor(6))
    assert ar is not None
    torch.testing.assert_close(ar, logits[0], rtol=0, atol=1e-5)
    # a token of the middle is never seen by positions before it
    ar2 = m.forward_dual(ctx, ctx != 0, torch.full((1, 5), 2), torch.tensor([[20, 21, 23, 0]]), mid != 0, select).ar
    assert ar2 is not None
    torch.testing.assert_close(ar2[:3], ar[:3], rtol=0, atol=1e-6)
    assert not torch.allclose(ar2[3], ar[3])


def test_collate_aligns_every_next_token_target() -> None:
    tok = train_tokenizer(TEXTS, 300)
    sp = tok.special
    ex = Example(context=[sp.suffix, 40, 41, sp.prefix, 42, sp.middle], middle=[50, 51])
    b = collate(tok, [ex], ctx_len=8, canvas_len=4)
    assert b.ctx[0].tolist() == [sp.pad, sp.pad, *ex.context]
    assert b.target[0].tolist() == [50, 51, sp.eof, sp.pad]
    assert b.mid[0].tolist() == [50, 51, sp.pad] and b.mid_valid[0].tolist() == [True, True, False]
    ar = b.ar_targets[0].tolist()
    stream = [*ex.context, 50, 51, sp.eof]
    assert ar[:2] == [-100, -100]  # padding
    assert ar[2:8] == stream[1:7]  # each context token predicts the next; the marker predicts 50
    assert ar[8:12] == [-100] * 4  # the canvas has its own loss
    assert ar[12:15] == [51, sp.eof, -100]  # the middle predicts the rest, then end-of-fill


def test_empty_middle_teaches_end_of_fill_at_once() -> None:
    tok = train_tokenizer(TEXTS, 300)
    sp = tok.special
    b = collate(tok, [Example(context=[sp.suffix, sp.prefix, 40, sp.middle], middle=[])], ctx_len=4, canvas_len=3)
    assert b.ar_targets[0, 3].item() == sp.eof
    assert b.target[0].tolist() == [sp.eof, sp.pad, sp.pad]
    assert not b.mid_valid.any()


def test_batches_keep_each_group_on_its_canvas() -> None:
    tok = train_tokenizer(TEXTS, 300)
    cfg = TrainConfig(
        context_tokens=64, canvas_tokens=12, long_canvas_tokens=40, long_max_middle_chars=200, batch_size=3
    )
    rng = random.Random(0)
    draw = text_sampler(TEXTS, rng)
    shapes = {make_batch(tok, draw, cfg, rng).target.shape[1] for _ in range(30)}
    assert shapes == {12, 40}


def test_the_dual_loss_supervises_the_context() -> None:
    tok = train_tokenizer(TEXTS, 300)
    cfg = TrainConfig(context_tokens=48, canvas_tokens=12, batch_size=2, ar_loss_weight=1.0)
    batch = make_batch(tok, text_sampler(TEXTS, random.Random(1)), cfg, random.Random(1))
    m = tiny_model(tok.vocab_size)
    canvas, ar, _ = loss_terms(m, batch, tok, cfg, torch.Generator().manual_seed(0))
    assert ar is not None and torch.isfinite(ar) and torch.isfinite(canvas)
    only_canvas, none, _ = loss_terms(
        m, batch, tok, TrainConfig(**{**cfg.__dict__, "ar_loss_weight": 0.0}), torch.Generator().manual_seed(0)
    )
    assert none is None
    torch.testing.assert_close(only_canvas, canvas)


def test_wsd_schedule_is_constant_then_cools_down_to_zero() -> None:
    cfg = TrainConfig(lr=1e-3, warmup=10, schedule="wsd")
    assert lr_at(cfg, 5, 0.0, "stable") == pytest.approx(5e-4)
    assert lr_at(cfg, 10, 0.3, "stable") == lr_at(cfg, 100_000, 0.9, "stable") == pytest.approx(1e-3)
    assert lr_at(cfg, 500, 0.25, "cooldown") == pytest.approx(5e-4)
    assert lr_at(cfg, 500, 1.0, "cooldown") == 0.0


def test_training_state_carries_over_runs(tmp_path: Path) -> None:
    """A run stopped after 4 steps and continued from its saved state goes on with the
    same weights, optimizer moments (stored in bfloat16) and counters."""
    tok = train_tokenizer(TEXTS, 300)
    base = {
        "context_tokens": 48,
        "canvas_tokens": 12,
        "batch_size": 2,
        "lr": 1e-3,
        "warmup": 2,
        "schedule": "wsd",
        "ar_loss_weight": 1.0,
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64},
        "threads": 1,
    }
    seen: list[TrainState] = []
    cfg4 = TrainConfig(**{**base, "steps": 4})  # type: ignore[arg-type]
    _, s1 = train(cfg4, tok, TEXTS, [], on_checkpoint=lambda st: (save_state(tmp_path, st, tok, cfg4), seen.append(st)))
    live = seen[-1]
    assert live.step == 4 and s1["steps"] == 4
    cfg8 = TrainConfig(**{**base, "steps": 8})  # type: ignore[arg-type]
    state, tok2 = load_state(tmp_path, cfg8)
    assert state.step == 4 and state.tokens == s1["tokens_seen"] and tok2.vocab_size == tok.vocab_size
    for (name, p), (_, q) in zip(live.model.named_parameters(), state.model.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)  # float32 weights, exactly
        a, b = live.opt.state[p], state.opt.state[q]
        assert float(a["step"]) == float(b["step"]) == 4.0
        for moment in ("exp_avg", "exp_avg_sq"):  # bfloat16: 3 significant digits
            torch.testing.assert_close(b[moment], a[moment], rtol=1e-2, atol=1e-12, msg=name)
    _, s2 = train(cfg8, tok2, TEXTS, [], state=state)
    assert s2["steps"] == 8 and s2["run_steps"] == 4 and len(state.runs) == 2
    assert state.tokens > s1["tokens_seen"]
    # a cool-down never writes the trunk
    writes: list[int] = []
    cool = TrainConfig(**{**base, "steps": 8, "cooldown_s": 0.5})  # type: ignore[arg-type]
    train(cool, tok2, TEXTS, [], state=state, phase="cooldown", on_checkpoint=lambda st: writes.append(st.step))
    assert writes == []


@pytest.fixture(scope="module")
def both(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    return load_model(tiny_model_dir, backend="onnx"), load_model(tiny_model_dir, backend="torch")


def test_both_backends_offer_the_autoregressive_mode(both) -> None:  # type: ignore[no-untyped-def]
    onnx_m, torch_m = both
    assert onnx_m.denoiser.info.autoregressive and torch_m.denoiser.info.autoregressive
    ids = onnx_m.tokenizer.encode("def total(self):\n    return self.price")
    s1, s2 = onnx_m.denoiser.prefill(ids), torch_m.denoiser.prefill(ids)
    np.testing.assert_allclose(onnx_m.denoiser.next_logits(s1), torch_m.denoiser.next_logits(s2).numpy(), atol=1e-4)
    g1, l1 = onnx_m.denoiser.extend(s1, [7, 8, 9])
    g2, l2 = torch_m.denoiser.extend(s2, [7, 8, 9])
    np.testing.assert_allclose(l1, l2.numpy(), atol=1e-4)
    # extending equals encoding the longer context from scratch
    np.testing.assert_allclose(
        onnx_m.denoiser.next_logits(onnx_m.denoiser.prefill([*ids, 7, 8, 9])),
        onnx_m.denoiser.next_logits(g1),
        atol=1e-4,
    )
    # a cached state reused for a shorter context gives that context's logits, not the longer one's
    shorter = onnx_m.denoiser.prefill(ids[:-2], g1)
    np.testing.assert_allclose(
        onnx_m.denoiser.next_logits(shorter), onnx_m.denoiser.next_logits(onnx_m.denoiser.prefill(ids[:-2])), atol=1e-4
    )


def test_autoregressive_decoding_is_greedy_argmax_and_scores_itself(both) -> None:  # type: ignore[no-untyped-def]
    onnx_m, torch_m = both
    ids = onnx_m.tokenizer.encode("def total(self):\n    return self.price")
    fills = []
    for m in both:
        den = m.denoiser
        st = den.prefill(ids)
        res = run_autoregressive(den, st, 6, SamplerConfig(strategy="autoregressive"), den.random_source(0))
        fills.append(res.tokens[0].tolist())
    assert fills[0] == fills[1]
    den = onnx_m.denoiser
    st = den.prefill(ids)
    toks = fills[0]
    # each decoded token is the argmax of the model given everything before it
    prefix: list[int] = []
    for t in toks:
        if t in (den.info.eof_id, den.info.pad_id):
            break
        logits = den.next_logits(den.prefill([*ids, *prefix]))
        masked = np.where(np.isin(np.arange(len(logits)), [*den.info.suppress_ids, den.info.mask_id]), -1e30, logits)
        assert int(np.argmax(masked)) == t
        prefix.append(t)
    # the teacher-forced likelihood equals the sum of the step-by-step log-probabilities
    lp, n = sequence_logprob(den, st, prefix, den.info.eof_id)
    want = 0.0
    for i, t in enumerate([*prefix, den.info.eof_id]):
        logits = den.next_logits(den.prefill([*ids, *prefix[:i]])).astype(np.float64)
        want += float(logits[t] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
    assert n == len(prefix) + 1
    assert lp == pytest.approx(want, abs=1e-3)


class SureItEnds:
    """An Autoregressive fake whose next token is always end-of-fill, then 7, 8, 9..."""

    def __init__(self) -> None:
        from engine.denoisers.base import DenoiserInfo

        self.info = DenoiserInfo(
            vocab_size=16, regime="absorbing", eof_id=1, pad_id=0, mask_id=2, max_positions=64, autoregressive=True
        )

    def _logits(self, n: int) -> np.ndarray:
        out = np.zeros(16, dtype=np.float32)
        out[1], out[0], out[7 + n % 5] = 9.0, 8.0, 5.0
        return out

    def next_logits(self, state):  # type: ignore[no-untyped-def]
        return self._logits(len(state.token_ids))

    def extend(self, state, new_ids):  # type: ignore[no-untyped-def]
        from engine.denoisers.base import EncodedContext

        ids = (*state.token_ids, *new_ids)
        return EncodedContext(ids, None), np.stack(
            [self._logits(len(state.token_ids) + i + 1) for i in range(len(new_ids))]
        )

    def as_array(self, values):  # type: ignore[no-untyped-def]
        return np.asarray(values)


def test_min_tokens_bars_an_early_end_in_the_autoregressive_mode() -> None:
    from engine.denoisers.base import EncodedContext
    from engine.denoisers.onnx import NumpyRandomSource

    den = SureItEnds()
    st = EncodedContext((3, 4), None)
    got = {}
    for k in (0, 1, 3):
        cfg = SamplerConfig(strategy="autoregressive", min_tokens=k)
        got[k] = run_autoregressive(den, st, 6, cfg, NumpyRandomSource(0)).tokens[0].tolist()
    assert got[0] == [1, 0, 0, 0, 0, 0]  # the model's own choice: an empty fill
    assert got[1] == [9, 1, 0, 0, 0, 0]  # one token (7 + 2 % 5), then it ends at once
    assert got[3] == [9, 10, 11, 1, 0, 0]


def test_infill_in_the_autoregressive_mode(both) -> None:  # type: ignore[no-untyped-def]
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine

    onnx_m, _ = both
    cfg = SamplerConfig(strategy="autoregressive", max_steps=8)
    engine = local_engine(onnx_m, FillOptions(canvas_tokens=8, sampler=cfg))
    r = engine.fill(InfillRequest(prefix="def f(x):\n    return x", suffix="\n"))
    first = r.candidates[0]
    ended = len(first.token_ids) < 8
    assert r.steps == len(first.token_ids) + int(ended)  # one position per token, end-of-fill included


def test_alternatives_are_ranked_by_likelihood(both) -> None:  # type: ignore[no-untyped-def]
    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine

    engine = local_engine(both[0], FillOptions(canvas_tokens=8))
    many = engine.fill(InfillRequest(prefix="def f(x):\n    return x", suffix="\n", candidates=8))
    alternatives = many.candidates[1:]
    assert len(alternatives) >= 3  # sampled from a random model: distinct
    scores = [k.logprob for k in alternatives]
    assert all(s is not None for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]


def test_a_model_trained_without_the_next_token_loss_has_no_autoregressive_mode(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    from engine.fill import FillOptions, InfillRequest
    from engine.local.generator import local_engine

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    cfg = json.loads((plain / "config.json").read_text())
    cfg["autoregressive"] = False
    (plain / "config.json").write_text(json.dumps(cfg))
    for backend in ("onnx", "torch"):
        m = load_model(plain, backend=backend)
        assert not m.denoiser.info.autoregressive
        options = FillOptions(canvas_tokens=6, sampler=SamplerConfig(strategy="autoregressive"))
        r = local_engine(m, options).fill(InfillRequest(prefix="x = ", suffix="\n"))
        assert any("no autoregressive mode" in w for w in r.warnings)  # left to right on the canvas instead
        assert all(k.logprob is None for k in r.candidates)


class NeverEnds(SureItEnds):
    """Its next token is never end-of-fill: 7, 8, 9, 10, 11, 7, ..."""

    def _logits(self, n: int) -> np.ndarray:
        out = np.zeros(16, dtype=np.float32)
        out[7 + n % 5] = 9.0
        return out


def test_a_row_ends_after_a_stop_token_in_the_autoregressive_mode() -> None:
    from engine.denoisers.base import EncodedContext
    from engine.denoisers.onnx import NumpyRandomSource

    den, st, cfg = NeverEnds(), EncodedContext((3, 4), None), SamplerConfig(strategy="autoregressive")
    free = run_autoregressive(den, st, 6, cfg, NumpyRandomSource(0))
    assert free.tokens[0].tolist() == [9, 10, 11, 7, 8, 9]  # runs to the canvas's length
    stopped = run_autoregressive(den, st, 6, cfg, NumpyRandomSource(0), steer=Steering(stop_after=frozenset({11})))
    assert stopped.tokens[0].tolist() == [9, 10, 11, 0, 0, 0]  # the stop token kept, nothing after
    assert stopped.steps == 3


def test_one_line_spans_stop_the_autoregressive_mode_at_a_line_break(both, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import engine.local.generator as infill
    from engine.fill import FillOptions, InfillRequest

    seen: list[frozenset[int]] = []
    real = infill.run_autoregressive

    def spy(*args, **kw):  # type: ignore[no-untyped-def]
        seen.append(kw["steer"].stop_after)
        return real(*args, **kw)

    monkeypatch.setattr(infill, "run_autoregressive", spy)
    cfg = SamplerConfig(strategy="autoregressive", max_steps=8)
    engine = infill.local_engine(both[0], FillOptions(sampler=cfg))
    engine.fill(InfillRequest(prefix="x = compute(", suffix=")\nprint(x)\n", language="python"))
    engine.fill(InfillRequest(prefix="def f(x):\n    ", suffix="\n\nprint(f(1))\n", language="python"))
    line, body = seen
    tok = both[0].tokenizer
    assert line and all("\n" in tok.decode([i]) for i in line)
    assert tok.encode("\n")[0] in line
    assert body == frozenset()  # a block body may run to several lines


def test_a_fitted_canvas_row_never_sees_past_its_end() -> None:
    """A row whose canvas is cut to its fill: what lies past its length changes nothing."""
    m = tiny_model()
    ctx = torch.tensor([[0, 0, 3, 11, 12, 4, 13, 14, 5]])
    valid = torch.tensor([[True, True, True, False, False]])
    a = m.forward_dual(ctx, ctx != 0, torch.tensor([[2, 9, 2, 7, 7]]), canvas_valid=valid).canvas
    b = m.forward_dual(ctx, ctx != 0, torch.tensor([[2, 9, 2, 8, 1]]), canvas_valid=valid).canvas
    torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=1e-6)
    # ... and equals denoising a canvas of that length
    k, v = m.encode(ctx[:, 2:], *empty(m))
    torch.testing.assert_close(a[:, :3], m.denoise(torch.tensor([[2, 9, 2]]), k, v), rtol=0, atol=1e-5)


def test_fitted_canvases_and_the_length_loss() -> None:
    tok = train_tokenizer(TEXTS, 300)
    cfg = TrainConfig(
        context_tokens=48, canvas_tokens=12, batch_size=8, ar_loss_weight=1.0, fit_canvas_share=1.0, fit_canvas_slack=2
    )
    batch = make_batch(tok, text_sampler(TEXTS, random.Random(1)), cfg, random.Random(1))
    lens = batch.canvas_valid.sum(dim=1)
    n_mid = batch.mid_valid.sum(dim=1)
    assert ((lens >= n_mid + 1) & (lens <= torch.clamp(n_mid + 3, max=12))).all()
    m = DiffusionCoder(
        ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64, length_classes=12)
    )
    terms = loss_terms(m, batch, tok, cfg, torch.Generator().manual_seed(0))
    assert terms.length is not None
    # the head starts from zero: a uniform guess over its classes
    torch.testing.assert_close(terms.length, torch.tensor(12.0).log())
    # it learns as a probe: its loss moves the head, never the trunk the next-token mode reads
    assert m.length_head is not None
    torch.nn.init.normal_(m.length_head.weight)
    m.zero_grad()
    loss_terms(m, batch, tok, cfg, torch.Generator().manual_seed(0)).length.backward()  # type: ignore[union-attr]
    assert m.length_head.weight.grad is not None and m.length_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None or not p.grad.any() for n, p in m.named_parameters() if not n.startswith("length_head"))
