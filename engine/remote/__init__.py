"""The remote generator: whole fills from an inference server, one object per dialect."""
