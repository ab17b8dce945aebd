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

#: Circles (sorted module names, without the package prefix) still to break.
KNOWN_CYCLES: set[tuple[str, ...]] = {
    (
        "diffusers_pipelines.kinds",
        "diffusers_pipelines.pipe_call",
        "diffusers_pipelines.prompt_batch",
    ),
    ("diffusion.batching", "diffusion.service"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (absolute or relative)."""
    name = module_name(path)
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


def cycles() -> set[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan)."""
    paths = {module_name(p): p for p in BASE.rglob("*.py")}
    graph = {name: imports_of(path, set(paths)) for name, path in paths.items()}
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
    assert f"{PACKAGE}.diffusion.service" in imports_of(BASE / "diffusion" / "batching.py", paths)


def test_no_new_import_cycle_inside_models() -> None:
    """Every circle inside models/ is a known one still to break; a broken one is
    taken off the list."""
    found = cycles()
    assert found - KNOWN_CYCLES == set(), f"new import cycle(s): {sorted(found - KNOWN_CYCLES)}"
    assert KNOWN_CYCLES - found == set(), f"gone, remove from KNOWN_CYCLES: {KNOWN_CYCLES - found}"
