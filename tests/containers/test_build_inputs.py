"""deploy/container/build_inputs.py and the build context (no container tool needed)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.containers.support import ROOT, build_inputs


def _ignore_lines() -> list[str]:
    lines = (ROOT / ".containerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_containerignore_allowlist_is_the_hashed_context() -> None:
    lines = _ignore_lines()
    assert lines[0] == "*"
    allowed = [line[1:] for line in lines if line.startswith("!")]
    assert sorted(allowed) == sorted(["Containerfile", *build_inputs.CONTEXT])
    assert (ROOT / ".dockerignore").resolve() == (ROOT / ".containerignore").resolve()


def test_every_path_the_containerfile_copies_is_in_the_context() -> None:
    context = set(build_inputs.CONTEXT)
    copied: list[str] = []
    for line in (ROOT / "Containerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            copied.extend(words[1:-1])
    assert copied
    for source in copied:
        assert any(source == c or source.startswith(c + "/") for c in context), source
        assert (ROOT / source).exists(), source


def test_requirements_are_setup_pys_with_the_torch_build_replaced() -> None:
    setup = ROOT / "setup.py"
    plain = build_inputs.install_requires(setup)
    tree = ast.parse(setup.read_text())
    call = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"
    )
    expected = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "install_requires"))
    assert plain == expected
    cpu = build_inputs.install_requires(setup, "torch==2.13.0+cpu")
    assert [r for r in cpu if r.startswith("torch")] == ["torch==2.13.0+cpu"]
    assert [r for r in cpu if not r.startswith("torch")] == [
        r for r in plain if not r.startswith("torch")
    ]
    assert "torch==2.13.0" in plain  # the pin the CPU label must agree with


def test_hash_covers_contents_and_build_arguments(tmp_path: Path) -> None:
    root = tmp_path
    (root / "Containerfile").write_text("FROM x\n")
    (root / "setup.py").write_text("setup()\n")
    package = root / "mortred_twisted"
    package.mkdir()
    (package / "a.py").write_text("A = 1\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    first = build_inputs.inputs_hash(root)
    # caches are not inputs; contents and build arguments are
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"other junk")
    assert build_inputs.inputs_hash(root) == first
    assert build_inputs.inputs_hash(root, ["BASE_IMAGE=x"]) != first
    (package / "a.py").write_text("A = 2\n")
    assert build_inputs.inputs_hash(root) != first
