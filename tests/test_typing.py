"""Static typing: mypy accepts the stubs of the compiled core and the public modules (the files
and settings of ``[tool.mypy]`` in pyproject.toml), the return types that matter are what
tests/typing_usage.py pins, the calls marked there as errors are errors, and stubtest finds
shmcomm/_core.pyi true to the built module (tests/stubtest_allowlist.txt lists what Cython alone
makes differ).

Skipped where mypy is not installed (``pip install -e .[test]``). The mypy runs share one cache
in a temporary directory, so only the first reads numpy's stubs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("typing")  # one worker, one mypy cache

pytest.importorskip("mypy", reason="mypy is not installed (pip install 'shmcomm[test]')")

ROOT = Path(__file__).resolve().parent.parent
USAGE = ROOT / "tests" / "typing_usage.py"
IGNORE = re.compile(r"\s*# type: ignore\[([a-z-]+)\]\s*$")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MYPYPATH=str(ROOT))  # the checkout's stubs, whatever is installed
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def _mypy(cache_dir: Path, *files: str) -> subprocess.CompletedProcess:
    return _run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache_dir),
                "--no-color-output", "--show-error-codes", *files)


@pytest.mark.timeout(120)
def test_stubs_and_public_modules_type_check(cache_dir):
    proc = _mypy(cache_dir)  # the files of [tool.mypy]
    assert proc.returncode == 0, f"mypy found errors:\n{proc.stdout}{proc.stderr}"


@pytest.mark.timeout(60)
def test_usage_has_the_pinned_types(cache_dir):
    # --warn-unused-ignores: a call marked as an error that type-checks fails here too.
    proc = _mypy(cache_dir, "--warn-unused-ignores", str(USAGE))
    assert proc.returncode == 0, f"tests/typing_usage.py does not type-check:\n{proc.stdout}{proc.stderr}"


@pytest.mark.timeout(60)
def test_marked_calls_are_errors_of_their_code(cache_dir, tmp_path):
    """The usage file without its ``# type: ignore[code]`` comments: mypy must report an error of
    that code on each of those lines (a second check, not relying on warn_unused_ignores)."""
    lines = USAGE.read_text(encoding="utf-8").splitlines()
    expected = {}
    for number, line in enumerate(lines, 1):
        m = IGNORE.search(line)
        if m:
            expected[number] = m.group(1)
            lines[number - 1] = line[:m.start()]
    assert len(expected) >= 10, "tests/typing_usage.py lost its error cases"
    bare = tmp_path / "typing_usage_bare.py"
    bare.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = _mypy(cache_dir, str(bare))
    found = {(int(n), code) for n, code in
             re.findall(rf"^{re.escape(str(bare))}:(\d+): error: .*\[([a-z-]+)\]$", proc.stdout, re.M)}
    missing = [f"line {n}: [{code}] {lines[n - 1].strip()}" for n, code in expected.items()
               if (n, code) not in found]
    assert not missing, "these calls are no longer type errors of the expected code:\n" + \
        "\n".join(missing) + f"\n--- mypy:\n{proc.stdout}{proc.stderr}"
    unexpected = sorted({n for n, _ in found} - set(expected))
    assert not unexpected, f"errors on unmarked lines {unexpected}:\n{proc.stdout}"


@pytest.mark.timeout(60)
def test_stubtest_core():
    pytest.importorskip("shmcomm._core", reason="stubtest compares the stub with the built module")
    # --ignore-unused-allowlist: older mypy versions do not check some of what the list excuses.
    proc = _run("mypy.stubtest", "shmcomm._core", "--mypy-config-file", str(ROOT / "pyproject.toml"),
                "--allowlist", str(ROOT / "tests" / "stubtest_allowlist.txt"), "--ignore-unused-allowlist")
    assert proc.returncode == 0, f"stubtest: shmcomm/_core.pyi differs from the module:\n{proc.stdout}{proc.stderr}"


def test_the_engine_protocol_is_declared_once_in_the_stub():
    """#44 item 3: what every engine of a group provides is one declaration: the protocol
    ``Engine`` of ``shmcomm/_core.pyi``, which the stub's ``Communicator`` inherits without
    repeating a call; it declares exactly the calls ``GroupCore`` drives (``ENGINE_CALLS``), and
    ``shmcomm/group.py`` declares none of its own (static: read with ast)."""
    import ast

    from shmcomm.group import ENGINE_CALLS

    def methods(tree: ast.Module, cls: str) -> set[str]:
        [node] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        return {fn.name for fn in node.body if isinstance(fn, ast.FunctionDef)}

    stub = ast.parse((ROOT / "shmcomm" / "_core.pyi").read_text())
    assert methods(stub, "Engine") == set(ENGINE_CALLS)
    assert not methods(stub, "Communicator") & set(ENGINE_CALLS)
    [communicator] = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Communicator"]
    assert [ast.unparse(b) for b in communicator.bases] == ["Engine"]
    group = ast.parse((ROOT / "shmcomm" / "group.py").read_text())
    assert not any(isinstance(n, ast.ClassDef) and n.name == "Engine" for n in group.body)
