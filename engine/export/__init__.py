"""Exports for the base install that need no torch: the `onnx_lm` graph written from a GGUF
file's tensors (numpy, onnx, the gguf package), and the quantization both exporters share."""
