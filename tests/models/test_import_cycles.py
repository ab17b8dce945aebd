"""No module inside ``mortred_twisted/models/`` imports, directly or through others,
a module that imports it (issue 38): every import counts, lazy ones inside functions
too, since a circle of lazy imports is still two modules that each need the other.

The circles found before issue 38 are listed in :data:`KNOWN_CYCLES`; the list may
only shrink: a new circle fails, and so does a listed one that is gone (remove it).
Pure: reads the sources with :mod:`ast`, imports nothing of the package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "mortred_twisted.models"
BASE = ROOT / "mortred_twisted" / "models"

#: Circles (sorted module names, without the package prefix) still to break: none
#: since issue 38 broke ``diffusion.batching`` <-> ``service`` and
#: ``diffusers_pipelines.kinds`` <-> ``pipe_call`` <-> ``prompt_batch`` (the engines
#: depend on a Protocol of the model they step, not on the model's module).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (absolute or relative)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def cycles(base: Path = BASE, root: Path = ROOT) -> set[tuple[str, ...]]:
    """Strongly connected components of more than one module under ``base`` (Tarjan)."""
    paths = {module_name(p, root): p for p in base.rglob("*.py")}
    graph = {name: imports_of(path, set(paths), root) for name, path in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.add(tuple(sorted(c.removeprefix(PACKAGE + ".") for c in component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_reader_sees_imports() -> None:
    """The reader resolves absolute, ``from package import module`` and relative
    imports (else the cycle check below could pass by seeing nothing)."""
    paths = {module_name(p) for p in BASE.rglob("*.py")}
    loader = BASE / "transformers_tasks" / "loader.py"
    assert f"{PACKAGE}.transformers_tasks.common" in imports_of(loader, paths)
    service = BASE / "diffusion" / "service.py"
    assert f"{PACKAGE}.diffusion.batching" in imports_of(service, paths)


def test_a_lazy_or_type_only_circle_is_found(tmp_path: Path) -> None:
    """A circle made of a function-level import and a TYPE_CHECKING one is a circle."""
    package = tmp_path / "mortred_twisted" / "models" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from mortred_twisted.models.pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "c.py").write_text("from mortred_twisted.models.pkg.a import f\n")
    assert cycles(tmp_path / "mortred_twisted" / "models", tmp_path) == {("pkg.a", "pkg.b")}


def test_no_new_import_cycle_inside_models() -> None:
    """Every circle inside models/ is a known one still to break; a broken one is
    taken off the list."""
    found = cycles()
    assert found - KNOWN_CYCLES == set(), f"new import cycle(s): {sorted(found - KNOWN_CYCLES)}"
    assert KNOWN_CYCLES - found == set(), f"gone, remove from KNOWN_CYCLES: {KNOWN_CYCLES - found}"
