"""diffusion-infill pull against a Hub on the loopback address: a real HTTP server that
speaks the part of the Hugging Face Hub API huggingface_hub uses to list and download a
repo, serving a tiny checkpoint the test writes. Nothing here reaches the network."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from engine.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]
REPO = "test-org/tiny-dream"
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a commit hash: 40 hex digits
WEIGHTS = "model.safetensors"


# -- the checkpoint --------------------------------------------------------------------


def tokenizer_json() -> bytes:
    """A small but real tokenizer.json (a word-level vocabulary of five tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(
        models.WordLevel({"<unk>": 0, "<|endoftext|>": 1, "def": 2, "return": 3, "x": 4}, unk_token="<unk>")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode()


def safetensors_bytes(n: int = 20_000) -> bytes:
    """A real safetensors file of two float32 tensors (about 4n bytes)."""
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    return save(
        {"embed.weight": rng.standard_normal((n // 10, 10), dtype=np.float32), "norm.weight": np.ones(10, np.float32)}
    )


def checkpoint(model_type: str = "Dream", *, safetensors: bool = True) -> dict[str, bytes]:
    """What a Dream repo holds: the files to pull, and files that must stay on the Hub."""
    files = {
        "config.json": json.dumps({"model_type": model_type, "vocab_size": 5, "eos_token_id": 1}).encode(),
        "tokenizer.json": tokenizer_json(),
        "README.md": b"# tiny-dream\nA checkpoint for tests.\n",
        "LICENSE": b"Apache License 2.0\n",
        # never pulled: pickles, code, git metadata, files in folders
        "pytorch_model.bin": b"\x80\x04\x95pickled weights: never load me" * 100,
        "modeling_dream.py": b"import os\nos.system('echo remote code')\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "original/consolidated.safetensors": safetensors_bytes(100),
    }
    if safetensors:
        files[WEIGHTS] = safetensors_bytes()
    return files


PULLED = {"config.json", "tokenizer.json", "README.md", "LICENSE", WEIGHTS}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


# -- the Hub ---------------------------------------------------------------------------


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = COMMIT
    token: str | None = None  # gated: downloads need `Authorization: Bearer <token>`
    revisions: tuple[str, ...] = ("main",)
    listed_sha256: dict[str, str] = field(default_factory=dict)  # a listing that lies about a file's hash

    def is_lfs(self, name: str) -> bool:
        return name.endswith((".safetensors", ".bin", ".gguf"))

    def etag(self, name: str) -> str:
        data = self.files[name]
        return sha256(data) if self.is_lfs(name) else git_blob_id(data)

    def sibling(self, name: str) -> dict[str, Any]:
        data = self.files[name]
        entry: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"size": len(data), "sha256": self.listed_sha256.get(name, sha256(data)), "pointerSize": 134}
        return entry

    def tree_entry(self, name: str) -> dict[str, Any]:
        data = self.files[name]
        entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"size": len(data), "oid": sha256(data), "pointerSize": 134}
        return entry


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    """The Hub's model API and file resolver for a few repos, with a log of every request
    and switches for the failures a real network has."""

    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    fail: dict[str, str] = field(default_factory=dict)  # file name -> "500" (once) | "drop" (once) | "stall"
    on_weights: Any = None  # called when a GET of a .safetensors file arrives
    released: threading.Event = field(default_factory=threading.Event)  # ends stalls
    url: str = ""

    def gets(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    def downloads(self) -> set[str]:
        """Files whose content was sent (a GET of the resolver)."""
        return {
            r.path.split("/resolve/", 1)[1].split("/", 1)[1]
            for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path
        }


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self.handle_request(body=False)

    def do_GET(self) -> None:
        self.handle_request(body=True)

    def handle_request(self, body: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path = unquote(url.path)
        hub.requests.append(Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            self.model_info(m.group(1), m.group(2) or "main", parse_qs(url.query))
        elif m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
            self.tree(m.group(1), m.group(2))
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            self.resolve(m.group(1), m.group(2), m.group(3), body)
        else:
            self.error(404, "")

    def error(self, status: int, code: str, message: str = "") -> None:
        data = json.dumps({"error": message or code or "not found"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def json(self, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def find(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found")
            return None
        if revision not in (*repo.revisions, repo.commit):
            self.error(404, "RevisionNotFound", "Invalid rev id")
            return None
        return repo

    def model_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        if repo := self.find(repo_id, revision):
            blobs = query.get("blobs", [""])[0].lower() == "true"
            siblings = [repo.sibling(n) if blobs else {"rfilename": n} for n in repo.files]
            self.json(
                {"id": repo_id, "sha": repo.commit, "private": False, "gated": bool(repo.token), "siblings": siblings}
            )

    def tree(self, repo_id: str, revision: str) -> None:
        if repo := self.find(repo_id, revision):
            self.json([repo.tree_entry(n) for n in repo.files])

    def resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        hub = self.server.hub
        repo = self.find(repo_id, revision)
        if repo is None:
            return
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self.error(401, "GatedRepo", "Access to model test-org/gated is restricted.")
            return
        if name not in repo.files:
            self.error(404, "EntryNotFound", "Entry not found")
            return
        data = repo.files[name]
        start = 0
        if body and (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))):
            start = int(m.group(1))
        failure = hub.fail.get(name) if body else None
        if failure == "500":
            del hub.fail[name]
            self.error(500, "", "Internal Error")
            return
        if body and name.endswith(".safetensors") and hub.on_weights is not None:
            hub.on_weights()
        self.send_response(206 if start else 200)
        self.send_header("ETag", f'"{repo.etag(name)}"')
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        if failure == "drop":  # half the file, then the connection breaks
            del hub.fail[name]
            self.wfile.write(data[start : start + (len(data) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if failure == "stall":  # a first part, then nothing until the test ends
            self.wfile.write(data[start : start + 1000])
            self.wfile.flush()
            hub.released.wait(60)
            self.close_connection = True
            return
        self.wfile.write(data[start:])


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.hub = hub
        hub.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    fake = FakeHub(repos={REPO: Repo(checkpoint())})
    server = HubServer(fake)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.released.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def models(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment of a pull from `hub`: HF_ENDPOINT names it, and no token, offline
    switch or cache of the user's own takes part. Returns the models folder to pass as --dir."""
    constants = pytest.importorskip("huggingface_hub.constants")
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads its environment once, at import; in a test process that imported it
    # earlier, these are what it read: set them as the environment above says
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    return tmp_path / "models"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["pull", "--ready", "none", *args])
    out, err = capsys.readouterr()
    return code, out, err


def pulled(dest: Path) -> dict[str, bytes]:
    """The checkpoint's files (huggingface_hub's bookkeeping in .cache left out)."""
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(dest).parts
    }


def partials(dest: Path) -> list[Path]:
    return sorted(dest.rglob("*.incomplete"))


def one_line(err: str) -> str:
    """A user error: one line, the last, and no traceback (lines before it say what the
    pull found)."""
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("diffusion-infill: error: ")]
    assert "Traceback" not in err and len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


# -- a pull ------------------------------------------------------------------------------


def test_pull_fetches_config_tokenizer_safetensors_and_texts_and_nothing_else(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, REPO, "--dir", str(models))
    assert code == 0, err
    dest = models / "test-org--tiny-dream"
    assert out == f"{dest}\n"  # --model "$(diffusion-infill pull ...)" works
    repo = hub.repos[REPO]
    assert pulled(dest) == {name: repo.files[name] for name in PULLED}  # names and bytes
    assert hub.downloads() == PULLED
    never = ("pytorch_model.bin", "modeling_dream.py", ".gitattributes", "original/")
    assert not [r.path for r in hub.requests if any(n in r.path for n in never)]  # not even asked about
    assert f"from {hub.url}" in err and "model_type Dream: Dream, Qwen2 or Llama" in err and "the dream backend" in err
    assert f"--model {dest}" in err


def test_pull_says_the_size_and_destination_before_the_weights_come(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    said: list[str] = []
    hub.on_weights = lambda: said.append(stderr.getvalue())
    assert main(["pull", REPO, "--dir", str(models), "--ready", "none"]) == 0, stderr.getvalue()
    total = sum(len(hub.repos[REPO].files[n]) for n in PULLED)
    assert 10_000 < total < 1_000_000  # so the size reads in kB
    line = f"{total / 1000:.1f} kB in 5 files into {models / 'test-org--tiny-dream'}"
    assert len(said) == 1 and line in said[0]


def test_the_hub_is_the_one_hf_endpoint_names(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = FakeHub(repos={REPO: Repo(checkpoint("qwen2"))})
    server = HubServer(other)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        os.environ["HF_ENDPOINT"] = other.url  # the fixture's monkeypatch restores it
        code, _, err = run(capsys, REPO, "--dir", str(models))
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err
    assert hub.requests == [] and other.downloads() == PULLED
    assert json.loads((models / "test-org--tiny-dream" / "config.json").read_text())["model_type"] == "qwen2"
    assert "diffusion-infill adapt" in err  # an autoregressive checkpoint: say how it becomes an infiller


def test_a_revision_gets_its_own_directory(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.repos[REPO].revisions = ("main", "v1")
    code, out, err = run(capsys, REPO, "--revision", "v1", "--dir", str(models))
    assert code == 0, err
    assert out == f"{models / 'test-org--tiny-dream@v1'}\n"
    assert [r.path for r in hub.requests][0] == f"/api/models/{REPO}/revision/v1"
    # the files come from the commit the revision named when the pull began
    assert all(f"/resolve/{COMMIT}/" in r.path for r in hub.requests if "/resolve/" in r.path)


def test_pulling_again_fetches_nothing_new(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, REPO, "--dir", str(models))[0] == 0
    hub.requests.clear()
    code, out, err = run(capsys, REPO, "--dir", str(models))
    assert code == 0, err
    assert hub.downloads() == {"config.json"}  # read again for the check; the checkpoint's files are kept
    assert out == f"{models / 'test-org--tiny-dream'}\n"


# -- what is refused ---------------------------------------------------------------------


def test_an_unsupported_model_type_is_refused_before_any_weights(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.repos[REPO] = Repo(checkpoint("bert"))
    code, out, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and out == ""
    assert "model_type 'bert'" in one_line(err) and "Dream" in err and "diffusion_gemma" in err and "--force" in err
    assert hub.downloads() == {"config.json"}
    assert not models.exists()  # nothing lands before the check

    code, _, err = run(capsys, REPO, "--dir", str(models), "--force")
    assert code == 0, err
    assert set(pulled(models / "test-org--tiny-dream")) == PULLED


def test_a_repo_without_safetensors_is_refused(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.repos[REPO] = Repo(checkpoint(safetensors=False))  # a .bin, and safetensors only in a folder
    code, out, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and out == ""
    assert "has no safetensors or GGUF weights" in one_line(err) and ".bin" in err
    assert hub.downloads() == set() and not models.exists()


@pytest.mark.parametrize(
    "repo_id", ["tiny-dream", "a/b/c", "x./y", "a b/c", "owner/na--me", "owner/name.git", "https://huggingface.co/a/b"]
)
def test_a_malformed_repo_id_is_refused_without_asking_the_hub(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], repo_id: str
) -> None:
    code, _, err = run(capsys, repo_id, "--dir", str(models))
    assert code == 2 and "is not a Hub model id: give owner/name" in one_line(err)
    assert hub.requests == []


# -- what goes wrong ---------------------------------------------------------------------


def test_a_missing_repo_is_one_clear_line(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "test-org/missing", "--dir", str(models))
    assert code == 2 and out == ""
    assert err == f"diffusion-infill: error: no model test-org/missing at {hub.url} (a private repo needs HF_TOKEN)\n"


def test_a_missing_revision_is_one_clear_line(hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, REPO, "--revision", "v9", "--dir", str(models))
    assert code == 2 and f"{REPO} has no revision 'v9'" in one_line(err)


def test_a_gated_repo_needs_hf_token(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos["test-org/gated"] = Repo(checkpoint(), token="hf_test_token")
    code, _, err = run(capsys, "test-org/gated", "--dir", str(models))
    assert code == 2 and "test-org/gated is gated" in one_line(err) and "HF_TOKEN" in err

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    code, _, err = run(capsys, "test-org/gated", "--dir", str(models))
    assert code == 0, err
    assert set(pulled(models / "test-org--gated")) == PULLED
    assert {r.headers.get("authorization") for r in hub.requests if "/resolve/" in r.path} >= {"Bearer hf_test_token"}


def test_an_unreachable_hub_is_one_clear_line(
    models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    code, out, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and out == ""
    assert f"cannot reach {closed}" in one_line(err)


def test_too_little_disk_space_is_said_before_the_weights(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from engine.commands import pull

    monkeypatch.setattr(pull.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**12, used=10**12, free=999))
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and "not enough disk space" in one_line(err) and "999 B free" in err
    assert hub.downloads() == {"config.json"}


def test_a_full_disk_and_other_errors_are_explained() -> None:
    pytest.importorskip("huggingface_hub")
    import errno

    from engine.commands.pull import explain

    full = OSError(errno.ENOSPC, "No space left on device", "/m/model.safetensors")
    assert (
        explain(full, REPO, None, "http://hub")
        == "the disk is full: free some space, then run the same command again to resume"
    )
    denied = OSError(errno.EACCES, "Permission denied", "/m")
    assert explain(denied, REPO, None, "http://hub") == "cannot write /m: Permission denied"
    assert explain(RuntimeError("a bug"), REPO, None, "http://hub") is None  # a bug stays a bug


def test_hf_hub_offline_forbids_the_pull(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 at import sets
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and "HF_HUB_OFFLINE is set" in one_line(err)
    assert hub.requests == []


def test_without_huggingface_hub_the_command_says_what_to_install(
    models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and "pull needs huggingface_hub: pip install huggingface_hub" in one_line(err)


# -- resuming ----------------------------------------------------------------------------


def test_a_failed_pull_resumes_with_the_files_it_has(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.fail[WEIGHTS] = "500"  # the weights fail once, after the small files came
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 2 and "run the same command again to resume" in one_line(err)
    dest = models / "test-org--tiny-dream"
    assert set(pulled(dest)) == PULLED - {WEIGHTS} and partials(dest) == []

    hub.requests.clear()
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 0, err
    assert hub.downloads() == {"config.json", WEIGHTS}  # config.json read again for the check, in a temporary folder
    assert "still to fetch" in err
    assert sha256(pulled(dest)[WEIGHTS]) == sha256(hub.repos[REPO].files[WEIGHTS])


def test_a_partial_file_left_by_a_killed_pull_does_not_spoil_the_weights(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub._local_folder import get_local_download_paths

    weights = hub.repos[REPO].files[WEIGHTS]
    dest = models / "test-org--tiny-dream"
    stale = get_local_download_paths(dest, WEIGHTS).incomplete_path(sha256(weights))  # where a download writes
    stale.write_bytes(weights[: len(weights) // 2])
    os.utime(stale, (time.time() - 3600,) * 2)  # an hour old: its pull is gone
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 0, err
    assert sha256((dest / WEIGHTS).read_bytes()) == sha256(weights)
    assert partials(dest) == []  # used or removed


def test_a_dropped_connection_is_resumed_where_it_broke(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    files = checkpoint()
    files[WEIGHTS] = safetensors_bytes(int(2.4 * constants.DOWNLOAD_CHUNK_SIZE) // 4)  # 2.4 chunks of the download
    hub.repos[REPO] = Repo(files)
    hub.fail[WEIGHTS] = "drop"  # half the bytes, then the connection breaks
    code, _, err = run(capsys, REPO, "--dir", str(models))
    assert code == 0, err
    ranges = [r.headers.get("range") for r in hub.gets(WEIGHTS)]
    assert ranges == [None, f"bytes={constants.DOWNLOAD_CHUNK_SIZE}-"]  # the second asks for the rest
    assert sha256((models / "test-org--tiny-dream" / WEIGHTS).read_bytes()) == sha256(files[WEIGHTS])


# -- in a process of its own -------------------------------------------------------------


def child_env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE_")) and k != "TRANSFORMERS_OFFLINE"
    }
    return {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}


IMPORT_PROBE = (
    "import json, sys, engine.commands.cli; engine.commands.cli.build_parser(); print(json.dumps(sorted(sys.modules)))"
)


def test_importing_the_cli_contacts_no_hub(hub: FakeHub, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=ROOT,
        env=child_env(hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "engine.commands.pull" not in json.loads(proc.stdout)
    assert hub.requests == []


def test_a_fresh_process_pulls_from_hf_endpoint(hub: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"
    proc = subprocess.run(
        [sys.executable, "-m", "engine.commands.cli", "pull", REPO, "--dir", str(models), "--ready", "none"],
        cwd=ROOT, env=child_env(hub, tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{models / 'test-org--tiny-dream'}\n"
    assert set(pulled(models / "test-org--tiny-dream")) == PULLED


def test_ctrl_c_stops_a_pull_at_once(hub: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"
    asked = threading.Event()
    hub.on_weights = asked.set
    hub.fail[WEIGHTS] = "stall"  # the weights start, then hang until the test ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.commands.cli", "pull", REPO, "--dir", str(models), "--ready", "none"],
        cwd=ROOT, env=child_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert asked.wait(120), "the weights were never asked for"
        time.sleep(0.5)  # into the read
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # a hang guard: the stalled download never ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and out == ""
    assert "Traceback" not in err and err.splitlines()[-1].startswith("diffusion-infill: interrupted"), err
    dest = models / "test-org--tiny-dream"
    assert set(pulled(dest)) == PULLED - {WEIGHTS} and partials(dest) == []


# -- the pure parts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("config.json", True), ("generation_config.json", True), ("tokenizer.json", True),
        ("tokenizer_config.json", True), ("special_tokens_map.json", True), ("vocab.json", True),
        ("merges.txt", True), ("added_tokens.json", True), ("model.safetensors", True),
        ("model-00001-of-00004.safetensors", True), ("model.safetensors.index.json", True),
        ("README.md", True), ("LICENSE", True), ("LICENSE.txt", True), ("NOTICE", True), ("license.md", True),
        ("pytorch_model.bin", False), ("pytorch_model.bin.index.json", False), ("model.pt", False),
        ("model.pth", False), ("model.ckpt", False), ("optimizer.pkl", False), ("modeling_dream.py", False),
        ("tokenization_dream.py", False), ("LICENSE.py", False), (".gitattributes", False),
        ("original/model.safetensors", False), ("onnx/model.onnx", False), ("training_args.bin", False),
    ],
)  # fmt: skip
def test_which_files_are_pulled(name: str, wanted: bool) -> None:
    from engine.commands.pull import is_wanted

    assert is_wanted(name) is wanted


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (80_123, "80.1 kB"), (999_960, "1.0 MB"),
     (1_234_567, "1.2 MB"), (15_200_000_000, "15.2 GB"), (3 * 10**12, "3.0 TB")],
)  # fmt: skip
def test_sizes_read_as_the_hub_shows_them(n: int, text: str) -> None:
    from engine.commands.pull import human_size

    assert human_size(n) == text


@pytest.mark.parametrize(
    ("config", "force", "said"),
    [
        ({"model_type": "diffusion_gemma"}, False, "model_type diffusion_gemma: DiffusionGemma (DiffusionGemma 26B), the diffusion_gemma backend"),
        ({"model_type": "Dream"}, False, "Dream, Qwen2 or Llama (Dream-v0, DiffuCoder, Dream-Coder, DreamOn, Qwen2.5-Coder), the dream backend"),
        ({"model_type": "llama"}, False, "the dream backend; an autoregressive model: `diffusion-infill adapt` trains it"),
        ({"model_type": "llada"}, False, "LLaDA (LLaDA 8B Base and Instruct), the llada backend"),
        ({"model_type": "Fast_dLLM_Qwen"}, False, "Fast-dLLM v2 or SDAR (Fast-dLLM v2, SDAR), the block_causal backend"),
        ({"model_type": "sdar"}, False, "Fast-dLLM v2 or SDAR (Fast-dLLM v2, SDAR), the block_causal backend"),
        ({"model_type": "bert"}, False, "has model_type 'bert'; diffusion-lsp loads diffusion_gemma, Dream, dream, qwen2, llama, llada, Fast_dLLM_Qwen, sdar"),
        ({"model_type": "diffusion_coder"}, False, "has model_type 'diffusion_coder'"),  # what this project makes, never pulled
        ({}, False, "has no model_type in config.json"),
        (None, False, "has no config.json"),
        ({"model_type": "bert"}, True, "model_type 'bert': not one diffusion-lsp loads (pulled because of --force)"),
    ],
)  # fmt: skip
def test_which_checkpoints_are_supported(config: dict[str, Any] | None, force: bool, said: str) -> None:
    from engine.commands.pull import PullError, family

    try:
        text = family(config, REPO, force)
    except PullError as exc:
        text = str(exc)
        assert "--force pulls it anyway" in text
    assert said in text


def test_where_checkpoints_go(tmp_path: Path) -> None:
    from engine.commands.pull import checkpoint_dir, models_folder

    home = Path.home()
    assert models_folder(tmp_path, {"DIFFUSION_LSP_MODELS": "/elsewhere"}) == tmp_path
    assert models_folder(None, {"DIFFUSION_LSP_MODELS": "/m", "XDG_DATA_HOME": "/x"}) == Path("/m")
    assert models_folder(None, {"XDG_DATA_HOME": "/x"}) == Path("/x/diffusion-lsp/models")
    assert models_folder(None, {}) == home / ".local/share/diffusion-lsp/models"
    assert checkpoint_dir(Path("/m"), "Dream-org/Dream-v0", None) == Path("/m/Dream-org--Dream-v0")
    assert checkpoint_dir(Path("/m"), "Dream-org/Dream-v0", "main") == Path("/m/Dream-org--Dream-v0")
    assert checkpoint_dir(Path("/m"), "Dream-org/Dream-v0", "refs/pr/1") == Path("/m/Dream-org--Dream-v0@refs_pr_1")


# -- ready to use: exported and timed ------------------------------------------------------


def test_a_pulled_qwen2_is_exported_and_timed_for_the_server(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One command leaves a model the base install runs and the server can choose: the
    checkpoint (a real tiny random Qwen2), its 8-bit export beside it, and the export's
    fill times on this machine."""
    from engine.denoisers.loading import load_model
    from engine.export.graph import EXPORT_VERSION, export_version
    from engine.models.folder import default_model, machine_key, read_timing
    from tests import dream_checkpoint

    source = dream_checkpoint.write(tmp_path / "tiny-qwen2", "qwen2", autoregressive=True)
    hub.repos["test-org/tiny-qwen2"] = Repo({p.name: p.read_bytes() for p in source.iterdir() if p.is_file()})
    code, out, err = run_ready(capsys, "test-org/tiny-qwen2", "--dir", str(models))
    assert code == 0, err
    export = models / "test-org--tiny-qwen2-int8"
    assert out == f"{export}\n" and "exporting for the base install" in err and "timing it" in err
    assert "older version" not in err
    loaded = load_model(export)
    assert loaded.backend == "onnx"
    timing = read_timing(export, machine_key())
    assert timing is not None and timing.keystroke_p50_ms > 0
    chosen = default_model(10 * timing.keystroke_p50_ms + 1000, env={"DIFFUSION_LSP_MODELS": str(models)})
    assert chosen is not None and chosen.path == export
    # again: the export and its times are kept, nothing is redone
    code, out, err = run_ready(capsys, "test-org/tiny-qwen2", "--dir", str(models))
    assert code == 0 and out == f"{export}\n" and "exporting" not in err and "timing" not in err
    # an export of an older graph (no export_version written) is made again, and timed again
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["diffusion_lsp"].pop("export_version") == EXPORT_VERSION
    (export / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_ready(capsys, "test-org/tiny-qwen2", "--dir", str(models))
    assert code == 0 and out == f"{export}\n", err
    assert "exported by an older version" in err and "exporting for the base install" in err and "timing it" in err
    assert export_version(export) == EXPORT_VERSION and read_timing(export, machine_key()) is not None
    assert load_model(export).backend == "onnx"


def run_ready(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["pull", *args])  # --ready at its default
    out, err = capsys.readouterr()
    return code, out, err


def gguf_repo(tmp_path: Path) -> Repo:
    """A repo of GGUF files as a model's owners publish them (a tiny random Qwen2 here): one
    file per type, a model split over two files, a readme."""
    pytest.importorskip("torch")
    from tests import dream_checkpoint, gguf_checkpoint

    source = dream_checkpoint.write(tmp_path / "tiny-qwen2", "qwen2", autoregressive=True)
    data = gguf_checkpoint.write(gguf_checkpoint.perturbed(source), tmp_path / "tiny.gguf", pre="qwen2").read_bytes()
    files = {
        "README.md": b"# tiny-GGUF\n",
        "LICENSE": b"Apache License 2.0\n",
        "tiny-q8_0.gguf": data,
        "tiny-q4_k_m.gguf": data + b"\0" * 64,
        "tiny-f16-00001-of-00002.gguf": data[:1000],
        "tiny-f16-00002-of-00002.gguf": data[1000:],
    }
    return Repo(files)


def test_a_gguf_repo_gives_its_q8_0_file_exported_without_torch(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One command, no torch needed: the q8_0 file only, checked against the Hub's sha256,
    exported for the base install, timed, and the server's default."""
    from engine.denoisers.loading import load_model
    from engine.models.folder import default_model, machine_key, read_timing

    hub.repos["test-org/tiny-GGUF"] = gguf_repo(tmp_path)
    code, out, err = run_ready(capsys, "test-org/tiny-GGUF", "--dir", str(models))
    assert code == 0, err
    export = models / "test-org--tiny-GGUF-q8_0-int8"
    assert out == f"{export}\n" and "exporting tiny-q8_0.gguf" in err and "timing it" in err
    assert (
        hub.gets("tiny-q8_0.gguf") and not hub.gets("tiny-q4_k_m.gguf") and not hub.gets("tiny-f16-00001-of-00002.gguf")
    )
    assert sorted(p.name for p in (models / "test-org--tiny-GGUF").iterdir() if not p.name.startswith(".")) == [
        "LICENSE",
        "README.md",
        "tiny-q8_0.gguf",
    ]
    loaded = load_model(export)
    assert loaded.backend == "onnx"
    own = json.loads((export / "config.json").read_text())["diffusion_lsp"]
    assert own["source"]["gguf"] == "tiny-q8_0.gguf" and own["conversion"]["tool"] == "gguf"
    timing = read_timing(export, machine_key())
    assert timing is not None
    chosen = default_model(10 * timing.keystroke_p50_ms + 1000, env={"DIFFUSION_LSP_MODELS": str(models)})
    assert chosen is not None and chosen.path == export
    assert main(["models", "--dir", str(models), "--json"]) == 0  # what the conversion cost, as measured
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows[export.name]["conversion"]["peak_rss_mb"] > 0 and rows[export.name]["keystroke_p50_ms"] > 0
    # --ready none: the file itself, for llama.cpp
    code, out, err = run_ready(capsys, "test-org/tiny-GGUF", "--dir", str(models), "--ready", "none")
    assert code == 0 and out == f"{models / 'test-org--tiny-GGUF' / 'tiny-q8_0.gguf'}\n", err


def test_a_gguf_repo_without_the_type_or_with_a_wrong_hash_is_refused(
    hub: FakeHub, models: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    repo = gguf_repo(tmp_path)
    hub.repos["test-org/tiny-GGUF"] = repo
    code, out, err = run_ready(capsys, "test-org/tiny-GGUF", "--dir", str(models), "--quant", "q5_0")
    assert code == 2 and out == ""
    assert "has no q5_0 GGUF file; it has f16, q4_k_m, q8_0" in err and "--quant" in err
    code, out, err = run_ready(capsys, "test-org/tiny-GGUF", "--dir", str(models), "--quant", "f16")
    assert code == 2 and "split over several files" in err
    repo.listed_sha256["tiny-q8_0.gguf"] = "0" * 64
    code, out, err = run_ready(capsys, "test-org/tiny-GGUF", "--dir", str(models))
    assert code == 2 and "does not have the sha256 the Hub lists" in err
    assert not (models / "test-org--tiny-GGUF" / "tiny-q8_0.gguf").exists()
    assert not (models / "test-org--tiny-GGUF-q8_0-int8").exists()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("qwen2.5-coder-0.5b-instruct-q8_0.gguf", "q8_0"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "q4_k_m"),
        ("qwen2.5-coder-0.5b-instruct-fp16.gguf", "fp16"),
        ("Model.Q5_K_S.gguf", "q5_k_s"),
        ("qwen2.5-coder-32b-instruct-q8_0-00001-of-00009.gguf", "q8_0"),
        ("model-IQ4_XS.gguf", "iq4_xs"),
        ("model.gguf", None),
        ("q8_0-notes.txt", None),
    ],
)
def test_a_gguf_files_type_is_read_from_its_name(name: str, kind: str | None) -> None:
    from engine.commands.pull import gguf_type

    assert gguf_type(name) == kind
