"""MemoryServer: the model server's real routes in memory (submit, wait, result,
files, cancel), as a user's end-to-end test drives them without sockets."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InvalidRequest, ModelLoadError
from mortred_twisted.testing import HTTPStatusError, MemoryServer, ModelHarness
from mortred_twisted.testing.conformance import tiny_png
from tests.testing import models

PNG = tiny_png()


def test_a_job_is_submitted_waited_for_and_its_result_read() -> None:
    """202 at admission, done after the wait, the envelope's data describes the file."""
    with MemoryServer(models.Inverts) as server:
        answer = server.submit(image=PNG, amount=2.0, steps=3)
        assert answer.code == 202 and answer.headers["content-type"].startswith("application/json")
        job = answer.json()["job_id"]
        status = server.wait(job)
        assert status["state"] == "done"
        doc = server.result(job)
        assert doc["code"] == 0 and doc["data"]["name"] == "output.png"
        files = server.files_of(doc["data"])
        assert files["output.png"][:-1] == PNG[:-1]


def test_the_servers_422_is_the_harness_validation_message() -> None:
    """The same bad input: the submit's 422 says 'invalid request: ' + the harness's
    InvalidRequest."""
    with MemoryServer(models.Inverts) as server:
        answer = server.submit(image=PNG, amount=9)
    with pytest.raises(InvalidRequest) as raised:
        ModelHarness(models.Inverts).validate(image=PNG, amount=9)
    assert answer.code == 422
    assert answer.json() == {"error": f"invalid request: {raised.value}", "code": 52}


def test_the_seed_envelopes_images_fill_the_image_input() -> None:
    """{"images": [base64]} still works for a model with one Image input."""
    with MemoryServer(models.Inverts) as server:
        job = server.submit(images=[PNG], steps=1).json()["job_id"]
        assert server.wait(job)["state"] == "done"


def test_run_raises_on_a_refusal_and_on_a_failed_job() -> None:
    """run() is submit + wait + result; a 422 raises HTTPStatusError with the answer."""
    with MemoryServer(models.Batches) as server:
        assert server.run(x=4)["data"] == 8
        with pytest.raises(HTTPStatusError) as refused:
            server.run(x="four")
        assert refused.value.answer.code == 422
        with pytest.raises(AssertionError, match="ended failed"):
            server.run(x=13)


def test_a_pending_job_cancelled_never_runs() -> None:
    """With the only worker busy on a job whose model waits, a second job is pending;
    DELETE cancels it and the wait says cancelled."""
    with MemoryServer(models.Inverts, server={"worker_nums": 1}) as server:
        server.threads.run = _hold(server)  # the next model call waits in the queue
        first = server.submit(image=PNG).json()["job_id"]
        second = server.submit(image=PNG).json()["job_id"]
        assert server.status(second)["state"] == "pending"
        assert server.cancel(second).code == 200
        assert server.status(second)["state"] == "cancelled"
        assert server.status(first)["state"] == "running"


def _hold(server: MemoryServer):  # type: ignore[no-untyped-def]
    """A thread runner that keeps every call queued (a model still running)."""
    from twisted.internet.defer import Deferred

    def run(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        return Deferred()

    return run


def test_result_files_are_served_by_the_files_route() -> None:
    """GET /jobs/{id}/files/{name} answers the bytes with their content type."""
    with MemoryServer(models.Inverts) as server:
        job = server.submit(image=PNG, steps=1).json()["job_id"]
        data = server.result(job)["data"]
        if "base64" in data:
            pytest.skip("this server returns result files inline")
        answer = server.file(job, "output.png")
        assert answer.code == 200 and answer.headers["content-type"] == "image/png"
        assert answer.body[:-1] == PNG[:-1]


def test_a_server_toml_naming_a_model_file_is_served(tmp_path: Path) -> None:
    """from_config() reads the server file; its relative model path is the file's."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.py").write_text(Path(models.__file__).read_text())
    (tmp_path / "server.toml").write_text(
        '[server]\nid = "MINE"\nserver_uri = "/infer"\n\n'
        '[model]\ntype = "models/m.py:Inverts"\nscale = 5.0\n'
    )
    with MemoryServer.from_config(tmp_path / "server.toml") as server:
        assert server.config.id == "MINE"
        job = server.submit(image=base64.b64encode(PNG).decode(), steps=1).json()["job_id"]
        assert server.wait(job)["state"] == "done"
        assert server.runtime.models[0].instance.scale == 5.0


def test_a_model_whose_setup_fails_does_not_start() -> None:
    """The load error says why, as /healthz would."""
    with pytest.raises(ModelLoadError, match="setup"):
        MemoryServer(models.SetupFails)


def test_the_fixture_closes_what_it_served(served_model, model_harness) -> None:  # type: ignore[no-untyped-def]
    """served_model and model_harness are factories; the test gets working objects."""
    server = served_model(models.Batches)
    assert server.run(x=2)["data"] == 4
    assert model_harness(models.Batches).run(x=3).output == 6


def test_a_numpy_array_is_submitted_as_a_png() -> None:
    """json_value encodes an array as base64 PNG for the submit."""
    import numpy as np

    with MemoryServer(models.Inverts) as server:
        job = server.submit(image=np.zeros((3, 3, 3), dtype=np.uint8), steps=1).json()
        assert server.wait(job["job_id"])["state"] == "done"


def test_the_event_stream_of_an_ended_job_lists_the_models_events() -> None:
    """A streaming model's previews and outputs are on the job's stream after done."""
    with MemoryServer(models.Frames) as server:
        job = server.submit(n=2).json()["job_id"]
        server.wait(job)
        events = server.events(job)
    assert events[0][0] == "done"
    assert [name for name, _ in events[1:]] == ["preview", "output", "preview", "output"]
    assert events[1][1] == {"frame": 0} and events[2][1]["name"] == "output-0.txt"
