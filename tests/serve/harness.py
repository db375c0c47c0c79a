"""The fill server for tests: in this process (uvicorn on a thread, on 127.0.0.1 and an
ephemeral port) or as the real command (`diffusion-infill serve --port 0`, a subprocess),
and a scripted generator whose fills take known steps, for the queue tests."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402

from engine.candidate import Candidate  # noqa: E402
from engine.fill import Engine, FillLimits, InfillResult, Job  # noqa: E402
from fill_server.app import Server, create_app  # noqa: E402
from fill_server.auth import ApiKey  # noqa: E402
from fill_server.config import ServeConfig  # noqa: E402
from fill_server.main import bind  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
START_S = 60.0  # the longest a server may take to listen and load the shipped model


@dataclass
class Running:
    url: str
    server: Server  # the app's shared state: scheduler, metrics

    def metric(self, name: str) -> float:
        """The value of one unlabelled sample (or labelled: `name{...}` as rendered)."""
        return read_metric(self.server.metrics.render(), name)


def read_metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextmanager
def running(
    loader: Callable[[], Engine], config: ServeConfig | None = None, key: ApiKey | None = None, wait: bool = True
) -> Iterator[Running]:
    """The app under uvicorn on a thread; waits for the model unless `wait` is False."""
    config = config or ServeConfig(port=0)
    app = create_app(config, loader, key)
    sock = bind("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=30))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server: Server = app.state.server
    end = time.monotonic() + START_S
    while not uv.started or (wait and server.scheduler.state == "loading"):
        assert time.monotonic() < end and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield Running(url, server)
    finally:
        uv.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextmanager
def command(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`diffusion-infill serve --port 0 ARGS` as a subprocess: (its URL once healthy, the process)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.commands.cli", "serve", "--port", "0", *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"listening on (http://\S+)", line)
        assert found, f"no address in {line!r}"
        url = found.group(1)
        end = time.monotonic() + START_S
        while httpx.get(url + "/health").status_code != 200:
            assert time.monotonic() < end and proc.poll() is None, "the model did not load"
            time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()  # our own child, by its handle
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Scripted:
    """A generator behind the real engine frame: each fill takes one step per budget token
    (`step_s` each, checking cancel between), writes "x" per step, and waits at `gate`
    (when set) before its first step, so a test can keep the worker busy."""

    languages = None
    takes_extra_files = False
    tokenizer = None

    def __init__(self, step_s: float = 0.005, gate: threading.Event | None = None) -> None:
        self.step_s, self.gate = step_s, gate
        self.limits = FillLimits(default=8, longest=None, hard=None)
        self.prefixes: list[str] = []  # the fills that started, by prefix
        self.steps = 0

    def count_tokens(self, text: str) -> int:
        return len(text)

    def generate(self, job: Job) -> InfillResult:
        self.prefixes.append(job.request.prefix)
        if self.gate is not None:
            assert self.gate.wait(timeout=30)
        control, text = job.control, ""
        for step in range(1, job.budget + 1):
            if control.cancel is not None and control.cancel():
                return InfillResult([Candidate(text, [], [])], steps=step - 1, stop_reason="cancelled")
            time.sleep(self.step_s)
            self.steps += 1
            text += "x"
            if control.on_draft is not None:
                control.on_draft(step, [text])
        return InfillResult([Candidate(text, [], [])], steps=job.budget)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def scripted(gen: Scripted) -> Callable[[], Engine]:
    return lambda: Engine(gen)  # type: ignore[arg-type]


def fill_body(prefix: str = "a = ", **extra: Any) -> dict[str, Any]:
    return {"prompt": prefix, "suffix": "\n", **extra}
