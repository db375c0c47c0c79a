"""diffusion-lsp's engine: code infill with bidirectional diffusion language models.

    from engine import InfillEngine, InfillRequest, load_model

    engine = InfillEngine(load_model())          # the shipped model, onnxruntime
    result = engine.fill(InfillRequest(prefix="def add(a, b):\\n    return ", suffix="\\n"))
    print(result.text, result.steps)

The engine speaks text and token ids only; it knows nothing of LSP.
"""

from engine.candidate import Candidate
from engine.errors import EngineError, InputError, ModelLoadError
from engine.infill import InfillEngine, InfillRequest, InfillResult
from engine.modeldir import LoadedModel, load_model
from engine.sampler import SamplerConfig

__all__ = [
    "Candidate",
    "EngineError",
    "InfillEngine",
    "InfillRequest",
    "InfillResult",
    "InputError",
    "LoadedModel",
    "ModelLoadError",
    "SamplerConfig",
    "load_model",
]
