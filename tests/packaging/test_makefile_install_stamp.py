"""`make run-model` (and run, test) reinstall the package only when something pip reads
changed (issue 36.4: every start took ~4 s and printed setuptools' warnings). The real
Makefile on a scratch copy of the tree's shape, with a fake venv whose python and
twistd only log their calls: fast, no pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    "pyproject.toml",
    "setup.py",
    "requirements/s3-test.txt",
    "mortred_twisted/__init__.py",
    "mortred_twisted/ui/static/index.html",
    "mortred_twisted/stores/lua/claim.lua",
    "twisted_plugins/mortred_plugins.py",
    "client/pyproject.toml",
    "client/mortred_client/__init__.py",
]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    if shutil.which("make") is None:  # pragma: no cover - make is a documented prerequisite
        pytest.skip("no make")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for name in SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("# source\n")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "twistd", "trial"):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        script.chmod(0o755)
    past = time.time() - 100  # the checkout and the venv were made long before
    for path in tmp_path.rglob("*"):
        os.utime(path, (past, past))
    return tmp_path


def make(tree: Path, *args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args], cwd=tree, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def installs(tree: Path) -> int:
    log = tree / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum("-m pip install -q ./client" in line for line in lines)


def later(tree: Path) -> None:
    """Time passes after an install (file times are coarse: a change made within the
    same tick as the stamp would not be newer than it)."""
    stamp = tree / ".venv" / ".mortred-installed"
    past = time.time() - 10
    os.utime(stamp, (past, past))
    os.utime(tree / ".venv" / ".mortred-sources", (past, past))


def test_run_model_installs_once_then_starts_without_installing(tree: Path) -> None:
    make(tree, "run-model")
    assert installs(tree) == 1
    later(tree)
    for _ in range(2):
        make(tree, "run-model")
    assert installs(tree) == 1
    twistd = [line for line in (tree / "calls.log").read_text().splitlines() if "twistd" in line]
    assert len(twistd) == 3 and "mortred-model" in twistd[-1]
    assert "pip install" not in make(tree, "-n", "run-model")


@pytest.mark.parametrize("source", SOURCES)
def test_a_changed_source_file_installs_again(tree: Path, source: str) -> None:
    make(tree, "run-model")
    later(tree)
    (tree / source).write_text("# changed\n")
    assert "pip install -q ./client" in make(tree, "-n", "run-model")
    assert "pip install -q ./client" in make(tree, "-n", "test")
    make(tree, "run-model")
    assert installs(tree) == 2


@pytest.mark.parametrize("change", ["add", "remove", "rename"], ids=lambda c: c)
def test_an_added_removed_or_renamed_file_installs_again(tree: Path, change: str) -> None:
    """Even when no file is newer: a module deleted from the checkout must leave the
    installed copy too."""
    extra = tree / "mortred_twisted" / "old.py"
    extra.write_text("x = 1\n")
    past = time.time() - 60
    os.utime(extra, (past, past))
    make(tree, "run-model")
    later(tree)
    if change == "add":
        new = tree / "mortred_twisted" / "new.py"
        new.write_text("y = 2\n")
        os.utime(new, (past, past))  # an old file copied in keeps its old time
    elif change == "remove":
        extra.unlink()
    else:
        extra.rename(tree / "mortred_twisted" / "renamed.py")
    assert "pip install -q ./client" in make(tree, "-n", "run-model")
    make(tree, "run-model")
    assert installs(tree) == 2
    later(tree)
    make(tree, "run-model")
    assert installs(tree) == 2


def test_caches_and_build_outputs_are_no_sources(tree: Path) -> None:
    """Bytecode, the client's build folder and egg-info do not trigger an install."""
    make(tree, "run-model")
    later(tree)
    (tree / "mortred_twisted" / "__pycache__").mkdir()
    (tree / "mortred_twisted" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"pyc")
    (tree / "client" / "build" / "lib").mkdir(parents=True)
    (tree / "client" / "build" / "lib" / "x.py").write_text("")
    (tree / "client" / "mortred_client.egg-info").mkdir()
    (tree / "client" / "mortred_client.egg-info" / "PKG-INFO").write_text("")
    make(tree, "run-model")
    assert installs(tree) == 1


def test_make_install_always_installs(tree: Path) -> None:
    make(tree, "install")
    make(tree, "install")
    assert installs(tree) == 2
    later(tree)
    make(tree, "run-model")
    assert installs(tree) == 2
