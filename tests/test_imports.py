"""No import cycles, and the layers of docs/architecture.md hold (``uv run lint-imports``).

The cycle check reads the source with ``ast``, so it sees every import Python would run: module level,
inside functions (a deferred import still closes a loop, it only moves the failure to run time), and
``importlib.import_module("fleet_rlm...")`` with a literal name. Imports under ``if TYPE_CHECKING:`` do
not count: they never run, so they cannot leave a module half-initialised, and annotations naming each
other are how two collaborating modules describe their seam (import-linter is set to skip them too).
``from pkg import name`` reads ``pkg/__init__.py`` as well, so a package that re-exports a submodule
whose own imports go through the package is a cycle, as Python would execute it. A module-level
``__getattr__`` (PEP 562: ``fleet_rlm``, ``fleet_rlm.agent``) is the lazy alternative: it runs only when
someone reads a name from a package that has finished importing, so its imports are not edges.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCE_ROOTS = (ROOT / "server", ROOT / "shell")
PACKAGES = ("fleet_rlm", "fleet_shell")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

Graph = dict[str, set[str]]


def find_modules(roots: tuple[Path, ...], packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the packages (``__init__`` names its package)."""
    modules: dict[str, Path] = {}
    for root in roots:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[0] in packages and "__pycache__" not in parts:
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _never_at_import(tree: ast.Module) -> set[int]:
    """Ids of the nodes that never run while modules import: ``if TYPE_CHECKING:`` blocks and a
    module-level ``__getattr__`` (PEP 562)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in {getattr(test, "id", None), getattr(test, "attr", None)}:
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    lazy = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    skipped.update(id(inner) for fn in lazy for inner in ast.walk(fn))
    return skipped


def _base_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def _importlib_target(node: ast.Call) -> str | None:
    """``import_module("x")`` or ``to_thread(import_module, "x")``: the literal module name, if any."""
    names = [node.func, *node.args]
    if not any(getattr(n, "attr", getattr(n, "id", None)) == "import_module" for n in names):
        return None
    literals = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return literals[0] if literals else None


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name the module imports at run time (candidates: not yet matched to a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _never_at_import(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(module, path.name == "__init__.py", node)
            yield base  # ``from pkg import x`` runs pkg/__init__.py and reads its namespace
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and (target := _importlib_target(node)):
            yield target


def import_graph(modules: dict[str, Path]) -> Graph:
    """Module -> the package modules it imports (a name that is not a module counts as its module)."""
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        for target in imported_names(name, path):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # ``from m import func`` -> m
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while (member := stack.pop()) != node:
                        on_stack.discard(member)
                        component.append(member)
                    on_stack.discard(node)
                    if component:
                        found.append(sorted([node, *component]))
    return found


def describe(component: list[str], graph: Graph) -> str:
    edges = [f"  {m} -> {', '.join(sorted(graph[m] & set(component)))}" for m in component]
    return "cycle: " + " / ".join(component) + "\n" + "\n".join(edges)


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(find_modules(SOURCE_ROOTS, PACKAGES))
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cycle_finder_sees_deferred_relative_and_reexport_loops_but_not_annotations(tmp_path: Path) -> None:
    lazy = "import importlib\n\ndef __getattr__(name):\n    return importlib.import_module('pkg.lazy.e')\n"
    _write(tmp_path, {
        # A re-export: pkg/__init__ imports app, app reads the package to get its sibling.
        "pkg/__init__.py": "from pkg.app import make\n",
        "pkg/app.py": "from pkg import routes\n",
        "pkg/routes.py": "X = 1\n",
        # Deferred, relative and by importlib: still a loop.
        "pkg/a.py": "def f():\n    from . import b\n",
        "pkg/b.py": "import importlib\nimportlib.import_module('pkg.a')\n",
        # Annotations only on one side, and a lazy PEP 562 re-export: no loop at import time.
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import D\n",
        "pkg/d.py": "from pkg.c import C\n",
        "pkg/lazy/__init__.py": lazy,
        "pkg/lazy/e.py": "from pkg.lazy import f\n",
        "pkg/lazy/f.py": "",
    })  # fmt: skip
    graph = import_graph(find_modules((tmp_path,), ("pkg",)))
    assert sorted(cycles(graph)) == [["pkg", "pkg.app"], ["pkg.a", "pkg.b"]]


def _lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_layers_contract_holds() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize(
    ("module", "imports", "contract"),
    [
        ("fleet_rlm/web/planted.py", "from fleet_rlm.cli import common", "never import each other"),
        ("fleet_rlm/core/planted.py", "import fleet_rlm.agent.tools", "Core imports no face and no service"),
        ("fleet_rlm/store/planted.py", "from fleet_rlm.core.engine import Engine", "no runtime module of core"),
        ("fleet_rlm/web/planted.py", "from fleet_rlm.store import Store", "only through core and the seams"),
        ("fleet_rlm/mcp/planted.py", "import fleet_rlm.sandbox.local", "only through core and the seams"),
    ],
)
def test_lint_imports_names_a_planted_violation(tmp_path: Path, module: str, imports: str, contract: str) -> None:
    """A copy of the package with one forbidden import fails the contract, naming it (the checkout is untouched)."""
    skip = shutil.ignore_patterns("__pycache__", "ui")
    shutil.copytree(ROOT / "server" / "fleet_rlm", tmp_path / "server" / "fleet_rlm", ignore=skip)
    shutil.copytree(ROOT / "shell" / "fleet_shell", tmp_path / "shell" / "fleet_shell", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "server" / module).write_text(imports + "\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'server'}{os.pathsep}{tmp_path / 'shell'}"}
    done = _lint_imports(tmp_path, env)
    planted = module.removesuffix(".py").replace("/", ".")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{planted} ->" in done.stdout and contract in done.stdout


# -- the faces never reach the store or the volume store by attribute (issue 19) --------------------
# import-linter sees imports only: a face that reads ``engine.workspace.store`` imports nothing, yet
# skips the operations every face shares. These attributes are the backends' handles.

FACE_ROOTS = (ROOT / "server" / "fleet_rlm" / "cli", ROOT / "server" / "fleet_rlm" / "mcp",
              ROOT / "server" / "fleet_rlm" / "web", ROOT / "shell" / "fleet_shell")  # fmt: skip
BACKEND_HANDLES = frozenset({"store", "_models", "_spawn"})
# ``engine.volumes`` (and ``workspace.volumes``) is the volume store: read off a name or an attribute.
# Off a call it is a view's field (``workspace.volume_list().volumes``); ``x.volumes()`` is a face's own
# method and ``fleet_rlm.volumes`` the module: neither counts.
VOLUMES = "volumes"


def _module_path(node: ast.expr) -> bool:
    """Whether ``node`` is a dotted name rooted at one of our packages (``fleet_rlm.web``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in PACKAGES


def _handle_read(node: ast.expr, called: set[int]) -> str | None:
    """The backend handle ``node`` reads: ``x.store``, ``x.volumes`` (see above), or ``getattr(x, "store")``
    with a literal name. ``called``: ids of the expressions that are called."""
    if isinstance(node, ast.Attribute) and node.attr in BACKEND_HANDLES:
        return node.attr
    if isinstance(node, ast.Attribute) and node.attr == VOLUMES:
        off_a_handle = isinstance(node.value, ast.Name | ast.Attribute) and not _module_path(node.value)
        return VOLUMES if off_a_handle and id(node) not in called else None
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr"):
        name = node.args[1] if len(node.args) > 1 else None
        if isinstance(name, ast.Constant) and name.value in BACKEND_HANDLES | {VOLUMES}:
            return str(name.value)
    return None


def backend_reads(roots: tuple[Path, ...]) -> list[str]:
    """``file:line: .name`` for every read of a backend handle in the modules under ``roots``."""
    found: list[tuple[Path, int, str]] = []
    for root in roots:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
            exprs = (n for n in ast.walk(tree) if isinstance(n, ast.expr))
            found += [(path.relative_to(root.parent), e.lineno, h) for e in exprs if (h := _handle_read(e, called))]
    return [f"{path}:{line}: .{handle}" for path, line, handle in sorted(found)]


def test_the_faces_reach_no_backend_handle() -> None:
    found = backend_reads(FACE_ROOTS)
    why = ("the faces call an operation (core.operations, Workspace, AgentHost, fleet_rlm.optimize), never the "
           "store or the volume store")  # fmt: skip
    assert not found, why + ":\n" + "\n".join(found)


# A face's own names that merely contain or equal "volumes": none is a handle.
CLEAN_FACE = """\
import fleet_rlm.volumes
from fleet_rlm.web import volumes

def ok(engine, api):
    uri = fleet_rlm.volumes.volume_uri("notes")
    names = [v.name for v in engine.workspace.volume_list().volumes]
    return engine.workspace.run('last'), names, api.volumes(), volumes.routes, uri
"""


@pytest.mark.parametrize(
    ("snippet", "named"),
    [
        ("def rows(engine):\n    return engine.workspace.store.runs.list()\n", "web/planted.py:2: .store"),
        ("def lms(engine):\n    return getattr(engine, '_models')\n", "web/planted.py:2: ._models"),
        ("async def box(engine, req):\n    await engine._spawn(req)\n", "web/planted.py:2: ._spawn"),
        ("def put(call):\n    return call.engine.volumes.write('v', 'memory/a', 'x')\n", "web/planted.py:2: .volumes"),
        ("def ls(ws):\n    return ws.workspace.volumes.names()\n", "web/planted.py:2: .volumes"),
        ("def store(engine):\n    return getattr(engine, 'volumes')\n", "web/planted.py:2: .volumes"),
    ],
)
def test_a_planted_backend_read_is_named(tmp_path: Path, snippet: str, named: str) -> None:
    face = tmp_path / "web"
    _write(face, {"clean.py": CLEAN_FACE, "planted.py": snippet})
    assert backend_reads((face,)) == [named]
