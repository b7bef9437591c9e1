"""Packaging metadata and the sdist's contents, read from pyproject.toml and MANIFEST.in with
setuptools' own template rules: nothing is built (.ci/release_check builds and installs the sdist)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Where a checkout keeps what is not source: never walked, never shipped.
NOT_SOURCE = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", "_build"}


def _files(top: Path):
    """Every file under ``top`` that is source, relative to the repository root."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in NOT_SOURCE and not d.endswith(".egg-info")]
        for name in filenames:
            if not name.endswith((".pyc", ".so")):
                yield Path(dirpath, name).relative_to(ROOT).as_posix()


def _manifest() -> set[str]:
    """The files MANIFEST.in selects from the checkout, by setuptools' rules."""
    from setuptools._distutils.filelist import FileList

    selected = FileList()
    selected.set_allfiles(sorted(_files(ROOT)))
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            selected.process_template_line(line)
    return set(selected.files)


def test_classifiers_name_linux_and_the_pythons_wheels_are_built_for():
    """#33 item 10: the metadata had no classifiers at all."""
    classifiers = PROJECT["classifiers"]
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Typing :: Typed" in classifiers and (ROOT / "shmcomm" / "py.typed").is_file()
    assert not [c for c in classifiers if c.startswith("License ::")], "the license expression replaces them"
    listed = {c.rsplit(":: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    built = {f"3.{m}" for m in re.findall(r"cp3(\d+)-", PYPROJECT["tool"]["cibuildwheel"]["build"])}
    assert listed == built, (listed, built)
    oldest = PROJECT["requires-python"].removeprefix(">=")
    assert min(listed, key=lambda v: int(v.split(".")[1])) == oldest
    assert len(set(classifiers)) == len(classifiers) and all(" :: " in c for c in classifiers)


def test_project_urls_are_real_ones_or_none():
    """No placeholder URLs: the project names no homepage or repository yet."""
    for name, url in PROJECT.get("urls", {}).items():
        assert url.startswith("https://") and not re.search(r"example|todo|your-|<|>", url, re.I), (name, url)


def test_the_torch_entry_point_module_ships():
    assert PROJECT["entry-points"]["torch.backends"] == {"shmcomm": "_shmcomm_torch_entry:autoload"}
    modules = PYPROJECT["tool"]["setuptools"]["py-modules"]
    assert modules == ["_shmcomm_torch_entry"] and (ROOT / "_shmcomm_torch_entry.py").is_file()


def test_sdist_carries_the_tests_docs_and_examples():
    """#33 item 10: the sdist held the package and the C sources only."""
    shipped = _manifest()
    for top in ("tests", "docs", "examples"):
        wanted = set(_files(ROOT / top))
        assert wanted and wanted <= shipped, f"{top}/ files missing: {sorted(wanted - shipped)[:10]}"
    # what they use from elsewhere in the checkout: the figures
    for rst in (ROOT / "docs").glob("*.rst"):
        for target in re.findall(r"^\.\. (?:figure|image):: (\S+)", rst.read_text(), re.M):
            path = (ROOT / "docs" / target).resolve().relative_to(ROOT).as_posix()
            assert path in shipped, f"{rst.name} shows {target}, which the sdist lacks"
    assert {"src_cython/_core.pyx", "shmcomm/py.typed", "LICENSE", "README.md"} <= shipped
    assert not [f for f in shipped if f.endswith((".so", ".pyc")) or "__pycache__" in f
                or f.startswith("docs/_build/") or f == "src_cython/_core.c"]
