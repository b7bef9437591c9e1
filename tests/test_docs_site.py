"""The documentation site (docs/) builds with Sphinx in strict mode, and its pages cover the public
surface: every name of ``shmcomm.__all__`` and ``shmcomm.rpc.__all__``, every flag of the three
commands, every ``SHMCOMM_*`` variable the code reads, and only calls that exist in the migration
guides.

Skipped where Sphinx is not installed (``pip install -r docs/requirements.txt``). The build is the
one the docs describe::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("shmcomm._core")  # the API pages are generated from the compiled core

import shmcomm  # noqa: E402
from shmcomm import rpc  # noqa: E402

# the site is built once, by the one worker that runs this module
pytestmark = pytest.mark.xdist_group("docs_site")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

PAGES = ["index", "getting_started", "concepts", "api", "rpc", "torch", "launcher", "cli",
         "benchmarks", "troubleshooting", "from_torch_distributed", "from_mpi4py", "contract",
         "multinode"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Build the site once, strictly, into a temporary directory; fail with Sphinx's output."""
    out = tmp_path_factory.mktemp("docs_html")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL)
    log = f"$ {' '.join(cmd)}\n--- stdout (tail)\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, f"the strict docs build failed:\n{log}"
    assert "WARNING" not in proc.stderr, f"the docs build warned:\n{log}"
    return out


def _page(site: Path, name: str) -> str:
    return (site / f"{name}.html").read_text(encoding="utf-8")


def _ids(html: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', html))


@pytest.mark.timeout(300)
def test_build_is_strict_and_has_every_page(site):
    missing = [p for p in PAGES if not (site / f"{p}.html").is_file()]
    assert not missing, f"pages missing from the site: {missing}"
    assert "all_reduce" in _page(site, "api")
    assert (site / "genindex.html").is_file() and (site / "search.html").is_file()


@pytest.mark.timeout(300)
def test_api_page_documents_every_public_name(site):
    ids = _ids(_page(site, "api"))
    missing = [n for n in shmcomm.__all__ if f"shmcomm.{n}" not in ids]
    assert not missing, f"api.html has no entry for shmcomm.{missing}"
    for cls, methods in ((shmcomm.Work, ["wait", "is_completed", "is_success", "exception", "abort",
                                         "result", "get_future", "source_rank"]),
                         (shmcomm.Future, ["done", "set_result", "set_exception", "wait", "value",
                                           "then", "add_done_callback"])):
        absent = [m for m in methods if f"shmcomm.{cls.__name__}.{m}" not in ids]
        assert not absent, f"api.html lacks {cls.__name__}.{absent}"
    # compiled signatures are cleaned up (no Cython spelling left)
    text = _page(site, "api")
    assert "_SUM" not in text and "bint " not in text


@pytest.mark.timeout(300)
def test_rpc_and_torch_pages(site):
    ids = _ids(_page(site, "rpc"))
    names = [n for n in rpc.__all__ if n != "functions"] + ["functions.async_execution"]
    missing = [n for n in names if f"shmcomm.rpc.{n}" not in ids]
    assert not missing, f"rpc.html has no entry for shmcomm.rpc.{missing}"
    torch_ids = _ids(_page(site, "torch"))
    for name in ("register", "BACKEND_NAME", "ShmcommProcessGroup", "ShmcommWork"):
        assert f"shmcomm.torch.{name}" in torch_ids, name
    assert "init_process_group" in _page(site, "torch")


def _flags(module: str, *args: str) -> list[str]:
    """The option strings of a command's ``--help`` (one unwrapped line per option), ``-h`` and
    ``--help`` left out."""
    env = dict(os.environ, COLUMNS="1000")
    out = subprocess.run([sys.executable, "-m", module, *args, "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True, stdin=subprocess.DEVNULL, env=env).stdout
    flags = set()
    for line in out.splitlines():
        m = re.match(r"^ {2}(-\S.*?)(?: {2,}|$)", line)
        if m:
            flags.update(part.split()[0] for part in m.group(1).split(", "))
    return sorted(flags - {"-h", "--help"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, args, program, page", [
    ("shmcomm.launch", (), "shmrun", "launcher"),
    ("shmcomm.bench", (), "shmcomm-bench", "benchmarks"),
    ("shmcomm.cli", (), "shmcomm", "cli"),
    ("shmcomm.cli", ("ls",), "shmcomm-ls", "cli"),
    ("shmcomm.cli", ("clean",), "shmcomm-clean", "cli"),
])
def test_every_command_flag_is_documented(site, module, args, program, page):
    ids = _ids(_page(site, page))
    flags = _flags(module, *args)
    assert flags, f"no flags parsed from {module} {' '.join(args)} --help"
    missing = [f for f in flags if f"cmdoption-{program}-{f.lstrip('-')}" not in ids]
    assert not missing, f"{page}.html documents no option {missing} of {module} {' '.join(args)}"


def _environment_variables() -> set[str]:
    """Every SHMCOMM_* variable the code reads (os.environ / the core's settings helper)."""
    pattern = re.compile(r"""(?:environ\.get\(|environ\[|_env_bytes\(|getenv\()\s*["'](SHMCOMM_[A-Z0-9_]+)["']""")
    names: set[str] = set()
    for folder in ("shmcomm", "src_cython"):
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if path.suffix in (".py", ".pyx", ".pxi", ".h") and path.is_file():
                names.update(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


@pytest.mark.timeout(300)
def test_contract_documents_every_environment_variable(site):
    ids = _ids(_page(site, "contract"))
    names = _environment_variables() | {"SHMCOMM_SECRET", "SHMCOMM_JOB", "SHMCOMM_TIMEOUT"}
    missing = sorted(n for n in names if f"envvar-{n}" not in ids)
    assert not missing, f"contract.html documents no environment variable {missing}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("guide", ["from_torch_distributed", "from_mpi4py", "getting_started"])
def test_guides_name_only_existing_calls(site, guide):
    """Every ``sc.NAME`` a guide mentions exists (``pg.NAME``: a ProcessGroup method, ``w.NAME``:
    a Work method)."""
    text = (DOCS / f"{guide}.rst").read_text(encoding="utf-8")
    owners = {"sc": shmcomm, "pg": shmcomm.ProcessGroup, "w": shmcomm.Work}
    missing = sorted({f"{who}.{name}" for who, name in re.findall(r"\b(sc|pg|w)\.([A-Za-z_]\w*)", text)
                      if not hasattr(owners[who], name)})
    assert not missing, f"{guide}.rst names calls that do not exist: {missing}"
    assert (site / f"{guide}.html").is_file()


@pytest.mark.timeout(300)
def test_benchmark_figure_is_in_the_site(site):
    html = _page(site, "benchmarks")
    pngs = re.findall(r'src="(_images/[^"]+\.png)"', html)
    assert pngs, "benchmarks.html shows no figure"
    assert all((site / p).is_file() for p in pngs)
