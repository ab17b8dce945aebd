"""A DDPM job served end to end by a real model server (twistd subprocess)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.support.servers import model_server

CONF = "conf/server/diffusion/ddpm.toml"
IMG = base64.b64encode(b"ignored by generative models").decode()


@pytest.fixture(scope="module")
def server():
    with model_server(CONF, wait_ready=False) as srv:
        # Importing diffusers takes seconds, and much longer on a loaded machine.
        assert "NOT READY" not in srv.wait_ready(timeout=600), "".join(srv.log[-20:])
        yield srv


def test_ddpm_job_returns_decodable_pngs(server) -> None:
    """POST /jobs with a short schedule ends done, and /result holds 16x16 PNGs."""
    body = {
        "images": [IMG],
        "req_id": "ddpm-e2e",
        "params": {"sample_steps": 5, "seed": 3, "num_images": 2},
    }
    status, doc = server.json("POST", "/jobs", body)
    assert status == 202, doc
    job = doc["job_id"]
    status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=60000")
    assert status == 200 and waited["state"] == "done", waited
    status, result = server.json("GET", f"/jobs/{job}/result")
    assert status == 200 and result["code"] == 0, result
    data = result["data"]
    assert (data["steps"], data["seed"], data["scheduler"]) == (5, 3, "ddpm")
    assert len(data["images"]) == 2
    for b64 in data["images"]:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            assert img.format == "PNG" and img.size == (16, 16)


def test_same_seed_same_images_over_http(server) -> None:
    """The sync path with the same seed returns the same bytes, also under the old param name."""
    # "timesteps" is the previous name of sample_steps; it still works.
    body = {"images": [IMG], "req_id": "d", "params": {"timesteps": 3, "seed": 9}}
    first = server.json("POST", "/mortred/diffusion/ddpm", body)
    second = server.json("POST", "/mortred/diffusion/ddpm", body)
    assert first[0] == second[0] == 200
    assert first[1]["data"]["images"] == second[1]["data"]["images"]


def test_concurrent_jobs_run_together_and_each_keeps_its_images(server) -> None:
    """Three jobs submitted at once all run (no queue position: max_running_jobs is 8
    on one worker), progress each on their own, and a job's images equal its seed
    sampled alone on the sync path within 2/255; a cancelled one frees its place."""
    params = [
        {"scheduler": "dpmsolver++", "sample_steps": 12, "seed": 21, "num_images": 2},
        {"scheduler": "ddim", "sample_steps": 9, "seed": 22, "eta": 0.3},
        {"sample_steps": 1000, "seed": 23},  # long: cancelled below
    ]
    jobs = []
    for i, p in enumerate(params):
        status, doc = server.json(
            "POST", "/jobs", {"images": [IMG], "req_id": f"b{i}", "params": p}
        )
        assert status == 202, doc
        jobs.append(doc["job_id"])
    status, long = server.json("GET", f"/jobs/{jobs[2]}")
    assert status == 200 and long["state"] == "running" and "queue_position" not in long, long
    for job, p in zip(jobs[:2], params[:2], strict=True):
        status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=120000", timeout=180)
        assert status == 200 and waited["state"] == "done", waited
        assert waited["progress"] == {"step": p["sample_steps"], "total": p["sample_steps"]}
        batched = server.json("GET", f"/jobs/{job}/result")[1]["data"]["images"]
        body = {"images": [IMG], "req_id": "alone", "params": p}
        status, alone = server.json("POST", "/mortred/diffusion/ddpm", body, timeout=180)
        assert status == 200, alone
        for a, b in zip(batched, alone["data"]["images"], strict=True):
            assert max_pixel_diff(a, b) <= 2
    status, doc = server.json("DELETE", f"/jobs/{jobs[2]}")
    assert status in (200, 202), doc
    status, waited = server.json("GET", f"/jobs/{jobs[2]}/wait?timeout=60000")
    assert waited["state"] == "cancelled", waited


def max_pixel_diff(a: str, b: str) -> int:
    import numpy as np

    with (
        Image.open(io.BytesIO(base64.b64decode(a))) as x,
        Image.open(io.BytesIO(base64.b64decode(b))) as y,
    ):
        return int(np.abs(np.asarray(x, dtype=np.int16) - np.asarray(y, dtype=np.int16)).max())


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sample_steps": 100000}, "params.sample_steps"),
        ({"steps": 3}, "params.steps"),
        ({"scheduler": "dpmsolver++", "eta": 0.5}, "params.eta"),
    ],
)
def test_bad_params_are_422_before_admission(server, params, field) -> None:
    """Out-of-range or unknown params are refused with 422 naming the field."""
    status, doc = server.json("POST", "/jobs", {"images": [IMG], "req_id": "x", "params": params})
    assert status == 422 and field in doc["error"] and "job_id" not in doc, doc


@pytest.mark.slow
def test_default_schedule_job_is_admitted_long_before_it_finishes(server) -> None:
    """At the default 1000 steps the 202 comes back while the job is still pending/running."""
    body = {"images": [IMG], "req_id": "ddpm-long", "params": {"seed": 1}}
    status, doc = server.json("POST", "/jobs", body)
    assert status == 202, doc
    job = doc["job_id"]
    status, poll = server.json("GET", f"/jobs/{job}")
    assert status == 200 and poll["state"] in ("pending", "running"), poll
    status, early = server.json("GET", f"/jobs/{job}/result")
    assert status == 409, early
    status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=120000", timeout=180)
    assert status == 200 and waited["state"] == "done", waited
    status, result = server.json("GET", f"/jobs/{job}/result")
    assert status == 200 and result["data"]["steps"] == 1000
