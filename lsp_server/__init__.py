"""diffusion-lsp's language server (pygls): thin handlers over the engine."""
