"""The real command (`diffusion-infill serve`, a subprocess on the shipped model) under 16
concurrent clients for a bounded time, twice: every request is answered 200 or refused
429 with Retry-After (none lost: the server counted as many as were sent; none hung:
every client thread finishes), and the server's memory is flat from one round to the
next. And the command's refusals: a bind beyond loopback without a key, an unset key
variable, the serve extra missing."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.commands import cli
from tests.serve.harness import ROOT, command, read_metric

CLIENTS = 16
ROUND_S = 3.0  # each round of load lasts this long
QUEUE = 4  # the server's --queue-size: 16 clients overflow it
MAX_GROWTH_MB = 25  # RSS from the end of one round to the end of the next
PROMPTS = [f"def f{i}(x):\n    return " for i in range(4)]  # few contexts: the engine's cache stays warm


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def load_round(url: str) -> tuple[collections.Counter[int], list[str], int]:
    """(statuses, problems, requests sent) of CLIENTS threads posting for ROUND_S seconds."""
    statuses: collections.Counter[int] = collections.Counter()
    problems: list[str] = []
    sent = [0]
    lock = threading.Lock()
    stop = time.monotonic() + ROUND_S

    def client(k: int) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop:
                body = {"prompt": PROMPTS[k % len(PROMPTS)], "suffix": "\n", "max_tokens": 16, "user": f"u{k}"}
                with lock:
                    sent[0] += 1
                try:
                    reply = http.post(url + "/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    with lock:
                        problems.append(f"client {k}: {exc!r}")
                    continue
                with lock:
                    statuses[reply.status_code] += 1
                    if reply.status_code == 429 and not reply.headers.get("retry-after", "").isdigit():
                        problems.append("a 429 without Retry-After")
                if reply.status_code == 429:
                    time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=ROUND_S + 40)
    hung = [t for t in threads if t.is_alive()]
    assert not hung, f"{len(hung)} clients hung"
    return statuses, problems, sent[0]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's RSS from /proc")
def test_sixteen_clients_every_request_answered_none_lost_memory_flat() -> None:
    with command("--queue-size", str(QUEUE)) as (url, proc):
        for prompt in PROMPTS:  # warm: the contexts are cached
            assert httpx.post(url + "/v1/completions", json={"prompt": prompt}, timeout=30).status_code == 200
        totals: collections.Counter[int] = collections.Counter()
        sizes = []
        for _ in range(2):
            statuses, problems, sent = load_round(url)
            assert problems == [] and sum(statuses.values()) == sent
            assert set(statuses) <= {200, 429} and statuses[200] > 0
            totals.update(statuses)
            sizes.append(rss_mb(proc.pid))
        assert totals[429] > 0  # 16 clients against 1 running + 4 queued: some were refused
        scrape = httpx.get(url + "/metrics").text
        counted = {
            s: read_metric(scrape, f'diffusion_serve_requests_total{{route="/v1/completions",status="{s}"}}')
            for s in (200, 429)
        }
        assert counted == {200: totals[200] + len(PROMPTS), 429: totals[429]}  # none lost
        assert sizes[1] - sizes[0] < MAX_GROWTH_MB, sizes


def test_a_bind_beyond_loopback_without_a_key_is_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engine.commands.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "--insecure-no-key" in out.stderr and "--api-key-env" in out.stderr


def test_an_unset_key_variable_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVE_TEST_NO_SUCH_KEY"}
    out = subprocess.run(
        [sys.executable, "-m", "engine.commands.cli", "serve", "--port", "0", "--api-key-env", "SERVE_TEST_NO_SUCH_KEY"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 2 and "SERVE_TEST_NO_SUCH_KEY" in out.stderr


def test_without_the_serve_extra_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None if name == "uvicorn" else real(name))
    assert cli.main(["serve", "--port", "0"]) == cli.EXIT_USAGE
    assert "pip install 'diffusion-lsp[serve]'" in capsys.readouterr().err


def test_a_served_request_with_the_key_from_the_environment() -> None:
    env = {**os.environ, "SERVE_TEST_KEY": "team-key"}
    with command("--api-key-env", "SERVE_TEST_KEY", "--served-model-name", "team-model", env=env) as (url, _):
        assert httpx.post(url + "/v1/completions", json={"prompt": "a"}, timeout=30).status_code == 401
        headers = {"Authorization": "Bearer team-key"}
        reply = httpx.post(url + "/v1/completions", json={"prompt": "a = "}, headers=headers, timeout=30)
        assert reply.status_code == 200 and reply.json()["model"] == "team-model"
