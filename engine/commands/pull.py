"""diffusion-infill pull: download a checkpoint the engine can run from the Hugging Face Hub
into the local models folder, only when the user runs this command.

Nothing else in diffusion-lsp downloads: the server, the editors and the other commands
read local directories only (engine/denoisers/loading.py). A pull, in order:

1. lists the repo's files with their sizes at the revision, and pins its commit;
2. keeps config.json, generation_config.json, the tokenizer files, the safetensors weights
   (and their index) and the licence and readme text; never pickles (.bin, .pt, .pth,
   .ckpt) or code (.py). A repo without safetensors but with GGUF files (the model's owners
   publish them: Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF) gives the one of `--quant`'s type
   (q8_0 by default). A repo with neither is refused;
3. reads config.json and checks that the model_type is one the engine loads (--force
   pulls another anyway); a GGUF file says its architecture in its header, read by the
   export;
4. says the size and the destination on stderr, and checks the free disk space;
5. downloads the files one by one with huggingface_hub (a progress bar each): files already
   complete are kept, so the same command again resumes an interrupted pull, and a dropped
   connection is resumed where it broke. The files come one at a time in this thread so
   that Ctrl-C stops at once (snapshot_download's thread pool waits for the files in flight);
6. checks every file arrived whole, and a GGUF file's sha256 against the Hub's listing;
7. for a Qwen2, Llama or Dream checkpoint, or a Qwen2 or Llama GGUF file, unless
   `--ready none`: exports it for the base install at 8 bits (`--ready int4`: 4) into
   `<dir>-int8` and times it on this machine, so that the language server, its `model`
   setting left empty, can choose it. A GGUF file needs no torch (engine/export/); a
   checkpoint does;
8. prints the directory to use on stdout (the export, where there is one):
   `--model "$(diffusion-infill pull REPO_ID)"` works.

The Hub is huggingface_hub's: HF_ENDPOINT chooses the server, HF_TOKEN authenticates (gated
and private repos), HF_HUB_OFFLINE forbids the download.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.models.folder import models_folder
from engine.models.table import EXPORTED, GGUF_ARCHITECTURES, PULLED, described

READY_TYPES = EXPORTED  # exported and timed after a pull (--ready): what export-onnx takes
GGUF_KIND = f"architecture {' or '.join(GGUF_ARCHITECTURES)} expected, exported without torch"

CONFIG_FILE = "config.json"
WEIGHTS_SUFFIX = ".safetensors"
# the files a checkpoint needs besides its weights, by exact name
CHECKPOINT_FILES = frozenset(
    {
        CONFIG_FILE,
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "README.md",
    }
)
GGUF_SUFFIX = ".gguf"
DEFAULT_GGUF_TYPE = "q8_0"  # the GGUF file pulled by default: 8 bits, as the export's own products
_GGUF_TYPE = re.compile(r"[-.]((?:i?q\d\w*?)|fp?16|bf16|fp?32)(?:-\d{5}-of-\d{5})?\.gguf$", re.IGNORECASE)
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
NOTICE_PREFIXES = ("LICENSE", "LICENCE", "NOTICE")  # licence texts: LICENSE, LICENSE.txt, NOTICE.md...
NOTICE_SUFFIXES = ("", ".txt", ".md")
STALE_PARTIAL_S = 600  # a partial download untouched this long is left over from a killed pull


_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"  # as the Hub: 1-96 characters, ends not . or -
_REPO_ID = re.compile(rf"({_REPO_PART})/({_REPO_PART})")


class PullError(EngineError):
    """A pull that cannot go on: the message says why and, where there is one, what to do."""


@dataclass(frozen=True)
class RemoteFile:
    name: str  # path in the repo
    size: int | None  # bytes; None when the server does not say
    sha256: str | None = None  # a large (LFS) file's, as the Hub lists it


@dataclass(frozen=True)
class Listing:
    """A repo's files at one commit."""

    repo_id: str
    commit: str  # what the downloads ask for: the commit hash, or the revision when the server gives none
    files: tuple[RemoteFile, ...]


# -- what to pull and where ------------------------------------------------------------


def parse_repo_id(text: str) -> str:
    """`owner/name` as the Hub spells it, or a PullError that shows the form."""
    m = _REPO_ID.fullmatch(text)
    if m is None or any(".." in part or "--" in part for part in m.groups()) or text.endswith(".git"):
        raise PullError(f"{text!r} is not a Hub model id: give owner/name, e.g. Dream-org/Dream-v0-Instruct-7B")
    return text


def checkpoint_dir(models: Path, repo_id: str, revision: str | None) -> Path:
    """`<models>/<owner>--<name>`, with `@<revision>` for a revision other than main."""
    name = repo_id.replace("/", "--")
    if revision and revision != "main":
        name += "@" + re.sub(r"[^A-Za-z0-9._-]", "_", revision)
    return models / name


def is_wanted(name: str) -> bool:
    """A file a checkpoint needs, at the top of the repo: never a pickle or code."""
    if "/" in name:
        return False
    if name in CHECKPOINT_FILES or name.endswith(WEIGHTS_SUFFIX):
        return True
    stem, dot, suffix = name.partition(".")
    return stem.upper().startswith(NOTICE_PREFIXES) and (dot + suffix).lower() in NOTICE_SUFFIXES


def choose_files(listing: Listing, quant: str = DEFAULT_GGUF_TYPE) -> list[RemoteFile]:
    """The files to pull, config and tokenizer first and the weights last: the safetensors
    weights, else the one GGUF file of type `quant` (`choose_gguf`); a repo with neither is
    refused."""
    chosen = [f for f in listing.files if is_wanted(f.name)]
    if not any(f.name.endswith(WEIGHTS_SUFFIX) for f in chosen):
        ggufs = [f for f in listing.files if f.name.endswith(GGUF_SUFFIX) and "/" not in f.name]
        if ggufs:
            return [*sorted(chosen, key=lambda f: f.name), choose_gguf(listing.repo_id, ggufs, quant)]
        others = sorted({Path(f.name).suffix for f in listing.files if Path(f.name).suffix in (".bin", ".pt", ".pth")})
        found = f" (it has {', '.join(others)} weights, which are pickles and never loaded)" if others else ""
        raise PullError(f"{listing.repo_id} has no safetensors or GGUF weights{found}: nothing diffusion-lsp can load")
    return sorted(chosen, key=lambda f: (f.name.endswith(WEIGHTS_SUFFIX), f.name))


def gguf_type(name: str) -> str | None:
    """The quantization type a GGUF file's name ends with (`...-q8_0.gguf` -> q8_0), in lower case."""
    m = _GGUF_TYPE.search(name)
    return m.group(1).lower() if m else None


def choose_gguf(repo_id: str, files: Sequence[RemoteFile], quant: str) -> RemoteFile:
    """The one GGUF file of type `quant`; a PullError that lists the types there when there
    is none, and refuses a model split over several files."""
    matching = [f for f in files if gguf_type(f.name) == quant.lower()]
    if not matching:
        types = sorted({t for f in files if (t := gguf_type(f.name))})
        raise PullError(
            f"{repo_id} has no {quant} GGUF file; it has {', '.join(types) or 'none of a known type'} "
            "(choose one with --quant)"
        )
    whole = [f for f in matching if not _SPLIT.search(f.name)]
    if not whole:
        raise PullError(f"{repo_id}'s {quant} model is split over several files, which the export does not read yet")
    return min(whole, key=lambda f: len(f.name))


def family(config: Mapping[str, Any] | None, repo_id: str, force: bool) -> str:
    """What the checkpoint is for the engine, from its config.json (None: it has none);
    PullError for a model_type the engine does not load, unless forced."""
    model_type = config.get("model_type") if config is not None else None
    if isinstance(model_type, str) and model_type in PULLED:
        return f"model_type {model_type}: {described(model_type)}"
    known = ", ".join(PULLED)
    if config is None:
        what = f"no {CONFIG_FILE}"
    else:
        what = f"model_type {model_type!r}" if model_type is not None else f"no model_type in {CONFIG_FILE}"
    if force:
        return f"{what}: not one diffusion-lsp loads (pulled because of --force)"
    raise PullError(f"{repo_id} has {what}; diffusion-lsp loads {known} (--force pulls it anyway)")


def human_size(n: int) -> str:
    """Bytes as the Hub shows them: 1.2 GB, 640.0 kB, 87 B (powers of 1000)."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB"):
        value /= 1000
        if value < 999.95:  # what rounds to 1000.0 is shown in the next unit
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.1f} TB"


def describe(files: list[RemoteFile]) -> str:
    """`1.2 GB in 5 files`; sizes a server leaves out are said to be unknown."""
    total = human_size(sum(f.size or 0 for f in files))
    unknown = sum(f.size is None for f in files)
    count = f"{len(files)} file" + ("s" if len(files) != 1 else "")
    return f"{'at least ' if unknown else ''}{total} in {count}" + (f" ({unknown} of unknown size)" if unknown else "")


def is_complete(dest: Path, f: RemoteFile) -> bool:
    path = dest / f.name
    return path.is_file() and (f.size is None or path.stat().st_size == f.size)


def check_disk_space(dest: Path, need: int) -> None:
    """PullError when the disk that will hold `dest` has less than `need` bytes free."""
    where = dest
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # cannot tell: the download says so if the disk fills
    if need > free:
        raise PullError(f"not enough disk space: {human_size(need)} to download, {human_size(free)} free in {where}")


def remove_stale_partials(dest: Path, now: float | None = None) -> int:
    """Delete partial downloads a killed pull left in huggingface_hub's folder (a pull that
    stops on an error or Ctrl-C deletes its own); returns how many."""
    now = time.time() if now is None else now
    removed = 0
    for path in (dest / ".cache" / "huggingface" / "download").glob("**/*.incomplete"):
        try:
            if now - path.stat().st_mtime > STALE_PARTIAL_S:
                path.unlink()
                removed += 1
        except OSError:
            pass  # another pull's, or gone already
    return removed


# -- the Hub ---------------------------------------------------------------------------


def require_hub() -> None:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:  # a base-install dependency: only a broken install lacks it
        raise PullError("pull needs huggingface_hub: pip install huggingface_hub") from None


def hub_endpoint() -> str:
    """The Hub huggingface_hub talks to: HF_ENDPOINT, read now (the library reads it once,
    at import), else the library's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def list_files(repo_id: str, revision: str | None, endpoint: str) -> Listing:
    """The repo's files with their sizes, and the commit the revision points at."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    if info.siblings is None:
        raise PullError(f"{endpoint} listed no files for {repo_id}")
    files = tuple(RemoteFile(s.rfilename, s.size, getattr(s.lfs, "sha256", None)) for s in info.siblings)
    return Listing(repo_id, info.sha or revision or "main", files)


def fetch(repo_id: str, name: str, commit: str, dest: Path, endpoint: str) -> Path:
    """One file into `dest` (kept when already complete; progress on stderr)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, name, revision=commit, local_dir=dest, endpoint=endpoint))


def read_remote_config(listing: Listing, endpoint: str) -> dict[str, Any] | None:
    """config.json (None: the repo has none), read in a temporary folder: nothing lands in
    the models folder before the checkpoint passes the check."""
    if not any(f.name == CONFIG_FILE for f in listing.files):
        return None
    with tempfile.TemporaryDirectory(prefix="diffusion-lsp-pull-") as tmp:
        path = fetch(listing.repo_id, CONFIG_FILE, listing.commit, Path(tmp), endpoint)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PullError(f"{listing.repo_id}'s {CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise PullError(f"{listing.repo_id}'s {CONFIG_FILE} is not a JSON object")
    return config


def _is_network_error(exc: BaseException) -> bool:
    """A connection refused, timed out or dropped, as httpx (huggingface_hub 1.x) or httpx2
    (2.x) raises it."""
    return any(
        cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2")
        for cls in type(exc).__mro__
    )


def explain(exc: BaseException, repo_id: str, revision: str | None, endpoint: str) -> str | None:
    """The one line a user needs for an error of huggingface_hub, the network or the disk;
    None for anything else (a bug)."""
    from huggingface_hub import errors as hf

    again = "run the same command again to resume"
    if isinstance(exc, hf.GatedRepoError):
        return (
            f"{repo_id} is gated: accept its conditions at {endpoint}/{repo_id} "
            "and set HF_TOKEN to a token of that account"
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} at {endpoint}"
    if isinstance(exc, hf.RepositoryNotFoundError):
        return f"no model {repo_id} at {endpoint} (a private repo needs HF_TOKEN)"
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set: unset it to download"
    if isinstance(exc, hf.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            return f"{endpoint} refused the token (401): check HF_TOKEN"
        if status == 403:
            return f"{endpoint} refused access to {repo_id} (403): check HF_TOKEN's permissions"
        if status == 404:
            return f"no model {repo_id} at {endpoint}"
        return f"{endpoint} answered {status} for {repo_id}: try again later ({again})"
    if isinstance(exc, hf.LocalEntryNotFoundError) or _is_network_error(exc):
        return f"cannot reach {endpoint}: check the network (and HF_ENDPOINT), then {again}"
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return f"the disk is full: free some space, then {again}"
        if exc.strerror:
            where = f" {exc.filename}" if exc.filename else ""
            return f"cannot write{where}: {exc.strerror}"
        first = str(exc).strip().splitlines()
        return f"download failed: {first[0] if first else type(exc).__name__}; {again}"
    return None


@contextmanager
def user_errors(repo_id: str, revision: str | None, endpoint: str) -> Iterator[None]:
    """The errors of the Hub, the network and the disk as one-line PullErrors."""
    try:
        yield
    except EngineError:
        raise
    except Exception as exc:
        message = explain(exc, repo_id, revision, endpoint)
        if message is None:
            raise
        raise PullError(message) from exc


# -- the command -----------------------------------------------------------------------


def say(message: str) -> None:
    sys.stderr.write(f"diffusion-infill: {message}\n")
    sys.stderr.flush()


def download(listing: Listing, files: Sequence[RemoteFile], dest: Path, endpoint: str) -> None:
    """The files into `dest`, then a check that each is whole."""
    for f in files:
        fetch(listing.repo_id, f.name, listing.commit, dest, endpoint)
    broken = [f.name for f in files if not is_complete(dest, f)]
    if broken:
        raise PullError(f"{', '.join(broken)} did not arrive whole: run the same command again to resume")
    for f in files:
        if f.sha256 is not None and f.name.endswith(GGUF_SUFFIX):  # one file is the whole model: checked
            from engine.commands.convert import sha256_of

            if sha256_of(dest / f.name) != f.sha256.lower():
                (dest / f.name).unlink()
                raise PullError(f"{f.name} does not have the sha256 the Hub lists: deleted; run the command again")


def pull(repo_id: str, revision: str | None, models: Path, force: bool, quant: str = DEFAULT_GGUF_TYPE) -> Path:
    """Steps 1-6 of the module docstring; returns the checkpoint's directory, or the GGUF
    file pulled."""
    endpoint = hub_endpoint()
    dest = checkpoint_dir(models, repo_id, revision)
    with user_errors(repo_id, revision, endpoint):
        listing = list_files(repo_id, revision, endpoint)
        files = choose_files(listing, quant)
        gguf = next((f.name for f in files if f.name.endswith(GGUF_SUFFIX)), None)
        if gguf is not None:  # the architecture is in the file's header, read once it is here
            kind = f"GGUF file {gguf} ({GGUF_KIND})"
        else:
            kind = family(read_remote_config(listing, endpoint), repo_id, force)
        say(f"{repo_id} at {listing.commit[:12]} from {endpoint}: {kind}")
        missing = [f for f in files if not is_complete(dest, f)]
        have = "" if len(missing) == len(files) else f", {human_size(sum(f.size or 0 for f in missing))} still to fetch"
        say(f"{describe(files)}{have} into {dest}")
        check_disk_space(dest, sum(f.size or 0 for f in missing))
        dest.mkdir(parents=True, exist_ok=True)
        download(listing, files, dest, endpoint)
    remove_stale_partials(dest)
    return dest / gguf if gguf is not None else dest


def make_ready(dest: Path, quantize: str) -> Path:
    """Step 7: a Qwen2, Llama or Dream checkpoint, or a Qwen2 or Llama GGUF file, exported
    for the base install (`export-onnx --quantize`) into `<dest>-<quantize>`, and timed on
    this machine (`diffusion-infill models --measure`), so that the language server can
    choose it (engine/models/folder.py). Both are kept when done before, unless the export
    is of an older graph (engine/export/graph.EXPORT_VERSION): then both are done again. A
    GGUF file is exported with numpy alone; a checkpoint needs torch. Returns the export."""
    from engine.commands.models import measure
    from engine.export.graph import EXPORT_VERSION, export_version
    from engine.models.folder import TIMING_FILE, machine_key, read_timing, write_timing

    gguf = dest if dest.suffix == GGUF_SUFFIX else None
    # a GGUF file's export is named for its type too: a repo holds several
    out = (
        dest.parent.with_name(f"{dest.parent.name}-{gguf_type(dest.name)}-{quantize}")
        if gguf
        else dest.with_name(f"{dest.name}-{quantize}")
    )
    if 0 < export_version(out) < EXPORT_VERSION:  # a finished export of an older graph
        say(f"{out} was exported by an older version (a slower graph): exporting it again")
        (out / CONFIG_FILE).unlink()  # first: an interrupted export is then unfinished, not old
        (out / TIMING_FILE).unlink(missing_ok=True)  # its times were the old graph's
    if not (out / CONFIG_FILE).is_file():  # written last: a finished export
        if gguf is not None:
            from engine.export.from_gguf import export_gguf

            say(f"exporting {gguf.name} for the base install (onnxruntime, {quantize} weights) into {out}")
            export_gguf(gguf, out, quantize)
        else:
            try:
                from engine.training.export_lm import export_lm
            except ImportError as exc:
                raise PullError(
                    f"exporting a checkpoint needs torch: pip install 'diffusion-lsp[torch]', pull its GGUF "
                    f"repo instead, or pull with --ready none ({exc})"
                ) from exc
            say(f"exporting for the base install (onnxruntime, {quantize} weights) into {out}: a few minutes")
            export_lm(dest, out, quantize)
    key = machine_key()
    if read_timing(out, key) is None:
        say(f"timing it on this machine ({key}): a minute or two")
        write_timing(out, key, measure(out))
    return out


def read_model_type(dest: Path) -> object:
    return json.loads((dest / CONFIG_FILE).read_text(encoding="utf-8")).get("model_type")


def cmd_pull(args: argparse.Namespace) -> int:
    require_hub()
    repo_id = parse_repo_id(args.repo_id)
    try:
        dest = pull(repo_id, args.revision, Path(os.path.abspath(models_folder(args.dir))), args.force, args.quant)
        if dest.suffix == GGUF_SUFFIX:  # with --ready none, the file itself (llama.cpp reads it)
            ready = args.ready != "none"
        else:
            ready = args.ready != "none" and read_model_type(dest) in READY_TYPES
        if ready:
            dest = make_ready(dest, args.ready)
    except KeyboardInterrupt:
        say("interrupted: the files already complete are kept; run the same command again to resume")
        raise
    sys.stdout.write(f"{dest}\n")
    sys.stdout.flush()
    say(
        f"use it with --model {shlex.quote(str(dest))} (diffusion-infill, diffusion-lsp) or the server's `model` setting"
    )
    return 0
