"""Architecture rules, checked statically (nothing is imported or built):

* no import cycle among the ``shmcomm`` modules: each package's modules import each other
  directly, never back through a package ``__init__`` that imports them;
* no module of ``shmcomm/`` or ``src_cython/`` holds more than ``MAX_CODE_LINES`` lines of code
  (blank lines, comments and docstrings not counted): a file that every change touches is too
  big, split it by concept;
* ``_core.pyx`` includes its files in dependency order: no free function calls a function of a
  file included after its own (a ``cdef class`` body may: Cython cannot split one across files,
  so ``Communicator``'s entry points reach forward into the families they start);
* no text names a file of the project that does not exist (a path under ``shmcomm/``,
  ``src_cython/``, ``tests/``, ``bench/``, ``docs/``, ``examples/`` or ``.ci/``, or a ``.pxi``).

What is known and being fixed elsewhere is listed below with its reason; the lists only shrink.

Run alone to print the figures: ``python tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shmcomm"
CYTHON = ROOT / "src_cython"
MAX_CODE_LINES = 500

# Files allowed over MAX_CODE_LINES (relative to the root), with why.
OVERSIZE_EXEMPT = {
    "src_cython/future.pxi": "the compiled Future, one concept; exempt in issue #30",
}
OVERSIZE_BEING_SPLIT: dict = {}

# Imports (importer, imported) tolerated inside a cycle for now, with why; every other import of
# the cycle is still checked, so a new cycle through these modules fails.
CYCLE_ALLOWED: dict = {}

SOURCE_SUFFIXES = (".py", ".pyx", ".pxi", ".pxd", ".h", ".c")
GENERATED = {"src_cython/_core.c"}   # Cython's output for _core.pyx


# ---- lines of code ---------------------------------------------------------------------------
def code_lines(path: Path) -> int:
    """Lines holding code: blank lines, comments and docstrings (string statements) not counted."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".h", ".c"):
        return _c_code_lines(text)
    return _python_code_lines(text)


def _python_code_lines(text: str) -> int:
    # Token based, so it reads Cython as well (cdef, casts, pointers are ordinary tokens).
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    lines: set[int] = set()
    statement: list[tokenize.TokenInfo] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in skip:
            if tok.type == tokenize.NEWLINE and statement:
                _count(statement, lines)
                statement = []
            continue
        statement.append(tok)
    if statement:
        _count(statement, lines)
    return len(lines)


def _count(statement: list, lines: set) -> None:
    if all(tok.type == tokenize.STRING for tok in statement):
        return   # a docstring, or a string standing alone as a comment
    for tok in statement:
        lines.update(range(tok.start[0], tok.end[0] + 1))


def _c_code_lines(text: str) -> int:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return sum(1 for line in text.splitlines() if line.split("//", 1)[0].strip())


def source_files() -> list[Path]:
    """Hand-written sources: shmcomm/ (Python; stubs left out) and src_cython/ (Cython and C;
    the generated ``_core.c`` left out)."""
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    files += [p for p in CYTHON.rglob("*") if p.suffix in SOURCE_SUFFIXES
              and p.relative_to(ROOT).as_posix() not in GENERATED]
    return sorted(files)


def oversize(exempt: dict) -> dict[str, int]:
    found = {}
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        n = code_lines(path)
        if n > MAX_CODE_LINES and rel not in exempt:
            found[rel] = n
    return found


def test_no_module_over_the_size_limit():
    found = oversize({**OVERSIZE_EXEMPT, **OVERSIZE_BEING_SPLIT})
    assert not found, (f"over {MAX_CODE_LINES} lines of code (blank lines, comments and docstrings "
                       f"not counted); split by concept: {found}")


def test_size_allow_list_is_still_needed():
    """An entry whose file was split (or removed) should leave the list, so that it cannot cover a
    new one. A warning, not a failure: the split lands in another change than this file's."""
    stale = [rel for rel in OVERSIZE_BEING_SPLIT
             if not (ROOT / rel).exists() or code_lines(ROOT / rel) <= MAX_CODE_LINES]
    if stale:
        warnings.warn(f"split or gone, remove from OVERSIZE_BEING_SPLIT: {stale}", stacklevel=1)


# ---- import graph ----------------------------------------------------------------------------
def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_level_imports(tree: ast.AST):
    """Import statements that run when the module is imported: not inside functions (they run
    later), not under ``if TYPE_CHECKING:`` (never at run time)."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {shmcomm module it imports at module level: line of the first such import}.

    ``import a.b`` leads to ``a.b``. ``from a import x`` leads to ``a`` (it reads ``a``'s
    namespace, which for a package is its ``__init__``) and, where ``a.x`` is a module, to ``a.x``
    too. So ``from . import sibling`` inside a package whose ``__init__`` imports the importer is
    a cycle: import the sibling module itself (``from .sibling import name``).
    """
    files = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    # compiled modules (``_core``), known by their stubs: leaves of the graph
    known = set(files) | {module_name(p) for p in PACKAGE.rglob("*.pyi")}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in module_level_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = mod.split(".")
                    base = base[:len(base) - node.level + (1 if is_package else 0)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [source] + [f"{source}.{alias.name}" for alias in node.names]
            for target in targets:
                target = _known(target, known)
                if target and target != mod:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[mod] = edges
    return graph


def _known(name: str, known: set) -> str | None:
    """``name`` or the closest enclosing module that exists in shmcomm (None: not shmcomm's)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def cycles(graph: dict[str, dict[str, int]], allowed=()) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds an import cycle),
    the imports of ``allowed`` (``(importer, imported)`` pairs) left out."""
    graph = {m: {e for e in es if (m, e) not in allowed} for m, es in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:   # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: list[str], graph: dict[str, dict[str, int]], allowed=()) -> str:
    """One shortest cycle of ``component``, as the imports that make it (``file:line imports m``)."""
    inside = set(component)
    best: list[str] = []
    for start in component:   # breadth first from each module back to itself
        paths = {start: [start]}
        queue = [start]
        while queue:
            m = queue.pop(0)
            nexts = [t for t in sorted(graph[m]) if t in inside and (m, t) not in allowed]
            if start in nexts:
                if not best or len(paths[m]) + 1 < len(best):
                    best = paths[m] + [start]
                break
            for t in nexts:
                if t not in paths:
                    paths[t] = paths[m] + [t]
                    queue.append(t)
    lines = []
    for m, target in zip(best, best[1:]):
        path = ROOT / m.replace(".", "/") / "__init__.py"
        if not path.exists():
            path = (ROOT / m.replace(".", "/")).with_suffix(".py")
        lines.append(f"  {path.relative_to(ROOT).as_posix()}:{graph[m][target]} imports {target}")
    return f"{len(component)} modules tied together, for example:\n" + "\n".join(lines)


def test_no_import_cycle():
    graph = import_graph()
    found = cycles(graph, CYCLE_ALLOWED)
    assert not found, "import cycles among shmcomm modules (module-level imports):\n" + \
        "\n".join(describe(c, graph, CYCLE_ALLOWED) for c in found)


def test_cycle_allow_list_is_still_needed():
    """An allowed import that no longer closes a cycle (gone, or fixed) should leave the list."""
    graph = import_graph()
    full = cycles(graph)
    needed = {(m, e) for c in full for m in c for e in graph[m] if e in c}
    stale = [edge for edge in CYCLE_ALLOWED if edge not in needed]
    if stale:
        warnings.warn(f"no longer in a cycle, remove from CYCLE_ALLOWED: {stale}", stacklevel=1)


# ---- include order of the compiled module ----------------------------------------------------
def _code_only(text: str) -> list[str]:
    """``text``'s lines without docstrings, string literals and comments (a name in a message is
    not a call)."""
    text = re.sub(r'"""(.*?)"""', lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    text = re.sub(r'f?"(?:[^"\\\n]|\\.)*"', '""', text)
    return [line.split("#", 1)[0] for line in text.splitlines()]


def forward_calls() -> dict[tuple[str, str], list[str]]:
    """(file, later file it calls into) -> the functions called, for the free functions and
    module-level statements of every file ``_core.pyx`` includes."""
    order = re.findall(r'^include "([^"]+)"', (CYTHON / "_core.pyx").read_text(), re.M)
    defined: dict[str, int] = {}
    for i, name in enumerate(order):
        for line in _code_only((CYTHON / name).read_text()):
            m = re.match(r"(?:cdef|cpdef|def)\b(?!\s+extern)[^(=]*?(\w+)\s*\(", line) or \
                re.match(r"cdef class (\w+)", line)
            if m:
                defined.setdefault(m.group(1), i)
    found: dict[tuple[str, str], set[str]] = {}
    for i, name in enumerate(order):
        in_class = False
        for line in _code_only((CYTHON / name).read_text()):
            if re.match(r"\S", line):
                in_class = bool(re.match(r"(?:cdef )?class ", line))
            if in_class or re.match(r"\s*(?:cdef|cpdef|def)\s", line):
                continue
            for m in re.finditer(r"(?<![\w.])(\w+)\s*\(", line):
                later = defined.get(m.group(1), -1)
                if later > i:
                    found.setdefault((name, order[later]), set()).add(m.group(1))
    return {k: sorted(v) for k, v in sorted(found.items())}


def test_includes_come_in_dependency_order():
    found = forward_calls()
    assert not found, ("free functions calling into files _core.pyx includes after their own "
                       f"(move the callee's file up, or the shared helper into an earlier file): {found}")


# ---- files the text names --------------------------------------------------------------------
_FILE_REF = re.compile(r"(?<![\w/.$*{<-])((?:shmcomm|src_cython|tests|bench|docs|examples|\.ci)/"
                       r"(?:[\w.-]+/)*[\w-]+\.(?:py|pyx|pxi|pxd|pyi|h|c|cpp|sh|rst|md|txt|json|toml)"
                       r"|[\w-]+\.(?:pxi|pyx|pxd))(?![\w/*{])")


def dead_file_references() -> dict[str, list[str]]:
    """Names of project files, in the project's text, that exist nowhere: file -> names."""
    found: dict[str, list[str]] = {}
    roots = ["shmcomm", "src_cython", "tests", "bench", "docs", "examples", ".ci"]
    texts = [p for r in roots for p in (ROOT / r).rglob("*") if p.is_file()
             and (p.suffix in (".py", ".pyx", ".pxi", ".pxd", ".pyi", ".h", ".c", ".rst", ".md", ".sh", ".txt")
                  or p.parent.name == ".ci")
             and "__pycache__" not in p.parts and "_build" not in p.parts
             and p.relative_to(ROOT).as_posix() not in GENERATED]
    for path in texts + [ROOT / "README.md"]:
        for m in _FILE_REF.finditer(path.read_text(encoding="utf-8", errors="replace")):
            ref = m.group(1)
            if not any((base / ref).exists() for base in (ROOT, CYTHON, CYTHON / "coll", path.parent)):
                found.setdefault(path.relative_to(ROOT).as_posix(), []).append(ref)
    return found


def test_no_text_names_a_file_the_project_does_not_have():
    found = dead_file_references()
    assert not found, f"files named but not in the project (moved or renamed?): {found}"


if __name__ == "__main__":
    sizes = sorted(((code_lines(p), p.relative_to(ROOT).as_posix()) for p in source_files()), reverse=True)
    for n, rel in sizes[:int(sys.argv[1]) if len(sys.argv) > 1 else 15]:
        print(f"{n:6d}  {rel}")
    g = import_graph()
    for c in cycles(g):
        print("cycle (allowed imports included):\n" + describe(c, g))
    print("cycles left after CYCLE_ALLOWED:", cycles(g, CYCLE_ALLOWED) or "none")
