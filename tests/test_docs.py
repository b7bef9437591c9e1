"""Documentation checks, in one place: every public object (and public method) of shmcomm,
shmcomm.rpc, shmcomm.torch and shmcomm.torch_ops has a docstring with an example, every ``>>>`` example in the
compiled core and the Python modules runs as a doctest, the mpi4py guide does not contradict
itself, and the docs' conf.py documents a built shmcomm, never the checkout's uncompiled source
(these two need no Sphinx; tests/test_docs_site.py builds the site)."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest

import shmcomm
from shmcomm import _core


def _modules():
    names = ["shmcomm", "shmcomm.rpc"]
    try:
        import torch.distributed as dist

        if dist.is_available():
            names += ["shmcomm.torch", "shmcomm.torch_ops"]
    except ImportError:
        pass
    return [importlib.import_module(n) for n in names]


def _public(module):
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, (str, int)) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
            continue  # constants; error classes are documented in shmcomm.errors as a family
        yield f"{module.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (callable(member) or isinstance(member, property)):
                    continue
                yield f"{module.__name__}.{name}.{attr}", member


def _has_example(name: str, obj) -> bool:
    doc = inspect.getdoc(obj) or ""
    if isinstance(obj, property) or ".ReduceOp" in name:  # attributes and enum members: a line
        return bool(doc)
    return bool(doc) and ("Example" in doc or ">>>" in doc or "::" in doc)


@pytest.mark.timeout(60)
def test_every_public_object_has_a_docstring_with_an_example():
    missing = [name for module in _modules() for name, obj in _public(module)
               if not _has_example(name, obj)]
    assert not missing, f"public objects without a docstring and example: {missing}"


@pytest.mark.timeout(60)
def test_docstring_examples_run():
    globs = dict(vars(_core), sc=shmcomm, np=np, threading=threading, asyncio=asyncio)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    found = 0
    for module in [_core, *_modules()]:
        for test in finder.find(module, module.__name__, globs=dict(globs)):
            if test.examples and "__test__" not in test.name:  # Cython's copies of the same text
                found += 1
                runner.run(test)
    result = runner.summarize(verbose=False)
    assert found >= 10, f"only {found} docstrings with >>> examples found"
    assert result.failed == 0, f"{result.failed} docstring examples failed (output above)"


@pytest.mark.timeout(60)
def test_process_group_methods_share_the_module_functions_text():
    """One text per call: each ProcessGroup method's docstring is its module function's (copied
    at import by shmcomm.collectives), without the ``group`` argument; EngineGroup's twins of the
    methods (groups across nodes) have the same text, not a one-line pointer to it."""
    from shmcomm.collectives import _SHARED_DOCS
    from shmcomm.group import EngineGroup

    for name in _SHARED_DOCS:
        func, method = inspect.getdoc(getattr(shmcomm, name)), inspect.getdoc(getattr(shmcomm.ProcessGroup, name))
        assert func.splitlines()[0] == method.splitlines()[0], name
        for section in ("Args:", "Returns:", "Raises:", "Example"):
            assert section in func and section in method, (name, section)
        assert "    group (" in func and "    group (" not in method, name
        assert f"pg.{name}(" in method, name
        assert inspect.getdoc(getattr(EngineGroup, name)) == method, name


ROOT = Path(__file__).resolve().parent.parent


def test_mpi4py_guide_lists_nothing_as_missing_that_it_maps():
    """#33 item 9: the guide mapped ``comm.Split`` to ``sc.split`` and then listed "Split by
    color" under "Not in shmcomm". No MPI name may be both; Sendrecv and PROC_NULL are mapped."""
    text = (ROOT / "docs" / "from_mpi4py.rst").read_text()
    table, missing = text.split("\nNot in shmcomm:", 1)
    missing = missing.split("\n\n", 1)[0]
    mapped = set(re.findall(r"(?:comm|MPI|req|status)\.(\w+)", table))
    absent = {name.split(".")[-1] for name in re.findall(r"``([\w.]+)``", missing)}
    assert absent and not mapped & absent, f"both mapped and listed as missing: {mapped & absent}"
    assert "Split" not in missing
    assert {"Sendrecv", "PROC_NULL", "Split"} <= mapped


def test_docs_conf_imports_the_built_shmcomm_not_the_checkouts_source(tmp_path):
    """#33 item 9: after ``pip install .``, ``python -m sphinx`` run in the checkout puts it first on
    sys.path, and docs/conf.py imported the checkout's source package, which has no compiled core:
    the build crashed. A checkout without a built core, conf.py run as Sphinx does (its directory
    first on sys.path, as its path or as ""; no site, so no editable-install finder), must import the
    installed shmcomm."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "shmcomm", checkout / "shmcomm",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "_build_info.py"))
    shutil.copytree(ROOT / "docs", checkout / "docs", ignore=shutil.ignore_patterns("_build"))
    installed = str(Path(shmcomm.__file__).resolve().parent.parent)  # the built one this suite tests
    paths = sysconfig.get_paths()
    for first in (str(checkout), ""):
        code = (f"import runpy, sys; sys.path.insert(0, {first!r}); "
                f"sys.path += [{installed!r}, {paths['purelib']!r}, {paths['platlib']!r}]; "
                "runpy.run_path('docs/conf.py'); import shmcomm; print(shmcomm.__file__)")
        proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=checkout, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert Path(proc.stdout.strip()).resolve().is_relative_to(Path(installed)), proc.stdout


def test_torch_page_shows_lightning_and_accelerate():
    """#33 item 7: how Lightning and accelerate take the backend (neither is installed here): each
    example is valid Python, and accelerate's creates the group before the Accelerator."""
    text = (ROOT / "docs" / "torch.rst").read_text()
    section = text.split("Lightning and accelerate\n", 1)[1].split("\nAPI: ", 1)[0]
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section)
    code = ["\n".join(line[3:] for line in block.splitlines()) for block in blocks]
    for block in code:
        compile(block, "torch.rst", "exec")
    lightning, accelerate = code
    assert 'DDPStrategy(process_group_backend="shmcomm")' in lightning
    assert accelerate.index('init_process_group("shmcomm")') < accelerate.index("Accelerator(")
