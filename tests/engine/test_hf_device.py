"""`device: mps` for the transformers backends (engine/denoisers/hf_device.py), tested on
a machine without Apple's GPU: the choice and its dtype where MPS is there (faked), a clear
error before anything loads where it is not, through load_model, the command line and the
server's setting."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.denoisers import hf_device  # noqa: E402
from engine.denoisers.loading import load_model  # noqa: E402
from engine.errors import ModelLoadError  # noqa: E402
from tests import dream_checkpoint  # noqa: E402

NO_MPS = "this machine has no MPS device"


@pytest.fixture(scope="module")
def dream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dream_checkpoint.write(tmp_path_factory.mktemp("dev") / "tiny-dream")


@pytest.fixture
def without_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_device, "mps_reason", lambda: NO_MPS)


@pytest.fixture
def with_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_device, "mps_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_mps_is_refused_where_there_is_none_naming_the_reason(without_mps: None) -> None:
    with pytest.raises(ModelLoadError, match=f"device 'mps' requested for DIR, but {NO_MPS}: set device to cpu"):
        hf_device.resolve_device("mps", "DIR")


def test_this_machine_says_why_it_has_no_mps() -> None:
    reason = hf_device.mps_reason()
    if torch.backends.mps.is_available():
        pytest.skip("this machine has Apple's GPU")
    assert reason is not None and "MPS" in reason


def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch, with_mps: None) -> None:
    assert hf_device.resolve_device("auto", "DIR") == "mps"
    assert hf_device.resolve_device("mps", "DIR") == "mps"
    monkeypatch.setattr(hf_device, "mps_reason", lambda: NO_MPS)
    assert hf_device.resolve_device("auto", "DIR") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hf_device.resolve_device("auto", "DIR") == "cuda"


def test_unknown_and_absent_devices_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelLoadError, match="unknown device 'tpu'.*cuda:N or mps"):
        hf_device.resolve_device("tpu", "DIR")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        hf_device.resolve_device("cuda:0", "DIR")


@pytest.mark.parametrize(
    ("device", "stored", "bf16_ok", "want"),
    [
        ("mps", torch.bfloat16, True, torch.bfloat16),
        ("mps", torch.bfloat16, False, torch.float16),
        ("mps", torch.float16, True, torch.float16),
        ("cuda", torch.bfloat16, True, torch.bfloat16),
        ("cpu", torch.bfloat16, True, torch.float32),
    ],
)
def test_the_dtype_follows_what_the_hardware_allows(
    monkeypatch: pytest.MonkeyPatch, device: str, stored: torch.dtype, bf16_ok: bool, want: torch.dtype
) -> None:
    monkeypatch.setattr(hf_device, "mps_dtype", lambda: torch.bfloat16 if bf16_ok else torch.float16)
    assert hf_device.compute_dtype(device, stored) == want


def test_loading_on_mps_without_it_fails_before_reading_weights(
    dream_dir: Path, without_mps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import Qwen2ForCausalLM

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were read")

    monkeypatch.setattr(Qwen2ForCausalLM, "from_pretrained", never)
    for quantization in ("none", "4bit"):
        with pytest.raises(ModelLoadError, match=NO_MPS):
            load_model(dream_dir, device="mps", quantization=quantization)


def test_the_cli_and_the_server_pass_mps_and_report_the_error(
    dream_dir: Path, without_mps: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from engine.commands.cli import main
    from lsp_server.service import FillService
    from lsp_server.settings import parse_settings

    (tmp_path / "p.py").write_text("x = ")
    code = main(["fill", "--model", str(dream_dir), "--device", "mps", "--prefix-file", str(tmp_path / "p.py")])
    assert code != 0 and NO_MPS in capsys.readouterr().err
    settings, problems = parse_settings({"model": str(dream_dir), "device": "mps"})
    assert problems == []
    error = FillService().load(settings)
    assert error is not None and NO_MPS in error
