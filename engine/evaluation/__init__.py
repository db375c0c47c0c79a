"""Evaluation: measuring a model directory, none of which the language server imports
(tests/unit/test_layout.py checks).

    heldout    infill tasks cut from held-out files, valid/exact/non-empty rates (`diffusion-infill eval`)
    passk      pass@k by executing unit tests on single-line infills
    benchmark  fill latency and memory of the engine (`diffusion-infill bench`)
    cli        the `bench` and `eval` commands (engine/commands/cli.py parses them)
"""
