"""The README install path really exposes the twistd plugins (slow: builds a venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import twisted

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: object, **kw) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_regular_install_into_a_fresh_venv_lists_the_plugins(tmp_path: Path) -> None:
    """pip install of the project into a new virtualenv makes `twistd --help` list
    mortred-model, mortred-gateway and mortred-supervisor."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    # Twisted alone is what the plugin files import; the full dependency set
    # (torch included) is exercised by `make test` itself.
    run(pip, "install", "-q", f"twisted=={twisted.__version__}")
    run(pip, "install", "-q", "--no-deps", ROOT, cwd=tmp_path)
    help_text = run(venv / "bin" / "twistd", "--help", cwd=tmp_path)
    for name in ("mortred-model", "mortred-gateway", "mortred-supervisor"):
        assert name in help_text
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "twisted" / "plugins" / "mortred_plugins.py").exists()
    assert (site / "mortred_twisted" / "jobs" / "ledger.py").exists()
    assert (site / "mortred_twisted" / "ui" / "static" / "index.html").exists()
    assert not (site / "twisted_plugins").exists()
