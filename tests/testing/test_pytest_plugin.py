"""The pytest plugin as a user's suite loads it: pytest_plugins in a conftest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_suite_that_names_the_plugin_gets_both_fixtures(tmp_path: Path) -> None:
    """pytest_plugins = ["mortred_twisted.testing.pytest_plugin"] gives model_harness
    and served_model (also from_config), in a fresh pytest run of a user's folder."""
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["mortred_twisted.testing.pytest_plugin"]\n'
    )
    (tmp_path / "model.py").write_text(
        "from mortred_twisted.sdk import Context, Input, ServedModel\n"
        "class Double(ServedModel):\n"
        "    def predict(self, ctx: Context, x: int = Input(1, ge=0)) -> int:\n"
        "        ctx.progress(1, 1)\n"
        "        return 2 * x\n"
    )
    (tmp_path / "server.toml").write_text(
        '[server]\nid = "DOUBLE"\n\n[model]\ntype = "model.py:Double"\n'
    )
    (tmp_path / "test_user.py").write_text(
        "from pathlib import Path\n"
        "HERE = Path(__file__).parent\n"
        "TARGET = f\"{HERE / 'model.py'}:Double\"\n"
        "def test_harness(model_harness):\n"
        "    assert model_harness(TARGET).run(x=4).output == 8\n"
        "def test_server(served_model):\n"
        "    assert served_model(TARGET).run(x=5)['data'] == 10\n"
        "    assert served_model.from_config(HERE / 'server.toml').run(x=1)['data'] == 2\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
