"""The local generator: raw candidates from a Denoiser, and the decoding loops it runs."""
