"""What the image is built from, read without installing anything (stdlib only).

Used in three places, so the three agree:

* the Containerfile's build stage: ``requirements`` prints ``setup.py``'s
  ``install_requires`` (read with :mod:`ast`, as ``setup.py`` reads its own tables),
  with the torch requirement replaced by the build's ``TORCH_SPEC``, so the heavy
  dependencies are a layer of their own that a source change does not rebuild;
* ``deploy/container/build-image.sh``: ``version`` (the image tag) and ``hash``;
* ``tests/containers``: ``hash`` names the image built from exactly these inputs, so a
  test run reuses an image whose inputs have not changed.

``hash`` covers every file the build context lets in (:data:`CONTEXT`, the allowlist
of ``.containerignore``), the Containerfile, and the build arguments given; file
contents, not times, so a fresh clone of the same commit hashes the same.

Usage::

    python3 deploy/container/build_inputs.py requirements [--torch torch==2.13.0+cpu]
    python3 deploy/container/build_inputs.py version
    python3 deploy/container/build_inputs.py hash [KEY=VALUE ...]
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the paths the build context holds (keep equal to .containerignore's "!" lines)
CONTEXT = (
    "setup.py",
    "pyproject.toml",
    "mortred_twisted",
    "twisted_plugins",
    "client",
    "conf",
    "weights",
    "examples",
    "deploy/container",
)
#: never part of the context, wherever they are (.containerignore's last lines)
SKIPPED_PARTS = frozenset({"__pycache__", "build", "dist", ".pytest_cache"})
SKIPPED_SUFFIXES = (".pyc", ".egg-info")


def _setup_call(setup_py: Path) -> ast.Call:
    tree = ast.parse(setup_py.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup":
            return node
    raise SystemExit(f"{setup_py}: no setup(...) call")


def _keyword(call: ast.Call, name: str) -> ast.expr:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    raise SystemExit(f"setup.py: setup() has no {name}=")


def install_requires(setup_py: Path, torch_spec: str = "") -> list[str]:
    """``install_requires`` of ``setup_py``; ``torch_spec`` replaces the torch line."""
    requirements = ast.literal_eval(_keyword(_setup_call(setup_py), "install_requires"))
    if torch_spec:
        requirements = [torch_spec if _name(r) == "torch" else r for r in requirements]
    return requirements


def _name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower()
    return requirement.lower()


def version(setup_py: Path) -> str:
    """``version=`` of ``setup_py`` (a literal)."""
    return str(ast.literal_eval(_keyword(_setup_call(setup_py), "version")))


def context_files(root: Path = ROOT) -> Iterator[Path]:
    """Every file of the build context, sorted (paths relative to ``root``)."""
    found: list[Path] = []
    for entry in CONTEXT:
        path = root / entry
        candidates: Iterable[Path] = [path] if path.is_file() else path.rglob("*")
        for file in candidates:
            rel = file.relative_to(root)
            if any(part in SKIPPED_PARTS or part.endswith(SKIPPED_SUFFIXES) for part in rel.parts):
                continue
            if file.is_file() and not file.is_symlink():
                found.append(rel)
    return iter(sorted(found))


def inputs_hash(root: Path = ROOT, build_args: Iterable[str] = ()) -> str:
    """sha256 of the Containerfile, the context's files (path and bytes) and the
    build arguments (sorted ``KEY=VALUE``)."""
    digest = hashlib.sha256()
    for rel in [Path("Containerfile"), *context_files(root)]:
        digest.update(str(rel).encode() + b"\0")
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    for arg in sorted(build_args):
        digest.update(b"arg\0" + arg.encode() + b"\0")
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    setup_py = ROOT / "setup.py"
    if command == "requirements":
        torch_spec = rest[1] if rest[:1] == ["--torch"] and len(rest) > 1 else ""
        print("\n".join(install_requires(setup_py, torch_spec)))
    elif command == "version":
        print(version(setup_py))
    elif command == "hash":
        print(inputs_hash(ROOT, rest))
    else:
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
