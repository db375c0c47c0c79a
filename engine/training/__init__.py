"""Training: everything that makes a model directory, none of which the language server
imports (tests/unit/test_layout.py checks).

    corpus     the licence-clean corpus builder (`python -m engine.training.corpus build`)
    tasks      the infill task kinds and the training mix, cut from source files
    loop       batches (the dual objective), the training loop, resumable state
    pipeline   corpus -> tokenizer -> model -> model directory (`diffusion-infill train`)
    save       writing a model directory (engine/models/directory.py reads one)
    export     the ONNX graphs of a trained model
    device     the one-shot training run on an accelerator machine
    budget     the time budget of such a run (bench/device.py's too)
    cli        the `train` and `export-onnx` commands (engine/commands/cli.py parses them)
"""
