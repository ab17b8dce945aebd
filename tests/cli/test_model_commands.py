"""mortredctl model new/check/run (in process, no server) and jobs submit -i."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.cli.mortredctl import main
from mortred_twisted.testing.conformance import tiny_png
from tests.cli.test_mortredctl import Scripted, gw_run, server

__all__ = ["server"]  # the scripted HTTP server fixture

REPO = Path(__file__).resolve().parents[2]
SHARPEN = REPO / "examples" / "sharpen"


def ctl(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_model_new_writes_a_folder_whose_test_passes(tmp_path: Path) -> None:
    """The model, its server TOML and its test; the test passes as written (pytest in
    a fresh interpreter) and a second `new` refuses to overwrite."""
    folder = tmp_path / "greeter"
    code, text = ctl("model", "new", "my-greeter", str(folder))
    assert code == 0 and "wrote" in text
    assert sorted(p.name for p in folder.iterdir()) == [
        "my_greeter.py", "server.toml", "test_my_greeter.py",
    ]  # fmt: skip
    assert 'type = "my_greeter.py:MyGreeter"' in (folder / "server.toml").read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout
    assert ctl("model", "new", "my-greeter", str(folder))[0] == 2


def test_model_new_refuses_a_name_that_is_no_identifier(tmp_path: Path) -> None:
    """A name must start with a letter."""
    assert ctl("model", "new", "9lives", str(tmp_path / "x"))[0] == 2


def test_model_check_prints_the_schema_and_the_report() -> None:
    """The schema is JSON (inputs with bounds and choices, an image output); every
    check passes for the example."""
    code, text = ctl("--json", "model", "check", f"{SHARPEN / 'sharpen.py'}:Sharpen",
                     "-i", f"image=@{REPO / 'tests' / 'testing' / 'models.py'}",
                     "--no-isolated")  # fmt: skip
    doc = json.loads(text)
    # the "image" given is no picture: the run fails, and the check says so
    assert code == 1 and not doc["conformance"]["ok"]
    assert doc["schema"]["inputs"]["properties"]["mode"]["enum"] == ["unsharp", "laplace"]
    code, text = ctl("model", "check", str(SHARPEN / "server.toml"))
    assert code == 0
    schema, report = text.split("\nconformance of ", 1)
    assert json.loads(schema)["output"] == {"$ref": "#/components/schemas/ResultFile"}
    assert ": ok\n" in report and "FAIL" not in report


def test_model_check_exits_1_listing_the_problem() -> None:
    """A model that ignores cancel fails its check."""
    code, text = ctl("model", "check", "tests.testing.models:IgnoresCancel", "--no-isolated")
    assert code == 1 and "FAIL cancel: cancelled at step 1, predict went on" in text


def test_model_run_prints_the_output_and_writes_its_files(tmp_path: Path) -> None:
    """-i name=@file and JSON values; -o gets the result file."""
    picture = tmp_path / "cat.png"
    picture.write_bytes(tiny_png())
    code, text = ctl("model", "run", str(SHARPEN / "server.toml"), "-i", f"image=@{picture}",
                     "-i", "amount=2", "-i", "steps=2", "-o", str(tmp_path / "out"))  # fmt: skip
    assert code == 0 and json.loads(text)["name"] == "output.png"
    written = (tmp_path / "out" / "output.png").read_bytes()
    assert written.startswith(b"\x89PNG") and len(written) == json.loads(text)["size"]


def test_model_run_says_why_a_request_is_refused(capsys: Any) -> None:
    """A bad input exits 1 with the server's 422 message; a pair without = exits 2."""
    code, _ = ctl("model", "run", "tests.testing.models:Batches", "-i", "x=abc")
    assert code == 1
    assert "invalid request: params.x: must be an integer" in capsys.readouterr().err
    assert ctl("model", "run", "tests.testing.models:Batches", "-i", "x")[0] == 2
    assert ctl("model", "run", "tests.testing.models:Batches", "-i", "x=13")[0] == 1
    assert ctl("model", "run", "nowhere.py:Nope", "-i", "x=1")[0] == 1


def test_model_run_names_an_unreadable_image_as_the_server_does(
    tmp_path: Path, capsys: Any
) -> None:
    """Bytes that are no picture: exit 1 with the server's 400 wording ("invalid
    input: params.image: not a readable image ..."), not the 422's "invalid request"."""
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"this is text, not a picture")
    code, _ = ctl("model", "run", str(SHARPEN / "server.toml"), "-i", f"image=@{junk}")
    err = capsys.readouterr().err
    assert code == 1
    assert "invalid input: params.image: not a readable image" in err, err


def test_model_run_streams_events_and_cancels(capsys: Any) -> None:
    """--events prints each event; --cancel-at-step ends the run cancelled (exit 1)."""
    code, text = ctl("model", "run", "tests.testing.models:Frames", "-i", "n=2", "--events")
    assert code == 0 and len(json.loads(text)) == 2
    assert capsys.readouterr().err.count("event output:") == 2
    target = "tests.testing.models:Inverts"
    png = base64.b64encode(tiny_png()).decode()
    code, _ = ctl("model", "run", target, "-i", f"image={png}", "--cancel-at-step", "1")
    assert code == 1 and "RunCancelled" in capsys.readouterr().err


def test_jobs_submit_sends_inputs_by_name(server: str, tmp_path: Path) -> None:
    """-i values go in params by name (a file as base64), with no images."""
    picture = tmp_path / "cat.png"
    picture.write_bytes(b"pixels")
    code, text = gw_run(server, "jobs", "submit", "DDPM", "-i", "amount=2", "-i",
                        f"image=@{picture}", "-i", "mode=laplace")  # fmt: skip
    assert code == 0 and json.loads(text)["job_id"] == "job_1"
    posted = [s for s in Scripted.seen if s[0] == "POST"][-1]
    assert posted[3] == {"params": {"amount": 2, "image": "cGl4ZWxz", "mode": "laplace"}}


@pytest.mark.parametrize("pair", ["amount", "=2"])
def test_jobs_submit_refuses_a_pair_without_a_name(server: str, pair: str) -> None:
    """Usage error, nothing sent."""
    assert gw_run(server, "jobs", "submit", "DDPM", "-i", pair)[0] == 2
    assert not [s for s in Scripted.seen if s[0] == "POST"]


def test_jobs_submit_inputs_through_the_supervisor(server: str) -> None:
    """Without --gateway the supervisor's proxy gets the same params, with its own
    fields (server_id, async)."""
    out = io.StringIO()
    code = main(["--addr", server, "--token", "mgmt", "jobs", "submit", "DDPM", "-i", "x=1",
                 "--params", '{"y": "z"}'], out=out)  # fmt: skip
    assert code == 0
    posted = [s for s in Scripted.seen if s[0] == "POST"][-1]
    assert posted[3] == {"server_id": "DDPM", "async": True, "params": {"y": "z", "x": 1}}
