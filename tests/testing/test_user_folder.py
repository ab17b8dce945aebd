"""A user's model folder outside this repository, laid out as
docs/models/your-own.md shows (issue 36 item 3): one test file holding pytest
functions *and* a trial ``ModelTestCase`` passes under plain ``pytest`` (with the
pytest-twisted plugin the install brings loaded) and under ``trial`` run as the
docs say (``trial ./test_sharpen.py``). Each runner is the venv's own, started as a
subprocess in the folder, with this checkout first on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

MODEL = '''\
from mortred_twisted.sdk import Context, Image, Input, ServedModel


class Sharpen(ServedModel):
    """Counts steps, then answers the picture's size."""

    def setup(self) -> None:
        self.radius = float(self.options.get("radius", 2.0))

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        amount: float = Input(1.0, ge=0.0, le=4.0),
        steps: int = Input(2, ge=1, le=100),
    ) -> dict:
        pixels = image.to_numpy()
        for i in range(steps):
            ctx.check_cancelled()
            ctx.progress(i + 1, steps)
        return {"size": list(pixels.shape[:2]), "amount": amount, "radius": self.radius}
'''

SERVER = """\
[server]
id = "SHARPEN"
async_enabled = true

[model]
type = "sharpen.py:Sharpen"
radius = 3.0
"""

# the test file of docs/models/your-own.md section 6: pytest functions, then a trial
# TestCase in the same file
TESTS = """\
import io
from pathlib import Path

import pytest
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InvalidRequest, RunCancelled
from mortred_twisted.testing import MemoryServer, ModelHarness, conformance
from mortred_twisted.testing.trial import ModelTestCase

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'sharpen.py'}:Sharpen"
buf = io.BytesIO()
PILImage.new("RGB", (5, 3), (1, 2, 3)).save(buf, "PNG")
CAT = buf.getvalue()
harness = ModelHarness(TARGET, {"radius": 2.0})


def test_runs() -> None:
    result = harness.run(image=CAT, amount=2.0, steps=3)
    assert result.progress == [(1, 3), (2, 3), (3, 3)]
    assert result.output == {"size": [3, 5], "amount": 2.0, "radius": 2.0}


def test_cancel() -> None:
    with pytest.raises(RunCancelled):
        harness.run(image=CAT, steps=50, cancel_at_step=3)


def test_refuses_bad_input() -> None:
    with pytest.raises(InvalidRequest) as bad:
        harness.validate(image=CAT, amount=9)
    assert bad.value.field == "params.amount"
    with pytest.raises(InvalidRequest) as bad:
        harness.validate(image=b"not a picture")
    assert bad.value.field == "params.image"


def test_served() -> None:
    with MemoryServer.from_config(HERE / "server.toml") as server:
        assert server.run(image=CAT)["data"]["radius"] == 3.0
        assert server.submit(image=CAT, amount=9).code == 422


def test_contract() -> None:
    conformance.check(TARGET, inputs={"image": CAT})


class SharpenTests(ModelTestCase):
    model = TARGET
    options = {"radius": 2.0}

    async def test_sharpens(self) -> None:
        result = await self.run_model(image=CAT, amount=2.0)
        self.assertEqual(result.output["size"], [3, 5])

    def test_refuses(self):
        return self.assertFailure(self.validate(image=CAT, amount=9), InvalidRequest)

    async def test_served(self) -> None:
        server = self.serve()
        job = (await server.submit(image=CAT)).json()
        self.assertEqual((await server.wait(job["job_id"]))["state"], "done")

    async def test_contract(self) -> None:
        self.assertTrue((await self.check_conformance(inputs={"image": CAT})).ok)
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The user's folder: a model file, its server file and one test file."""
    home = tmp_path / "my-models" / "sharpen"
    home.mkdir(parents=True)
    (home / "sharpen.py").write_text(MODEL)
    (home / "server.toml").write_text(SERVER)
    (home / "test_sharpen.py").write_text(TESTS)
    assert REPO not in home.parents
    return home


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(cwd),
        "PYTHONPATH": str(REPO),  # this checkout, not the venv's installed copy
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_plain_pytest_runs_the_pytest_tests_and_the_trial_test_case(folder: Path) -> None:
    """pytest (pytest-twisted loaded, as the install brings it): 5 functions and the
    4 ModelTestCase methods pass; before, the awaited run failed with
    DirtyReactorAggregateError."""
    proc = run([str(BIN / "pytest"), "-q"], folder)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "9 passed" in out
    assert "pytest_twisted" in run([str(BIN / "pytest"), "--trace-config", "--co"], folder).stdout


def test_trial_runs_the_documented_command(folder: Path) -> None:
    """``trial ./test_sharpen.py``, as the docs say: the 4 test-case methods pass."""
    proc = run([str(BIN / "trial"), "./test_sharpen.py"], folder)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED (successes=4)" in out
