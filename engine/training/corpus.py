"""Build the training corpus: permissively licensed Python, deduplicated, split by package.

Training-time only: nothing in the runtime path (fill, the server, the backends) imports
this module. Run it as

    python -m engine.training.corpus build --out corpus --stdlib --packages requests attrs ... \\
        --holdout more-itertools stdlib:email

Sources are the standard library of the running interpreter (PSF-2.0; each top-level
module or package is its own "package" named ``stdlib:<name>``, so that a held-out split
can name one), PyPI distributions fetched by name with ``pip download`` (a wheel, or
the sdist when there is none), read straight from the archive, and (``--installed``, for
machines that cannot download) distributions installed for the running interpreter. A distribution is kept
only when its metadata says it is permissive (MIT, BSD, Apache-2.0, PSF-2.0, ISC);
copyleft, proprietary and unknown licences are excluded and logged, because the model
card promises that every training file may be redistributed with the weights.

Files: ``.py`` only (other languages are not collected yet), UTF-8, at most
MAX_FILE_BYTES, never test suites, vendored copies or anything named after a public
benchmark (a model evaluated on HumanEval-like tasks must never have seen them). Exact
duplicates (sha256 of the text with trailing whitespace normalised) and near duplicates
(MinHash over token 5-gram shingles, LSH banding, Jaccard >= 0.85 checked exactly) are
removed, keeping the first copy met; sources are visited in a fixed order, so a build is
reproducible. Dedup runs across both splits, so no held-out file has a near copy in the
training split.

Layout written under ``--out`` (the evaluation and training code rely on it)::

    train/<package>/<relpath>.py      heldout/<package>/<relpath>.py
    manifest.jsonl   one line per kept file: path (relative to the corpus dir), package,
                     version, license, split ("train" | "heldout"), sha256, bytes
    stats.json       files and bytes per package and split, files removed by each filter,
                     excluded packages with their licence
    .cache/          downloaded archives, reused by the next build

Files are written normalised (``\\n`` line ends, no trailing whitespace, one final
newline); ``sha256`` and ``bytes`` describe the file as written.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import hashlib
import json
import logging
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 200_000  # larger .py files are generated tables or data, not code to learn from
MANIFEST = "manifest.jsonl"
STATS = "stats.json"
SPLITS = ("train", "heldout")

# ---------------------------------------------------------------------------------------
# Licences

PERMISSIVE = frozenset({"MIT", "BSD-2-Clause", "BSD-3-Clause", "BSD", "Apache-2.0", "PSF-2.0", "ISC"})

# Anything that matches is not permissive, whatever else the metadata says.
_RESTRICTED = re.compile(
    r"(?:\b|_)(?:a|l)?gpl|general public licen[cs]e|affero|\bmpl\b|mozilla|\beupl\b|\bepl\b|eclipse public"
    r"|\bcddl\b|common development and distribution|sleepycat|\bosl\b|open software licen[cs]e"
    r"|share.?alike|cc.by.sa|\bsspl\b|proprietary|commercial|business source"
)
_PERMISSIVE_TERMS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:mit|expat)(?: licen[cs]e)?$"), "MIT"),
    (
        re.compile(r"^(?:bsd.?3.?clause|3.?clause bsd|bsd.?3|new bsd|modified bsd|revised bsd)(?: licen[cs]e)?$"),
        "BSD-3-Clause",
    ),
    (re.compile(r"^(?:bsd.?2.?clause|2.?clause bsd|bsd.?2|simplified bsd|freebsd)(?: licen[cs]e)?$"), "BSD-2-Clause"),
    (re.compile(r"^bsd(?: licen[cs]e)?$"), "BSD"),
    (
        re.compile(r"^(?:apache|asl)(?: software)?(?: licen[cs]e)?(?:,? ?(?:version |v)?2(?:\.0)?)?(?: licen[cs]e)?$"),
        "Apache-2.0",
    ),
    (
        re.compile(
            r"^(?:psf|psfl|python software foundation|python)(?: licen[cs]e)?(?:,? ?(?:version |v)?2(?:\.0)?)?$"
        ),
        "PSF-2.0",
    ),
    (re.compile(r"^isc(?: licen[cs]e)?(?: \(iscl\))?$"), "ISC"),
]
# Metadata values that say nothing (a field left empty, the generic classifier parent).
_NO_INFO = re.compile(r"^(?:|unknown|none|n/?a|osi approved|other|dual licen[cs]e|see licen[cs]e.*|licen[cs]e)$")


@dataclass(frozen=True)
class Licence:
    """What a distribution's metadata says: a label for the manifest, and the verdict."""

    label: str
    permissive: bool


def classify_term(text: str) -> tuple[str, str]:
    """(label, kind) for one licence name: kind is permissive, restricted, unknown or none.

    Accepts SPDX ids, the usual spellings ("Apache Software License", "new BSD", "MIT
    License") and whole licence texts pasted into a License field."""
    raw = text.strip()
    s = re.sub(r"[\s_-]+", " ", raw.lower()).strip()
    s = re.sub(r"^the ", "", s)
    if "\n" in raw or len(s) > 120:  # a pasted licence text
        if _RESTRICTED.search(s) and ("gnu" in s or "mozilla" in s or "copyleft" in s):
            return raw.splitlines()[0][:80], "restricted"
        if "permission is hereby granted, free of charge" in s:
            return "MIT", "permissive"
        if "redistribution and use in source and binary forms" in s:
            three = "neither the name" in s or "endorse or promote" in s
            return ("BSD-3-Clause" if three else "BSD-2-Clause"), "permissive"
        if "apache license" in s and "version 2.0" in s:
            return "Apache-2.0", "permissive"
        if "permission to use, copy, modify, and/or distribute this software for any purpose" in s:
            return "ISC", "permissive"
        if "python software foundation" in s:
            return "PSF-2.0", "permissive"
        return raw.splitlines()[0][:80], "unknown"
    if _NO_INFO.match(s):
        return raw, "none"
    if _RESTRICTED.search(s):
        return raw, "restricted"
    for pattern, spdx in _PERMISSIVE_TERMS:
        if pattern.match(s):
            return spdx, "permissive"
    return raw, "unknown"


def _spdx_tokens(expr: str) -> list[str]:
    return re.findall(r"\(|\)|[^\s()]+", expr)


def spdx_permissive(expr: str) -> bool:
    """Whether an SPDX licence expression lets us use the code under a permissive licence:
    OR needs one permissive side, AND needs both; ``WITH`` exceptions only add rights.
    Raises ValueError when the expression does not parse."""
    tokens = _spdx_tokens(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"unexpected end of licence expression {expr!r}")
        pos += 1
        return tokens[pos - 1]

    def factor() -> bool:
        tok = take()
        if tok == "(":
            value = disjunction()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in {expr!r}")
            return value
        if tok.upper() in {"AND", "OR", "WITH", ")"}:
            raise ValueError(f"unexpected {tok!r} in {expr!r}")
        if (peek() or "").upper() == "WITH":
            take()
            take()  # the exception's id
        return classify_term(tok.removesuffix("+"))[1] == "permissive"  # "+": or a later version

    def conjunction() -> bool:
        value = factor()
        while (peek() or "").upper() == "AND":
            take()
            value = factor() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while (peek() or "").upper() == "OR":
            take()
            value = conjunction() or value
        return value

    if not tokens:
        raise ValueError("empty licence expression")
    result = disjunction()
    if pos != len(tokens):
        raise ValueError(f"trailing tokens in {expr!r}")
    return result


def licence_from_metadata(meta: email.message.Message) -> Licence:
    """The licence of a distribution from its core metadata (PKG-INFO / METADATA).

    License-Expression (PEP 639) decides when present. Otherwise the License field and
    the "License ::" classifiers are read together: one restricted or unrecognised
    licence among them excludes the package (dual licensing cannot be told from
    conjunction there, so the conservative reading wins); at least one permissive one is
    needed to keep it."""
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        try:
            return Licence(expression, spdx_permissive(expression))
        except ValueError:
            return Licence(expression, False)
    terms: list[tuple[str, str]] = []
    field_value = (meta.get("License") or "").strip()
    field_kind = "none"
    if field_value:
        if re.search(r"\s(?:OR|AND)\s", field_value) and "\n" not in field_value:
            try:
                return Licence(field_value, spdx_permissive(field_value))
            except ValueError:
                pass
        label, field_kind = classify_term(field_value)
        terms.append((label, field_kind))
    for classifier in meta.get_all("Classifier") or []:
        parts = [p.strip() for p in str(classifier).split("::")]
        if parts[0] != "License":
            continue
        terms.append(classify_term(parts[-1]))
    # an unrecognised free-text License field ("Dual License") defers to the classifiers
    known = [(label, kind) for label, kind in terms if kind != "none"]
    if field_kind == "unknown" and any(kind == "permissive" for _, kind in terms[1:]):
        known = known[1:]
    labels = list(dict.fromkeys(label for label, _ in known))
    if "BSD" in labels and any(label.startswith("BSD-") for label in labels):
        labels.remove("BSD")  # the classifier's generic "BSD License" next to the exact variant
    label = ", ".join(labels) if labels else "unknown"
    ok = bool(known) and all(kind == "permissive" for _, kind in known)
    return Licence(label, ok)


def parse_metadata(text: str) -> email.message.Message:
    return email.parser.Parser().parsestr(text, headersonly=True)


# ---------------------------------------------------------------------------------------
# File filters

TEST_DIRS = frozenset({"test", "tests", "_tests", "testing", "idle_test", "unittests"})
VENDOR_DIRS = frozenset({"_vendor", "vendor", "vendored", "_vendored", "third_party", "_third_party", "thirdparty"})
# Public code-generation benchmarks and their derivatives: never in the corpus.
BENCHMARK = re.compile(
    r"human.?eval|mbpp|code.?contests|evalplus|multipl.?e\b|ds.?1000|livecodebench|bigcodebench|^apps$"
)


def path_filter(relpath: str) -> str | None:
    """The filter that drops a file by its path, or None when the path is fine."""
    parts = PurePosixPath(relpath).parts
    lowered = [p.lower() for p in parts]
    name = lowered[-1]
    if any(BENCHMARK.search(p.removesuffix(".py")) for p in lowered):
        return "benchmark"
    if any(p in VENDOR_DIRS for p in lowered[:-1]):
        return "vendored"
    if (
        any(p in TEST_DIRS for p in lowered[:-1])
        or name == "conftest.py"
        or name.startswith("test_")
        or name.endswith("_test.py")
    ):
        return "test_suite"
    return None


def normalise_text(raw: bytes) -> str | None:
    """UTF-8 text with ``\\n`` line ends, no trailing whitespace, one final newline; None
    when the bytes are not UTF-8 or hold no code."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return None
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    body = "\n".join(lines).strip("\n")
    return body + "\n" if body.strip() else ""


# ---------------------------------------------------------------------------------------
# Near-duplicate detection

_TOKEN = re.compile(r"\w+|[^\w\s]")
_SHINGLE_MULT = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD],
    dtype=np.uint64,
)


class NearDuplicateIndex:
    """MinHash signatures over token k-gram shingles with LSH banding.

    ``bands`` x ``rows`` = ``num_perm``; with 16 bands of 8 rows a pair at Jaccard 0.85
    shares a band with probability 0.994, at 0.5 with 0.06. Candidates that share a band
    are then checked with the exact Jaccard of their shingle sets, so the threshold is
    exact and only recall is approximate."""

    def __init__(
        self, threshold: float = 0.85, shingle: int = 5, num_perm: int = 128, bands: int = 16, seed: int = 0
    ) -> None:
        if num_perm % bands:
            raise ValueError("num_perm must be a multiple of bands")
        rng = np.random.default_rng(seed)
        self.a = rng.integers(0, 2**64, size=(num_perm, 1), dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 2**64, size=(num_perm, 1), dtype=np.uint64)
        self.threshold = threshold
        self.shingle = shingle
        self.rows = num_perm // bands
        self.buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
        self.sets: list[np.ndarray] = []
        self._token_hash: dict[str, int] = {}

    def shingles(self, text: str) -> np.ndarray:
        """Sorted unique 64-bit hashes of the text's token k-grams (stable across runs)."""
        cache = self._token_hash
        ids = []
        for tok in _TOKEN.findall(text):
            h = cache.get(tok)
            if h is None:
                h = int.from_bytes(hashlib.blake2b(tok.encode("utf-8", "replace"), digest_size=8).digest(), "little")
                cache[tok] = h
            ids.append(h)
        if not ids:
            return np.zeros(0, dtype=np.uint64)
        h_arr = np.array(ids, dtype=np.uint64)
        k = min(self.shingle, len(h_arr))
        n = len(h_arr) - k + 1
        acc = np.zeros(n, dtype=np.uint64)
        for j in range(k):
            acc = (acc ^ (h_arr[j : j + n] * _SHINGLE_MULT[j])) * np.uint64(0x100000001B3)
        return np.unique(acc)

    def signature(self, sh: np.ndarray) -> np.ndarray:
        sig = np.full(self.a.shape[0], np.iinfo(np.uint64).max, dtype=np.uint64)
        for start in range(0, len(sh), 4096):
            chunk = sh[None, start : start + 4096]
            sig = np.minimum(sig, ((self.a * chunk + self.b) >> np.uint64(32)).min(axis=1))
        return sig

    def add(self, text: str) -> int | None:
        """Index the text and return None, or return the index of an already indexed text
        it nearly duplicates (that one is kept; this one is not indexed). Texts are
        numbered in the order they were added; a text with no tokens counts as a
        duplicate of nothing and is not indexed either (returns -1)."""
        sh = self.shingles(text)
        if len(sh) == 0:
            return -1
        sig = self.signature(sh)
        keys = [sig[i * self.rows : (i + 1) * self.rows].tobytes() for i in range(len(self.buckets))]
        candidates: set[int] = set()
        for bucket, key in zip(self.buckets, keys, strict=True):
            candidates.update(bucket.get(key, ()))
        for c in sorted(candidates):
            if jaccard(sh, self.sets[c]) >= self.threshold:
                return c
        idx = len(self.sets)
        self.sets.append(sh)
        for bucket, key in zip(self.buckets, keys, strict=True):
            bucket.setdefault(key, []).append(idx)
        return None


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique arrays."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 1.0


def exact_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------
# Sources


@dataclass
class Source:
    """One package's files: name, version, licence, and (relpath, bytes) pairs."""

    package: str
    version: str
    license: str
    origin: str  # stdlib | wheel | sdist | installed
    permissive: bool = True
    files: list[tuple[str, bytes]] = field(default_factory=list)


class FetchError(Exception):
    """A distribution could not be downloaded or read."""


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name: "Typing_Extensions" -> "typing-extensions"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def stdlib_sources(stdlib_dir: Path | None = None) -> Iterator[Source]:
    """Each top-level module or package of this interpreter's standard library, as its own
    package "stdlib:<name>" (the ``test`` package, site-packages and build config are not
    in sys.stdlib_module_names, so they never appear)."""
    import sysconfig

    root = stdlib_dir or Path(sysconfig.get_paths()["stdlib"])
    for entry in sorted(root.iterdir()):
        name = entry.name.removesuffix(".py")
        if name not in sys.stdlib_module_names or name.startswith("__"):
            continue
        if entry.is_file() and entry.suffix == ".py":
            paths = [entry]
        elif entry.is_dir():
            paths = sorted(p for p in entry.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            continue
        files = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in paths]
        yield Source(f"stdlib:{name}", platform.python_version(), "PSF-2.0", "stdlib", True, files)


def _archives(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip", ".tgz"))]
    # a wheel first: it holds exactly what gets installed, an sdist also its tests and docs
    return sorted(found, key=lambda p: (not p.name.endswith(".whl"), p.name))


def fetch(name: str, cache: Path, find_links: Path | None = None) -> Path:
    """The archive of a distribution: from the cache, else ``pip download`` (a wheel for
    this interpreter, or the sdist when there is none)."""
    target = cache / canonical_name(name)
    existing = _archives(target)
    if existing:
        return existing[0]
    target.mkdir(parents=True, exist_ok=True)
    base = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(target),
    ]
    if find_links is not None:
        base += ["--no-index", "--find-links", str(find_links)]
    errors = []
    for mode in ("--only-binary=:all:", "--no-binary=:all:"):
        proc = subprocess.run([*base, mode, name], capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 and _archives(target):
            return _archives(target)[0]
        errors.append((proc.stderr.strip().splitlines() or ["pip failed"])[-1])
    raise FetchError(f"pip download {name} failed: {errors[-1]}")


def prefetch(names: Sequence[str], cache: Path, find_links: Path | None, jobs: int) -> None:
    """Download many distributions into the cache at once (pip is network-bound); a
    failure is left for the build to record when it fetches that name again."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> None:
        with contextlib.suppress(FetchError, subprocess.SubprocessError, OSError):
            fetch(name, cache, find_links)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, [n for n in dict.fromkeys(names) if not BENCHMARK.search(n)]))


def read_names(path: Path) -> list[str]:
    """Distribution names from a file: one per line, ``#`` comments and blank lines skipped."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def _archive_members(archive: Path) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the regular files in a wheel, zip or tarball."""
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    yield info.filename, zf.read(info)
    else:
        with tarfile.open(archive) as tf:
            for member in tf:
                if member.isfile():
                    fh = tf.extractfile(member)
                    if fh is not None:
                        yield member.name, fh.read()


def _safe_relpath(path: str) -> str | None:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or any(p in {"..", "."} for p in parts):
        return None
    return "/".join(parts)


def archive_source(name: str, archive: Path) -> Source:
    """A distribution read from its archive: metadata (version, licence) and .py files
    with paths as installed (wheel) or relative to the sdist's root directory."""
    is_wheel = archive.name.endswith(".whl")
    metadata: str | None = None
    files: list[tuple[str, bytes]] = []
    try:
        for path, data in _archive_members(archive):
            rel = _safe_relpath(path)
            if rel is None:
                continue
            parts = rel.split("/")
            if is_wheel:
                if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
                    metadata = data.decode("utf-8", "replace")
                    continue
                if parts[0].endswith(".dist-info"):
                    continue
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in {"purelib", "platlib"}:
                        continue
                    parts = parts[2:]
            else:
                if len(parts) == 2 and parts[1] == "PKG-INFO":
                    metadata = data.decode("utf-8", "replace")
                    continue
                parts = parts[1:]  # the sdist's "<name>-<version>/" directory
            if parts and parts[-1].endswith(".py"):
                files.append(("/".join(parts), data))
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise FetchError(f"cannot read {archive.name}: {exc}") from exc
    if metadata is None:
        raise FetchError(f"{archive.name} has no metadata")
    meta = parse_metadata(metadata)
    lic = licence_from_metadata(meta)
    files.sort()
    version = str(meta.get("Version") or "unknown")
    return Source(canonical_name(name), version, lic.label, "wheel" if is_wheel else "sdist", lic.permissive, files)


def installed_source(name: str) -> Source:
    """An installed distribution (this interpreter's site-packages), read through its
    RECORD: the way to a corpus on a machine that cannot download (the accelerator)."""
    from importlib import metadata as im

    try:
        dist = im.distribution(name)
    except im.PackageNotFoundError as exc:
        raise FetchError(f"{name} is not installed") from exc
    lic = licence_from_metadata(dist.metadata)  # type: ignore[arg-type]
    files: list[tuple[str, bytes]] = []
    for f in dist.files or []:
        rel = _safe_relpath(f.as_posix())
        if rel is None or not rel.endswith(".py") or ".dist-info/" in rel:
            continue
        try:
            files.append((rel, Path(str(dist.locate_file(f))).read_bytes()))
        except OSError:
            continue
    files.sort()
    return Source(canonical_name(name), dist.version, lic.label, "installed", lic.permissive, files)


def installed_names() -> list[str]:
    """Every distribution installed for this interpreter, by canonical name."""
    from importlib import metadata as im

    return sorted({canonical_name(d.metadata["Name"]) for d in im.distributions() if d.metadata["Name"]})


# ---------------------------------------------------------------------------------------
# The build


def is_held_out(package: str, holdout: Iterable[str]) -> bool:
    names = {canonical_name(h) if not h.startswith("stdlib") else h for h in holdout}
    return package in names or (package.startswith("stdlib:") and "stdlib" in names)


@dataclass
class BuildResult:
    manifest: list[dict[str, Any]]
    stats: dict[str, Any]


def build(
    out: Path,
    packages: Sequence[str] = (),
    holdout: Sequence[str] = (),
    stdlib: bool = False,
    max_mb: float | None = None,
    find_links: Path | None = None,
    stdlib_dir: Path | None = None,
    installed: Sequence[str] = (),
    jobs: int = 1,
    max_package_mb: float | None = None,
) -> BuildResult:
    """Build the corpus under ``out`` (see the module docstring for the layout).

    ``packages`` are fetched from the package index (``jobs`` downloads at a time, into
    the cache, before the build reads them in order); ``installed`` are read from this
    interpreter's site-packages ("*" for all of them); both pass the same filters.
    ``max_package_mb`` caps what one package adds (files past it are dropped as
    ``package_cap``), so a few huge or generated packages cannot crowd out the rest."""
    t0 = time.monotonic()
    cache = out / ".cache"
    if jobs > 1 and packages:
        prefetch(packages, cache, find_links, jobs)
    for split in SPLITS:
        shutil.rmtree(out / split, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    removed: Counter[str] = Counter()
    excluded: list[dict[str, str]] = []
    per_package: dict[str, dict[str, Any]] = {}
    manifest: list[dict[str, Any]] = []
    seen_exact: set[str] = set()
    near = NearDuplicateIndex()
    indexed: list[str] = []  # manifest paths, by near-duplicate index number
    budget = int(max_mb * 1_000_000) if max_mb else None
    total = 0

    wanted = [(canonical_name(p), False) for p in packages]
    local = installed_names() if "*" in installed else installed
    wanted += [(canonical_name(p), True) for p in local]

    def sources() -> Iterator[Source]:
        if stdlib:
            yield from stdlib_sources(stdlib_dir)
        for name, is_installed in dict.fromkeys(wanted):
            if BENCHMARK.search(name):
                excluded.append({"package": name, "version": "", "license": "", "reason": "benchmark"})
                log.warning("%s: excluded (named like a public benchmark)", name)
                continue
            try:
                src = installed_source(name) if is_installed else archive_source(name, fetch(name, cache, find_links))
            except (FetchError, subprocess.SubprocessError, OSError) as exc:
                excluded.append({"package": name, "version": "", "license": "", "reason": f"fetch failed: {exc}"})
                log.warning("%s: excluded (%s)", name, exc)
                continue
            if not src.permissive:
                excluded.append(
                    {
                        "package": name,
                        "version": src.version,
                        "license": src.license,
                        "reason": "licence not permissive",
                    }
                )
                log.warning("%s %s: excluded (licence %r)", name, src.version, src.license)
                continue
            yield src

    for src in sources():
        split = "heldout" if is_held_out(src.package, holdout) else "train"
        entry = per_package.setdefault(
            src.package,
            {
                "version": src.version,
                "license": src.license,
                "origin": src.origin,
                "split": split,
                "files": 0,
                "bytes": 0,
            },
        )
        for relpath, raw in src.files:
            reason = path_filter(relpath)
            if reason is None and len(raw) > MAX_FILE_BYTES:
                reason = "too_large"
            text = normalise_text(raw) if reason is None else None
            if reason is None and text is None:
                reason = "not_utf8"
            if reason is None and not text:
                reason = "empty"
            if reason is not None or text is None:
                removed[reason or "empty"] += 1
                continue
            digest = exact_key(text)
            if digest in seen_exact:
                removed["exact_duplicate"] += 1
                continue
            seen_exact.add(digest)
            data = text.encode("utf-8")
            if budget is not None and total + len(data) > budget:
                removed["over_budget"] += 1
                continue
            if max_package_mb is not None and entry["bytes"] + len(data) > max_package_mb * 1_000_000:
                removed["package_cap"] += 1
                continue
            twin = near.add(text)
            if twin is not None:
                removed["near_duplicate"] += 1
                log.info("near duplicate: %s/%s of %s", src.package, relpath, indexed[twin] if twin >= 0 else "-")
                continue
            path = f"{split}/{src.package}/{relpath}"
            indexed.append(path)
            dest = out / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            total += len(data)
            entry["files"] += 1
            entry["bytes"] += len(data)
            manifest.append(
                {
                    "path": path,
                    "package": src.package,
                    "version": src.version,
                    "license": src.license,
                    "split": split,
                    "sha256": digest,
                    "bytes": len(data),
                }
            )
    missing = [h for h in holdout if not any(is_held_out(p, [h]) for p in per_package)]
    for h in missing:
        log.warning("held-out package %s is not in the corpus", h)
    totals = {
        split: {
            "files": sum(e["files"] for e in per_package.values() if e["split"] == split),
            "bytes": sum(e["bytes"] for e in per_package.values() if e["split"] == split),
            "packages": sum(1 for e in per_package.values() if e["split"] == split and e["files"]),
        }
        for split in SPLITS
    }
    stats = {
        "python": sys.version.split()[0],
        "totals": totals,
        "removed": dict(sorted(removed.items())),
        "excluded_packages": excluded,
        "holdout": list(holdout),
        "holdout_missing": missing,
        "licenses": dict(Counter(e["license"] for e in per_package.values() if e["files"]).most_common()),
        "packages": per_package,
        "near_duplicates": {
            "shingle_tokens": near.shingle,
            "num_perm": int(near.a.shape[0]),
            "bands": len(near.buckets),
            "threshold": near.threshold,
        },
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / MANIFEST).write_text("".join(json.dumps(m) + "\n" for m in manifest), encoding="utf-8")
    (out / STATS).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return BuildResult(manifest, stats)


# ---------------------------------------------------------------------------------------
# Reading a built corpus (training, the model directory's DATA_MANIFEST.jsonl)


def read_manifest(corpus: Path) -> list[dict[str, Any]]:
    """The manifest's entries, one dict per kept file."""
    text = (corpus / MANIFEST).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


DATA_MANIFEST = "DATA_MANIFEST.jsonl"
MAX_DATA_MANIFEST_BYTES = 1_000_000


def data_manifest(corpora: Sequence[Path], limit: int = MAX_DATA_MANIFEST_BYTES) -> str:
    """The text of a model's DATA_MANIFEST.jsonl: the corpus manifests' lines, or, when
    they would exceed ``limit`` bytes, one line per package and split (package, version,
    license, split, files, bytes) so that the model directory stays small."""
    entries = [e for c in corpora for e in read_manifest(c)]
    full = "".join(json.dumps(e) + "\n" for e in entries)
    if len(full.encode("utf-8")) <= limit:
        return full
    summary: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for e in entries:
        key = (e["package"], e["version"], e["license"], e["split"])
        s = summary.setdefault(
            key, {"package": key[0], "version": key[1], "license": key[2], "split": key[3], "files": 0, "bytes": 0}
        )
        s["files"] += 1
        s["bytes"] += e["bytes"]
    return "".join(json.dumps(s) + "\n" for s in summary.values())


# ---------------------------------------------------------------------------------------
# Command line


def _summary(stats: dict[str, Any]) -> str:
    t = stats["totals"]
    lines = [
        f"train: {t['train']['files']} files, {t['train']['bytes'] / 1e6:.1f} MB, {t['train']['packages']} packages",
        f"heldout: {t['heldout']['files']} files, {t['heldout']['bytes'] / 1e6:.1f} MB, {t['heldout']['packages']} packages",
        "removed: " + ", ".join(f"{k} {v}" for k, v in stats["removed"].items()),
        "excluded: "
        + (", ".join(f"{e['package']} ({e['license'] or e['reason']})" for e in stats["excluded_packages"]) or "none"),
        f"built in {stats['seconds']} s",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m engine.training.corpus", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a corpus directory")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--packages", nargs="*", default=[], metavar="NAME", help="PyPI distributions by name")
    b.add_argument("--packages-file", type=Path, default=None, help="more names, one per line (# comments)")
    b.add_argument("--jobs", type=int, default=1, help="downloads at a time")
    b.add_argument("--max-package-mb", type=float, default=None, help="cap on what one package adds")
    b.add_argument(
        "--holdout", nargs="*", default=[], metavar="NAME", help="packages held out (stdlib:NAME for stdlib)"
    )
    b.add_argument("--stdlib", action="store_true", help="include this interpreter's standard library")
    b.add_argument(
        "--installed", nargs="*", default=[], metavar="NAME", help="installed distributions ('*': all), no download"
    )
    b.add_argument("--max-mb", type=float, default=None, help="stop adding files past this many MB")
    b.add_argument("--find-links", type=Path, default=None, help="fetch from this directory only (offline)")
    b.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="corpus: %(message)s", stream=sys.stderr
    )
    packages = [*args.packages, *(read_names(args.packages_file) if args.packages_file else [])]
    result = build(
        args.out,
        packages,
        args.holdout,
        args.stdlib,
        args.max_mb,
        args.find_links,
        installed=args.installed,
        jobs=args.jobs,
        max_package_mb=args.max_package_mb,
    )
    sys.stdout.write(_summary(result.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
