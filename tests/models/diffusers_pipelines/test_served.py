"""A ``type = "diffusers"`` model behind a model port (in memory): jobs end with PNG
result files, bad inputs are 422s naming the input, concurrent text-to-image jobs
step together, and (a real server) a job cancelled mid-sampling ends cancelled."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import succeed
from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.support.memory_http import MemoryClient
from tests.support.servers import model_server


def make_app(path: Path, **model: Any) -> tuple[ModelServerApp, Clock, HandThreads, MemoryClient]:
    doc = {
        "server": {"id": "SD", "worker_nums": 1, "async_enabled": True},
        "model": {"type": "diffusers", "path": str(path), **model},
    }
    clock, threads = Clock(), HandThreads()
    runtime = ModelRuntime(
        build_server_config(doc, env={}), clock=clock, threads=threads, metrics=ServerMetrics(),
        build_model=create_model, io_threads=lambda fn, *args: succeed(fn(*args)),
    )  # fmt: skip
    runtime.load_models()
    threads.step()
    assert runtime.ready
    app = ModelServerApp(runtime)
    return app, clock, threads, MemoryClient(ModelPortFactory.for_app(app, clock))


def call(stub: MemoryClient, method: str, url: str, body: Any = None) -> tuple[int, bytes]:
    kwargs: dict[str, Any] = {"headers": {}}
    if body is not None:
        kwargs["data"] = json.dumps(body).encode()
        kwargs["headers"]["Content-Type"] = "application/json"
    d = stub.request(method, "http://localhost" + url, **kwargs)
    stub.flush()
    responses: list = []
    d.addCallback(responses.append)
    assert responses, f"{method} {url} did not answer"
    content: list = []
    responses[0].content().addCallback(content.append)
    stub.flush()
    return responses[0].code, content[0]


def settle(clock: Clock, threads: HandThreads) -> None:
    for _ in range(50):
        clock.advance(0)
        if not threads.pending:
            break
        threads.drain()
    clock.advance(0)


@pytest.fixture
def sd(pipelines: dict[str, Path]) -> Any:
    app, clock, threads, stub = make_app(pipelines["sd"], max_running_jobs=4)
    yield app, clock, threads, stub
    app.runtime.close_store()


def test_a_job_ends_with_png_result_files(sd: Any) -> None:
    """POST /jobs with a prompt ends done; its pictures are result files served as PNGs."""
    _app, clock, threads, stub = sd
    params = {"prompt": "a red circle", "sample_steps": 3, "seed": 1, "num_images": 2}
    code, body = call(stub, "POST", "/jobs", {"params": params})
    assert code == 202, body
    job = json.loads(body)["job_id"]
    settle(clock, threads)
    code, body = call(stub, "GET", f"/jobs/{job}/result")
    assert code == 200, body
    data = json.loads(body)["data"]
    assert (data["width"], data["height"], data["steps"], data["seed"]) == (32, 32, 3, 1)
    urls = [image["url"] for image in data["images"]]
    assert urls == [f"/jobs/{job}/files/images-0.png", f"/jobs/{job}/files/images-1.png"]
    code, png = call(stub, "GET", urls[0])
    assert code == 200 and png.startswith(b"\x89PNG")


def test_bad_inputs_are_422s_naming_the_input(sd: Any) -> None:
    """A width the UNet does not take, an unknown solver and a missing prompt are
    refused before admission, each naming its input."""
    _app, _clock, _threads, stub = sd
    for params, field in (
        ({"prompt": "a", "width": 30}, "params.width"),
        ({"prompt": "a", "scheduler": "plms"}, "params.scheduler"),
        ({}, "params.prompt"),
    ):
        code, body = call(stub, "POST", "/jobs", {"params": params})
        assert code == 422 and field in body.decode(), body


def test_the_openapi_document_declares_the_kinds_inputs(sd: Any) -> None:
    """GET /openapi.json describes the text-to-image inputs (prompt required, the
    solvers as choices) and takes JSON or multipart/form-data submits."""
    _app, _clock, _threads, stub = sd
    code, body = call(stub, "GET", "/openapi.json")
    assert code == 200
    doc = json.loads(body)
    content = doc["paths"]["/jobs"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "multipart/form-data"}
    text = json.dumps(doc)
    assert '"prompt"' in text and '"preview_every"' in text and '"euler-ancestral"' in text


def test_concurrent_jobs_step_together(sd: Any) -> None:
    """Three jobs submitted at once run in one batch: the UNet's calls carry all their rows."""
    app, clock, threads, stub = sd
    jobs = []
    for i, scale in enumerate((7.5, 1.0, 4.0)):
        params = {"prompt": f"a {['red', 'blue', 'green'][i]} circle", "sample_steps": 3,
                  "seed": i, "guidance_scale": scale}  # fmt: skip
        code, body = call(stub, "POST", "/jobs", {"params": params})
        assert code == 202, body
        jobs.append(json.loads(body)["job_id"])
    settle(clock, threads)
    for job in jobs:
        code, body = call(stub, "GET", f"/jobs/{job}")
        assert json.loads(body)["state"] == "done", body
    batch = app.runtime.models[0].step_batch()._inner  # type: ignore[union-attr]
    assert 5 in batch.forward_rows  # 2 + 1 + 2 rows in one call


def test_other_kinds_serve_jobs(pipelines: dict[str, Path]) -> None:
    """A DiT and a DDPM directory serve jobs with their own inputs."""
    for name, params in (("dit", {"class_ids": [1], "sample_steps": 2}),
                         ("ddpm", {"num_images": 2, "sample_steps": 2})):  # fmt: skip
        app, clock, threads, stub = make_app(pipelines[name])
        code, body = call(stub, "POST", "/jobs", {"params": params})
        assert code == 202, body
        job = json.loads(body)["job_id"]
        settle(clock, threads)
        code, body = call(stub, "GET", f"/jobs/{job}/result")
        assert code == 200 and json.loads(body)["data"]["images"], body
        app.runtime.close_store()


def test_image_to_image_takes_a_multipart_form(pipelines: dict[str, Path]) -> None:
    """An image-to-image job submitted as multipart/form-data (the picture a file part,
    the other inputs text fields) ends done with a picture of the form's size."""
    import base64 as b64

    from tests.models.diffusers_pipelines.test_kinds import picture

    app, clock, threads, stub = make_app(pipelines["sd"], task="image-to-image")
    png = b64.b64decode(picture((40, 32)))
    fields = {"prompt": b"a red circle", "strength": b"0.5", "sample_steps": b"4", "seed": b"3"}
    parts = [
        b'--XyZ\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + png + b"\r\n"
    ]
    for name, value in fields.items():
        parts.append(f'--XyZ\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
                     + value + b"\r\n")  # fmt: skip
    d = stub.request(
        "POST", "http://localhost/jobs", data=b"".join(parts) + b"--XyZ--\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=XyZ"},
    )  # fmt: skip
    stub.flush()
    answers: list = []
    d.addCallback(answers.append)
    content: list = []
    answers[0].content().addCallback(content.append)
    stub.flush()
    assert answers[0].code == 202, content
    job = json.loads(content[0])["job_id"]
    settle(clock, threads)
    code, body = call(stub, "GET", f"/jobs/{job}/result")
    assert code == 200, body
    data = json.loads(body)["data"]
    assert (data["width"], data["height"], data["seed"]) == (40, 32, 3)
    app.runtime.close_store()


@pytest.mark.slow
def test_a_job_cancelled_mid_sampling_ends_cancelled(
    pipelines: dict[str, Path], tmp_path: Path
) -> None:
    """On a real server, DELETE /jobs/<id> while it samples ends it cancelled before
    its last step."""
    config = tmp_path / "server.toml"
    config.write_text(
        '[server]\nid = "SDX"\nserver_uri = "/sd"\nasync_enabled = true\ntorch_threads = 1\n'
        f'[model]\ntype = "diffusers"\npath = "{pipelines["sd"]}"\ndevice = "cpu"\n'
    )
    with model_server(config, wait_ready=False) as server:
        assert "NOT READY" not in server.wait_ready(timeout=600), "".join(server.log[-20:])
        status, doc = server.json(
            "POST", "/jobs", {"params": {"prompt": "a", "sample_steps": 1000}}
        )
        assert status == 202, doc
        job = doc["job_id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, state = server.json("GET", f"/jobs/{job}")
            if (state.get("progress") or {}).get("step", 0) >= 1:
                break
            time.sleep(0.05)
        status, _ = server.json("DELETE", f"/jobs/{job}")
        assert status in (200, 202)
        status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=60000")
        assert waited["state"] == "cancelled", waited
        assert waited["progress"]["step"] < 1000, waited
