"""The client is its own distribution: ``pip install ./client`` into a fresh virtualenv
without torch, numpy or the server package, and it works there against a real model
server. Plus a static check that no client module imports the server package."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import model_server

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
#: What a client module may import at its top level (the Twisted client: the extra).
ALLOWED_TOP = {"twisted", "treq"}
TWISTED_MODULES = {"twisted.py", "_twisted_io.py"}

SCRIPT = """
import importlib.util, sys
for name in ("torch", "numpy", "diffusers", "mortred_twisted"):
    assert importlib.util.find_spec(name) is None, name + " is importable here"
import mortred_client
from mortred_client import Client
client = Client(sys.argv[1])
job = client.submit([b"pixels"], {"delay_ms": 100, "steps": 2}, req_id="venv-1")
events = [e.name for e in job.events()]
assert events[-1] == "done", events
assert job.result().req_id == "venv-1"
assert not [m for m in sys.modules if m.split(".")[0] in ("mortred_twisted", "torch", "numpy")]
print("ok", mortred_client.__version__, mortred_client.__file__)
"""


def run(*cmd: object, **kw: object) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, done.stdout + done.stderr
    return str(done.stdout)


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_without_torch(tmp_path: Path) -> None:
    """pip install ./client into a new python3.11 venv (build backend from the package
    index) gives a working client there, with torch, numpy and mortred_twisted not
    importable: it submits, follows and fetches a job of a real model server."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    source = tmp_path / "client"  # a copy: the build writes nothing into the checkout
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    run(venv / "bin" / "pip", "install", "-q", source, cwd=tmp_path)
    with model_server("conf/server/fake/fake_async.toml") as srv:
        out = run(venv / "bin" / "python", "-I", "-c", SCRIPT, srv.base_url, cwd=tmp_path)
    assert out.startswith("ok 0.1.0 ") and str(venv) in out
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "mortred_client" / "py.typed").exists()


def test_client_modules_import_nothing_of_the_server() -> None:
    """Every client module imports only the standard library at its top level, plus
    twisted/treq in the Twisted client (PIL and numpy only inside the functions that
    need them); none imports mortred_twisted anywhere."""
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((CLIENT / "mortred_client").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top != "mortred_twisted", f"{path.name} imports {name}"
                if node in tree.body or _in_type_checking(tree, node):
                    ok = top in stdlib or top == "mortred_client" or top == "__future__"
                    ok = ok or (path.name in TWISTED_MODULES and top in ALLOWED_TOP)
                    assert ok, f"{path.name} imports {name} at import time"


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    return any(isinstance(stmt, ast.If) and node in ast.walk(stmt) for stmt in tree.body)
