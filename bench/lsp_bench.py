"""What the benchmarks that drive `diffusion-lsp` over stdio share (bench/server_bench.py,
bench/typing_bench.py): the server started and initialized as VS Code does it, with inline
completion advertised, and its peak memory."""

from __future__ import annotations

import sys
from pathlib import Path

from lsprotocol import types
from pytest_lsp import client_capabilities
from pytest_lsp.client import LanguageClient, make_test_lsp_client


async def start_server(settings: dict[str, object], folders: list[Path] | None = None) -> LanguageClient:
    """`python -m lsp_server` over stdio, initialized with `settings` (the diffusionLsp
    section), VS Code's capabilities plus inline completion, and `folders` as the
    workspace folders."""
    client = make_test_lsp_client()
    await client.start_io(sys.executable, "-m", "lsp_server")
    caps = client_capabilities("visual_studio_code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    workspace = [types.WorkspaceFolder(uri=f.resolve().as_uri(), name=f.name) for f in folders or []]
    await client.initialize_session(
        types.InitializeParams(
            capabilities=caps,
            initialization_options={"diffusionLsp": settings},
            workspace_folders=workspace or None,
        )
    )
    return client


def peak_rss_mb(client: LanguageClient) -> float | None:
    """The server process's peak resident memory (VmHWM), in MB; None when unknown."""
    pid = getattr(getattr(client, "_server", None), "pid", None)
    if not pid:
        return None
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return round(int(row.split()[1]) / 1024, 1)
    return None
