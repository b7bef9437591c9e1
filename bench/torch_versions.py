"""Which torch releases the "shmcomm" torch.distributed backend works with: the backend's tests,
run against each given torch version in a fresh virtual environment. Not part of the test suite
(CI runs none of it): each version costs a torch download of its own.

For each version, one after the other (one venv on disk at a time)::

    python -m venv TMP/venv                        # with the Python running this script
    TMP/venv/bin/pip install torch==X pytest pytest-timeout ml_dtypes [numpy<2 for torch < 2.3]
    TMP/venv/bin/pip install -e SNAPSHOT           # shmcomm, built from a copy of the checkout
    cd TMP && TMP/venv/bin/python -m pytest -q -p no:cacheprovider SNAPSHOT/tests/test_torch_backend.py
    rm -r TMP/venv

and one line per version: the torch installed, passed/failed/skipped counts, and the first failure.
The full pytest output of each version is kept in a log file (its path is printed).

SNAPSHOT is a copy of the checkout's working tree (tracked and untracked files that git does not
ignore, edits included) made once per run, so that nothing is built in the checkout itself and
edits made there while the script runs do not reach it; the checkout's ``build/shmcomm-cache`` is
copied along, so an unchanged core is not compiled again. The install is editable because the
tests start their subprocesses with ``PYTHONPATH`` set to the tree they are in, which then needs
its compiled core in place (as after CI's ``pip install -e``).

On Linux x86-64, PyPI's torch wheels are CUDA builds: each version downloads 1-3 GB and takes
several GB in its venv, which is deleted once its tests ran (``--keep`` keeps it). pip's
configuration applies as usual (index, find-links, constraints), and its cache is not used; where
that configuration caps torch below a version to test, point ``PIP_CONSTRAINT`` at an empty file.

Reading the results: on older torch some tests fail for torch's sake, not shmcomm's. They compare
against gloo where that torch's gloo lacks the operation or gets it wrong, or call what that torch
does not have yet; the log says which (docs/torch.rst, "Supported torch versions", lists them).

Usage::

    python bench/torch_versions.py 2.6 2.13             # newest 2.6.x and 2.13.x
    python bench/torch_versions.py 2.11.0 --examples    # also tests/test_torch_examples.py
    python bench/torch_versions.py 2.8 -k "every_operation or ddp"   # a subset of the tests
    python bench/torch_versions.py 2.5 --checkout ../other-tree --workdir /scratch

A version with two parts (``2.6``) means its newest patch release (``torch==2.6.*``); one with
three is taken as given. The script exits 0 when every version passed (skips allowed), 1 otherwise.
Expect a few minutes a version: the download, the shmcomm build on first use (about a minute),
and the tests (a few minutes on two cores).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKEND_TESTS = "tests/test_torch_backend.py"
EXAMPLE_TESTS = "tests/test_torch_examples.py"
TEST_PACKAGES = ["pytest>=7", "pytest-timeout>=2.1", "ml_dtypes>=0.3"]


def requirement(version: str) -> str:
    """``2.6`` -> ``torch==2.6.*`` (newest patch release); ``2.6.0`` -> ``torch==2.6.0``."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(\S*)", version):
        raise SystemExit(f"not a torch version: {version!r}")
    return f"torch=={version}.*" if re.fullmatch(r"\d+\.\d+", version) else f"torch=={version}"


def needs_numpy_1(version: str) -> bool:
    """torch releases before 2.3 were built against numpy 1.x and fail to convert under numpy 2."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return (major, minor) < (2, 3)


def snapshot(checkout: Path, dest: Path) -> Path:
    """Copy the checkout's working tree (git's tracked and untracked, not ignored, files) to
    ``dest``, plus its build cache; without git, every file but build outputs."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=checkout, capture_output=True, check=True).stdout
        files = [f for f in listed.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "__pycache__", ".pytest_cache", ".mypy_cache"}
        files = [str(p.relative_to(checkout)) for p in checkout.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(checkout).parts)
                 and p.suffix not in (".so", ".pyc")]
    for name in files:
        src = checkout / name
        if src.is_file():  # a deleted, not yet committed file is still listed by git
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    cache = checkout / "build" / "shmcomm-cache"
    if cache.is_dir():
        shutil.copytree(cache, dest / "build" / "shmcomm-cache")
    return dest


def run(cmd: list[str], log, cwd: Path | None = None, env: dict | None = None) -> int:
    """Run ``cmd``, its output appended to ``log``; its exit status."""
    log.write(f"\n$ {' '.join(map(str, cmd))}\n")
    log.flush()
    return subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def summarize(report: Path) -> tuple[dict, str]:
    """Counts by outcome and the first failure (``test id: first line of its message``) of a
    pytest JUnit XML report."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    first = ""
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                if outcome != "skipped" and not first:
                    message = (child.get("message") or child.text or "").strip().splitlines()
                    first = f"{case.get('name')}: {message[0][:200] if message else '?'}"
                break
        counts[outcome] += 1
    return counts, first


def try_version(version: str, tree: Path, work: Path, args) -> tuple[bool, str]:
    """Install torch ``version`` and the snapshot ``tree`` in a new venv; run the backend's tests.
    Returns (passed, the line to print)."""
    place = work / f"torch-{version}"
    place.mkdir()
    venv = place / "venv"
    log_path = work / f"torch-{version}.log"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            pip = [str(python), "-m", "pip", "--no-cache-dir", "--disable-pip-version-check"]
            extra = ["numpy<2"] if needs_numpy_1(version) else []
            if run([sys.executable, "-m", "venv", str(venv)], log, env=env):
                return False, f"torch {version}: could not create a venv (log: {log_path})"
            if run([*pip, "install", requirement(version), *TEST_PACKAGES, *extra], log, env=env):
                return False, f"torch {version}: pip could not install it (log: {log_path})"
            if run([*pip, "install", "-e", str(tree)], log, env=env):
                return False, f"torch {version}: shmcomm did not build or install (log: {log_path})"
            installed = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                                       env=env, capture_output=True, text=True)
            label = installed.stdout.strip() or f"{version} (import torch failed)"
            tests = [str(tree / BACKEND_TESTS)] + ([str(tree / EXAMPLE_TESTS)] if args.examples else [])
            report = place / "report.xml"
            selection = ["-k", args.k] if args.k else []
            run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                 *selection, *tests], log, cwd=place, env=env)
        if not report.exists():
            return False, f"torch {label}: pytest wrote no report (log: {log_path})"
        counts, first = summarize(report)
        ok = counts["failed"] == counts["error"] == 0 and counts["passed"] > 0
        line = (f"torch {label}: {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['skipped']} skipped" + (f", {counts['error']} errors" if counts["error"] else "")
                + f" ({time.monotonic() - start:.0f} s)" + (f"; first failure: {first}" if first else ""))
        return ok, line
    finally:
        if not args.keep:
            shutil.rmtree(venv, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="+", help="torch versions, e.g. 2.6 or 2.11.0")
    parser.add_argument("--checkout", type=Path, default=REPO,
                        help="the shmcomm tree to test (default: the one holding this script)")
    parser.add_argument("--examples", action="store_true", help=f"also run {EXAMPLE_TESTS}")
    parser.add_argument("-k", help="pytest's -k: run only the tests it selects")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the snapshot, the venvs and the logs go (default: a new temporary "
                             "directory; the logs stay there)")
    parser.add_argument("--keep", action="store_true", help="keep each venv (several GB each)")
    args = parser.parse_args(argv)
    for version in args.versions:
        requirement(version)  # refuse a malformed version before any download

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shmcomm-torch-versions-", dir=args.workdir))
    print(f"working in {work} (logs: {work}/torch-VERSION.log)", flush=True)
    tree = snapshot(args.checkout.resolve(), work / "shmcomm")
    lines, failed = [], 0
    for version in args.versions:
        ok, line = try_version(version, tree, work, args)
        failed += not ok
        lines.append(line)
        print(line, flush=True)
    if len(lines) > 1:
        print("\n" + "\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
