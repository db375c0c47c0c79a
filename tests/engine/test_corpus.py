"""The corpus builder, offline: fake wheels and sdists built here, a fake stdlib directory.

Checks the licence filter (metadata parsing and the build's verdict), the path filters
(test suites, vendored code, benchmarks), exact and near-duplicate removal, the held-out
split by package, the manifest and stats, and training's reading of a built corpus.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from engine.training.corpus import (
    MANIFEST,
    STATS,
    NearDuplicateIndex,
    build,
    classify_term,
    data_manifest,
    licence_from_metadata,
    main,
    normalise_text,
    parse_metadata,
    path_filter,
    spdx_permissive,
)


def code(name: str, n: int = 60) -> str:
    """A distinct module of ``n`` small functions: long enough for 5-gram shingles to
    tell one changed line from a different file."""
    return "".join(
        f"def {name}_{i}({name}_value, scale={i}):\n    {name}_total = {name}_value * scale + {i * 7}\n"
        f"    return {name}_total - {i % 5}\n\n"
        for i in range(n)
    )


def metadata(name: str, version: str, *headers: str) -> str:
    return "\n".join(["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}", *headers]) + "\n\n"


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str], *headers: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", metadata(name, version, *headers))
        zf.writestr(
            f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


def make_sdist(directory: Path, name: str, version: str, files: dict[str, str], *headers: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    root = f"{name}-{version}"
    path = directory / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in {**files, "PKG-INFO": metadata(name, version, *headers)}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def fake_stdlib(root: Path) -> Path:
    """Real stdlib module names (the builder only takes names Python lists as stdlib)."""
    files = {
        # visited in name order: abc.py comes first and is the copy kept
        "abc.py": code("abc"),
        "csv.py": code("abc").replace("\n", "   \n"),  # abc.py with trailing blanks: exact duplicate
        "glob.py": code("abc").replace("_total - 3\n", "_total - 99  # changed\n", 1),  # one line: near duplicate
        "copy.py": code("copy"),
        "email/__init__.py": code("mail", 10),
        "email/parser.py": code("parser"),
        "email/test/test_parser.py": code("tparser"),  # a test suite: never kept
        "not_a_stdlib_module.py": code("nope"),  # not in sys.stdlib_module_names
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


MIT = ("License-Expression: MIT",)
GPL = ("License: GPL-3.0-or-later", "Classifier: License :: OSI Approved :: GNU General Public License v3 (GPLv3)")


def seed_cache(out: Path) -> None:
    """Archives where the builder caches downloads, so no pip call is made."""
    cache = out / ".cache"
    make_wheel(
        cache / "goodpkg",
        "goodpkg",
        "1.0",
        {
            "goodpkg/__init__.py": code("good_init", 5),
            "goodpkg/core.py": code("good"),
            "goodpkg/tests/test_core.py": code("gtest"),
            "goodpkg/conftest.py": code("gconf"),
            "goodpkg/core_test.py": code("gtest2"),
            "goodpkg/_vendor/vendored.py": code("vend"),
            "goodpkg/humaneval_tasks.py": code("heval"),
            "goodpkg/mbpp/problems.py": code("mbpp"),
            "goodpkg/big.py": "x = 1\n" * 40_000,  # 240 KB: too large
            "goodpkg/data.txt": "not python",
        },
        *MIT,
    )
    make_wheel(cache / "gplpkg", "gplpkg", "2.0", {"gplpkg/__init__.py": code("gpl")}, *GPL)
    make_sdist(
        cache / "heldpkg",
        "heldpkg",
        "0.3",
        {"src/heldpkg/__init__.py": code("held"), "tests/test_held.py": code("htest")},
        "License: BSD",
        "Classifier: License :: OSI Approved :: BSD License",
    )
    # latin1.py must not decode as UTF-8
    whl = cache / "goodpkg" / "goodpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "a") as zf:
        zf.writestr("goodpkg/latin1_raw.py", "# caf\xe9\n".encode("latin-1"))


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    out = tmp_path / "corpus"
    seed_cache(out)
    result = build(
        out,
        packages=["goodpkg", "GPLpkg", "heldpkg"],
        holdout=["heldpkg", "stdlib:email"],
        stdlib=True,
        stdlib_dir=fake_stdlib(tmp_path / "stdlib"),
    )
    return out, result.stats


# -- licences --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "label", "kind"),
    [
        ("MIT", "MIT", "permissive"),
        ("MIT License", "MIT", "permissive"),
        ("new BSD", "BSD-3-Clause", "permissive"),
        ("BSD-2-Clause", "BSD-2-Clause", "permissive"),
        ("BSD License", "BSD", "permissive"),
        ("Apache Software License", "Apache-2.0", "permissive"),
        ("Apache License, Version 2.0", "Apache-2.0", "permissive"),
        ("Python Software Foundation License", "PSF-2.0", "permissive"),
        ("ISC License (ISCL)", "ISC", "permissive"),
        ("GNU General Public License v3 (GPLv3)", None, "restricted"),
        ("LGPL-2.1-only", None, "restricted"),
        ("AGPL-3.0", None, "restricted"),
        ("Mozilla Public License 2.0 (MPL 2.0)", None, "restricted"),
        ("Other/Proprietary License", None, "restricted"),
        ("WTFPL", None, "unknown"),
        ("OSI Approved", None, "none"),
    ],
)
def test_licence_terms(text: str, label: str | None, kind: str) -> None:
    got_label, got_kind = classify_term(text)
    assert got_kind == kind
    if label is not None:
        assert got_label == label


def test_licence_texts_pasted_into_the_license_field() -> None:
    mit = "Copyright (c) 2020 A\n\nPermission is hereby granted, free of charge, to any person obtaining a copy"
    assert classify_term(mit) == ("MIT", "permissive")
    gpl = "GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n\nEveryone is permitted to copy ..."
    assert classify_term(gpl)[1] == "restricted"


def test_spdx_expressions() -> None:
    assert spdx_permissive("MIT OR Apache-2.0")
    assert spdx_permissive("(Apache-2.0 OR BSD-2-Clause)")
    assert spdx_permissive("GPL-3.0-only OR MIT")  # we may take the MIT side
    assert not spdx_permissive("MIT AND GPL-3.0-only")  # both apply
    assert spdx_permissive("Apache-2.0 WITH LLVM-exception")
    assert not spdx_permissive("LicenseRef-Proprietary")
    with pytest.raises(ValueError):
        spdx_permissive("MIT OR (Apache-2.0")


def test_licence_from_metadata() -> None:
    def lic(*headers: str) -> tuple[str, bool]:
        got = licence_from_metadata(parse_metadata(metadata("p", "1", *headers)))
        return got.label, got.permissive

    assert lic("License-Expression: Apache-2.0 OR BSD-2-Clause") == ("Apache-2.0 OR BSD-2-Clause", True)
    # the expression decides even when a classifier disagrees
    assert lic("License-Expression: MPL-2.0", "Classifier: License :: OSI Approved :: MIT License")[1] is False
    # python-dateutil's metadata: an unrecognised License field defers to the classifiers
    dateutil = (
        "License: Dual License",
        "Classifier: License :: OSI Approved :: BSD License",
        "Classifier: License :: OSI Approved :: Apache Software License",
    )
    assert lic(*dateutil) == ("BSD, Apache-2.0", True)
    # docutils' metadata: one GPL classifier among permissive ones excludes the package
    docutils = (
        "Classifier: License :: Public Domain",
        "Classifier: License :: OSI Approved :: BSD License",
        "Classifier: License :: OSI Approved :: GNU General Public License (GPL)",
    )
    assert lic(*docutils)[1] is False
    assert lic("License: BSD-3-Clause", "Classifier: License :: OSI Approved :: BSD License") == ("BSD-3-Clause", True)
    assert lic("License: MIT OR Apache-2.0") == ("MIT OR Apache-2.0", True)
    assert lic() == ("unknown", False)  # no licence metadata at all
    assert lic("License: UNKNOWN", "Classifier: License :: OSI Approved") == ("unknown", False)
    assert lic("License: Some custom terms")[1] is False


# -- files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("pkg/core.py", None),
        ("jinja2/tests.py", None),  # Jinja's template tests are library code
        ("pkg/tests/test_a.py", "test_suite"),
        ("tests/helpers.py", "test_suite"),
        ("pkg/testing/util.py", "test_suite"),
        ("pkg/test_a.py", "test_suite"),
        ("pkg/a_test.py", "test_suite"),
        ("conftest.py", "test_suite"),
        ("pip/_vendor/six.py", "vendored"),
        ("pkg/third_party/x.py", "vendored"),
        ("human_eval/execution.py", "benchmark"),
        ("data/HumanEval.py", "benchmark"),
        ("pkg/mbpp_tasks.py", "benchmark"),
        ("apps/solutions.py", "benchmark"),
        ("code_contests/x.py", "benchmark"),
    ],
)
def test_path_filter(path: str, reason: str | None) -> None:
    assert path_filter(path) == reason


def test_normalise_text() -> None:
    assert normalise_text(b"\xef\xbb\xbfx = 1  \r\ny = 2\t\r\n\r\n\n") == "x = 1\ny = 2\n"
    assert normalise_text("caf\xe9".encode("latin-1")) is None
    assert normalise_text(b"  \n\n") == ""


def test_near_duplicate_index() -> None:
    index = NearDuplicateIndex()
    base = code("alpha")
    assert index.add(base) is None
    assert index.add(code("beta")) is None  # different names everywhere: not a duplicate
    one_line = base.replace("_total - 2\n", "_total - 1234  # edited\n", 1)
    assert one_line != base
    assert index.add(one_line) == 0
    assert index.add(base[: len(base) // 2]) is None  # half a file is far below 0.85
    assert index.add("") == -1


# -- the build -------------------------------------------------------------------------


def test_build_filters_splits_and_records(built: tuple[Path, dict[str, Any]]) -> None:
    out, stats = built
    manifest = [json.loads(line) for line in (out / MANIFEST).read_text().splitlines()]
    paths = {m["path"] for m in manifest}
    assert paths == {
        "train/stdlib:abc/abc.py",
        "train/stdlib:copy/copy.py",
        "heldout/stdlib:email/email/__init__.py",
        "heldout/stdlib:email/email/parser.py",
        "train/goodpkg/goodpkg/__init__.py",
        "train/goodpkg/goodpkg/core.py",
        "heldout/heldpkg/src/heldpkg/__init__.py",
    }
    for m in manifest:
        data = (out / m["path"]).read_bytes()
        assert m["bytes"] == len(data)
        assert set(m) == {"path", "package", "version", "license", "split", "sha256", "bytes"}
        assert m["split"] == m["path"].split("/")[0]
        assert m["path"].split("/")[1] == m["package"]
    by_pkg = {m["package"]: m for m in manifest}
    assert by_pkg["goodpkg"]["license"] == "MIT" and by_pkg["goodpkg"]["version"] == "1.0"
    assert by_pkg["heldpkg"]["license"] == "BSD" and by_pkg["heldpkg"]["version"] == "0.3"
    assert by_pkg["stdlib:abc"]["license"] == "PSF-2.0"
    assert "gplpkg" not in by_pkg  # GPL: excluded
    assert stats["excluded_packages"] == [
        {
            "package": "gplpkg",
            "version": "2.0",
            "license": "GPL-3.0-or-later, GNU General Public License v3 (GPLv3)",
            "reason": "licence not permissive",
        }
    ]
    assert not (out / "train" / "gplpkg").exists()
    removed = dict(stats["removed"])
    assert removed.pop("benchmark") == 2
    assert removed.pop("exact_duplicate") == 1
    assert removed.pop("near_duplicate") == 1
    assert removed.pop("not_utf8") == 1
    assert removed.pop("test_suite") == 5
    assert removed.pop("too_large") == 1
    assert removed.pop("vendored") == 1
    assert removed == {}
    totals = stats["totals"]
    assert totals["train"]["files"] == 4 and totals["heldout"]["files"] == 3
    packages = stats["packages"]
    assert packages["heldpkg"]["split"] == "heldout" and packages["heldpkg"]["origin"] == "sdist"
    assert json.loads((out / STATS).read_text())["totals"] == totals


def test_rebuild_replaces_the_splits(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = built
    stale = out / "train" / "stale" / "x.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("x = 1\n")
    result = build(out, packages=["goodpkg"], holdout=["goodpkg"])  # from the cache, no pip
    assert not stale.exists()
    assert {m["split"] for m in result.manifest} == {"heldout"}
    assert (out / ".cache" / "gplpkg").is_dir()  # downloads are kept


def test_max_mb_stops_adding_files(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    seed_cache(out)
    result = build(out, packages=["goodpkg"], max_mb=0.005)
    assert sum(m["bytes"] for m in result.manifest) <= 5000
    assert result.stats["removed"]["over_budget"] >= 1


def test_read_corpus_follows_the_manifest(built: tuple[Path, dict[str, Any]]) -> None:
    pytest.importorskip("torch")
    from engine.training.loop import read_corpus

    out, _ = built
    # a file outside the manifest is not read
    (out / "train" / "goodpkg" / "stray.py").write_text(code("stray"))
    train, held = read_corpus([str(out)], [])
    assert sorted(train) == sorted((out / p).read_text() for p in _paths(out, "train"))
    assert sorted(held) == sorted((out / p).read_text() for p in _paths(out, "heldout"))
    assert len(train) == 4 and len(held) == 3
    # a recipe may hold out more packages, never fewer
    train2, held2 = read_corpus([str(out)], ["goodpkg"])
    assert len(train2) == 2 and len(held2) == 5


def _paths(out: Path, split: str) -> list[str]:
    return [m["path"] for m in map(json.loads, (out / MANIFEST).read_text().splitlines()) if m["split"] == split]


def test_data_manifest_is_full_or_a_summary(built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    full = data_manifest([out])
    assert full == (out / MANIFEST).read_text()
    summary = [json.loads(line) for line in data_manifest([out], limit=100).splitlines()]
    assert {s["package"]: (s["files"], s["split"]) for s in summary} == {
        "stdlib:abc": (1, "train"),
        "stdlib:copy": (1, "train"),
        "stdlib:email": (2, "heldout"),
        "goodpkg": (2, "train"),
        "heldpkg": (1, "heldout"),
    }
    assert all(set(s) == {"package", "version", "license", "split", "files", "bytes"} for s in summary)


def test_command_line_fetches_with_pip_from_a_local_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real `pip download` path, kept offline with --find-links (implies --no-index)."""
    links = tmp_path / "links"
    make_wheel(links, "localpkg", "0.1", {"localpkg/__init__.py": code("local")}, "License: Apache 2.0")
    out = tmp_path / "corpus"
    assert main(["build", "--out", str(out), "--packages", "localpkg", "--find-links", str(links)]) == 0
    assert "train: 1 files" in capsys.readouterr().out
    assert (out / ".cache" / "localpkg" / "localpkg-0.1-py3-none-any.whl").is_file()
    (entry,) = [json.loads(line) for line in (out / MANIFEST).read_text().splitlines()]
    assert entry["package"] == "localpkg" and entry["license"] == "Apache-2.0"
    # a name pip cannot find is excluded and logged, not fatal
    assert main(["build", "--out", str(out), "--packages", "nosuchpkg", "--find-links", str(links)]) == 0
    stats = json.loads((out / STATS).read_text())
    assert stats["excluded_packages"][0]["package"] == "nosuchpkg"
    assert "fetch failed" in stats["excluded_packages"][0]["reason"]


def test_installed_distributions_are_read_without_download(tmp_path: Path) -> None:
    """--installed reads site-packages through each distribution's RECORD (pluggy is
    installed wherever pytest is; MIT)."""
    from importlib import metadata as im

    out = tmp_path / "corpus"
    result = build(out, installed=["pluggy"])
    assert result.manifest and {m["package"] for m in result.manifest} == {"pluggy"}
    assert {m["version"] for m in result.manifest} == {im.version("pluggy")}
    assert result.stats["packages"]["pluggy"]["origin"] == "installed"
    assert not (out / ".cache").exists() or not any((out / ".cache").iterdir())  # nothing fetched
    assert all(m["path"].startswith("train/pluggy/pluggy/") for m in result.manifest)
