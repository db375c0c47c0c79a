"""The language server on an SDAR checkpoint directory in its own format (a tiny random
one): the same client and test as Fast-dLLM v2's (tests/lsp/test_block_causal_server.py),
another checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import block_checkpoint
from tests.lsp.test_block_causal_server import (  # noqa: F401  (the fixture and the test, run here on SDAR)
    client,
    test_inline_completion_comes_from_the_block_causal_backend,
)

pytest.importorskip("transformers")

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return block_checkpoint.write(tmp_path_factory.mktemp("sdar-server") / "tiny-sdar", "sdar")
