"""diffusion-lsp's engine: code infill with bidirectional diffusion language models.

    from engine import InfillRequest, load_model, local_engine

    engine = local_engine(load_model())          # the shipped model, onnxruntime
    result = engine.fill(InfillRequest(prefix="def add(a, b):\\n    return ", suffix="\\n"))
    print(result.text, result.steps)

`Engine` (engine.fill) frames every fill the same way over a generator of raw candidates:
the local model (`local_engine`) or an inference server (`engine.remote.generator.remote_engine`).
The engine speaks text and token ids only; it knows nothing of LSP.
"""

from engine.candidate import Candidate
from engine.decoding import SamplerConfig
from engine.denoisers.loading import LoadedModel, load_model
from engine.errors import EngineError, InputError, ModelLoadError
from engine.fill import Engine, FillControl, FillOptions, InfillRequest, InfillResult
from engine.local.generator import LocalGenerator, local_engine

__all__ = [
    "Candidate",
    "Engine",
    "EngineError",
    "FillControl",
    "FillOptions",
    "InfillRequest",
    "InfillResult",
    "InputError",
    "LoadedModel",
    "LocalGenerator",
    "ModelLoadError",
    "SamplerConfig",
    "load_model",
    "local_engine",
]
