"""Growing a trained trunk deeper without losing what it learnt (function-preserving).

A recipe whose model has more layers than the saved TrainState inserts new blocks, each a
copy of an existing block whose two output projections (attention ``out`` and MLP
``down``) are zero: a zero-output block adds nothing to the residual stream, so the grown
model computes exactly the function of the old one, and training goes on from there
(progressive stacking, as in Gong et al. 2019 and the "zero-init" growth of Shen et al.
2022). The old blocks keep their weights and AdamW moments; the new ones start with
fresh moments, and the learning rate warms up again from the step of the growth, so the
first updates of the new blocks are not full-size steps on uncalibrated moments.

Only depth grows. Width, heads, vocabulary and positions must match the state: changing
them would not preserve the function.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict

import torch

from engine.models.embedded import Block, DiffusionCoder, ModelConfig
from engine.training.loop import TrainConfig, TrainState, new_optimizer, training_device

log = logging.getLogger(__name__)


def insertion_sources(old: int, new: int) -> list[int]:
    """For each layer of the grown model, the old layer it starts as; a repeated index is a
    zero-output copy placed right after its source. Copies are spread evenly over the
    depth (6 -> 9 copies layers 1, 3 and 5; 3 -> 5 copies 0 and 2)."""
    if new < old:
        raise ValueError(f"a trunk cannot shrink: {old} layers saved, the recipe asks for {new}")
    copies = [0] * old
    for i in range(new - old):
        copies[min(old - 1, ((2 * i + 1) * old) // (2 * (new - old)))] += 1
    return [src for src in range(old) for _ in range(1 + copies[src])]


def grow_model(model: DiffusionCoder, n_layers: int) -> tuple[DiffusionCoder, list[int]]:
    """A deeper copy of `model` computing the same function, and the source of each layer."""
    cfg = model.cfg
    sources = insertion_sources(cfg.n_layers, n_layers)
    grown = DiffusionCoder(ModelConfig(**{**asdict(cfg), "n_layers": n_layers}))
    grown.embed.load_state_dict(model.embed.state_dict())
    grown.norm.load_state_dict(model.norm.state_dict())
    seen: set[int] = set()
    for j, src in enumerate(sources):
        block = grown.layers[j]
        assert isinstance(block, Block)
        block.load_state_dict(model.layers[src].state_dict())
        if src in seen:  # a copy: silent until it learns something of its own
            with torch.no_grad():
                block.out.weight.zero_()
                block.down.weight.zero_()
        seen.add(src)
    return grown.to(next(model.parameters()).device), sources


def add_length_head(state: TrainState, classes: int) -> TrainState:
    """The TrainState with a length head of `classes` outputs added, from zero (the
    trunk's function and moments unchanged; the head's moments start fresh)."""
    have = state.model.cfg.length_classes
    if classes == have:
        return state
    if have:
        raise ValueError(f"the recipe's length_classes={classes} differs from the saved trunk's {have}")
    state.model.add_length_head(classes)
    head = state.model.length_head
    assert head is not None
    group = {k: v for k, v in state.opt.param_groups[0].items() if k != "params"}
    state.opt.add_param_group({"params": list(head.parameters()), **group})
    log.info("added a length head of %d classes at step %d (from zero)", classes, state.step)
    runs = [*state.runs, {"phase": "length_head", "added_at": state.step, "classes": classes}]
    return TrainState(state.model, state.opt, state.step, state.tokens, state.seconds, state.curve, runs)


def grow_state(state: TrainState, cfg: TrainConfig) -> TrainState:
    """The TrainState with its model grown to the recipe's depth (unchanged if equal).

    Old blocks keep their optimizer moments and step counters; copies start fresh.
    ``state.runs`` records the growth (``grown_at``), which restarts the warm-up."""
    want = dict(cfg.model)
    have = state.model.cfg
    for key, value in want.items():
        if key not in ("n_layers", "length_classes") and getattr(have, key) != value:
            raise ValueError(f"the recipe's model {key}={value} differs from the saved trunk's {getattr(have, key)}")
    state = add_length_head(state, int(want.get("length_classes", have.length_classes)))
    have = state.model.cfg
    n_layers = int(want.get("n_layers", have.n_layers))
    if n_layers == have.n_layers:
        return state
    old_model = state.model
    grown, sources = grow_model(old_model, n_layers)
    device = training_device(cfg.device)
    opt = new_optimizer(grown, cfg, device.type == "cuda")
    old_params = dict(old_model.named_parameters())
    seen: set[int] = set()
    moved = 0
    for j, src in enumerate(sources):
        if src not in seen:
            for name, param in grown.layers[j].named_parameters():
                old = old_params[f"layers.{src}.{name}"]
                if old in state.opt.state:
                    opt.state[param] = copy.deepcopy(state.opt.state[old])
                    moved += 1
        seen.add(src)
    for prefix in ("embed", "norm"):
        for name, param in getattr(grown, prefix).named_parameters():
            old = old_params[f"{prefix}.{name}"]
            if old in state.opt.state:
                opt.state[param] = copy.deepcopy(state.opt.state[old])
                moved += 1
    log.info(
        "grew the trunk from %d to %d layers at step %d (layer sources %s; %d tensors keep their moments)",
        have.n_layers,
        n_layers,
        state.step,
        sources,
        moved,
    )
    runs = [*state.runs, {"phase": "grow", "grown_at": state.step, "from_layers": have.n_layers, "to_layers": n_layers}]
    return TrainState(grown, opt, state.step, state.tokens, state.seconds, state.curve, runs)
