"""Opening an engine: the one place that decides where fills come from.

`open_engine(source, options)` is called by the language server, every CLI command and
`serve`, so that all of them pick the same model from the same settings on the same
machine. The policy, in order:

1. a remote endpoint (`EngineSource.remote`): fills from that inference server;
2. the model directory the user named (`EngineSource.model`): its errors are theirs to see;
3. with no model named, and the backend and quantization at their defaults: the models
   folder's best model measured on this machine within the deadline (`diffusion-infill
   models`; engine.models.folder.default_model); if it no longer loads, the shipped one;
4. else the shipped model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.denoisers.loading import load_model
from engine.errors import EngineError
from engine.fill import Engine, FillOptions
from engine.local.generator import local_engine
from engine.models.folder import default_model
from engine.models.table import AUTO as AUTO_BACKEND
from engine.models.table import NO_QUANTIZATION
from engine.remote.generator import RemoteConfig, remote_engine

log = logging.getLogger(__name__)

# a fill stops denoising this long after it starts (the server's deadlineMs default), and the
# models folder offers only a model whose keystroke fill fits it
DEFAULT_DEADLINE_MS = 2000


@dataclass(frozen=True)
class EngineSource:
    """Where fills come from, as the user said it (the server's settings, the CLI's flags)."""

    model: Path | None = None  # a model directory; None: the models folder's best, else the shipped model
    backend: str = AUTO_BACKEND
    device: str = "cpu"
    quantization: str = NO_QUANTIZATION
    deadline_ms: int = DEFAULT_DEADLINE_MS  # what the models folder's choice must fit
    remote: RemoteConfig | None = None  # an inference server instead of a local model


@dataclass(frozen=True)
class OpenedEngine:
    engine: Engine
    where: str  # where its fills come from (the model directory and backend, or the endpoint), for the log


def open_engine(source: EngineSource, options: FillOptions | None = None) -> OpenedEngine:
    """The engine `source` names (module docstring: the policy). Raises EngineError when
    the model the user named does not load."""
    if source.remote is not None:
        cfg = source.remote
        return OpenedEngine(remote_engine(cfg, options), f"{cfg.endpoint} ({cfg.dialect})")
    path, why = model_choice(source)
    try:
        model = load_model(path, source.backend, source.device, source.quantization)
    except EngineError as exc:
        if not why:  # the model the user named: its error is theirs to see
            raise
        # a model the folder offered that no longer loads here: the shipped one instead
        log.warning("%s did not load (%s); using the shipped model", path, exc)
        model, why = load_model(None, source.backend, source.device, source.quantization), ""
    return OpenedEngine(local_engine(model, options), f"{model.path} ({model.backend} backend{why})")


def model_choice(source: EngineSource) -> tuple[Path | None, str]:
    """(the model directory, why it was chosen; "" when the user named it or it is the
    shipped model, None)."""
    if source.model is not None:
        return source.model, ""
    if source.backend != AUTO_BACKEND or source.quantization != NO_QUANTIZATION:
        return None, ""
    chosen = default_model(source.deadline_ms, source.device)
    if chosen is None or chosen.timing is None:
        return None, ""
    ms = chosen.timing.keystroke_p50_ms
    return chosen.path, f"; the models folder's best here: {ms:.0f} ms a keystroke, within {source.deadline_ms} ms"
