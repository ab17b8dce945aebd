"""End to end: each perception server config runs as a real model server
(``twistd -n mortred-model``) on a free loopback port and answers over HTTP.

MOBILENETV2 and YOLOV8 answer ``/infer`` (their ``/jobs`` is 404); SAM_AMG runs as an
async job to ``done``. A server whose weights are missing stays not ready (503).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.models.perception.conftest import DEMO, ROOT
from tests.support.servers import model_server

pytestmark = pytest.mark.slow


def b64(name: str) -> str:
    return base64.b64encode((DEMO / name).read_bytes()).decode()


def test_mobilenetv2_infer_and_no_jobs() -> None:
    """A demo digit is classified over HTTP; a bad image is 400 code 3; /jobs is 404."""
    with model_server("conf/server/classification/mobilenetv2.toml") as srv:
        assert srv.request("GET", "/ready")[0] == 200
        uri = "/mortred/classification/mobilenetv2"
        status, doc = srv.json("POST", uri, {"req_id": "d3", "images": [b64("digit_3.png")]})
        assert status == 200 and doc["code"] == 0, doc
        assert doc["data"]["class_id"] == 3 and doc["data"]["category"] == "3"
        bad = base64.b64encode(b"not a picture").decode()
        status, doc = srv.json("POST", uri, {"images": [bad]})
        assert (status, doc["code"]) == (400, 3)
        assert srv.json("POST", "/jobs", {"images": [b64("digit_3.png")]})[0] == 404


def test_mobilenetv2_concurrent_requests_fail_alone() -> None:
    """Eight concurrent /infer requests (dynamically batched by the server) with one
    undecodable image: that one gets 400 code 3, the seven others their digits."""
    from concurrent.futures import ThreadPoolExecutor

    uri = "/mortred/classification/mobilenetv2"
    bad = base64.b64encode(b"not a picture").decode()
    bodies = [{"req_id": f"r{i}", "images": [b64(f"digit_{i}.png")]} for i in range(7)]
    bodies.insert(3, {"req_id": "bad", "images": [bad]})
    conf = "conf/server/classification/mobilenetv2.toml"
    with model_server(conf) as srv, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: srv.json("POST", uri, b), bodies))
    for body, (status, doc) in zip(bodies, answers, strict=True):
        assert doc["req_id"] == body["req_id"]
        if body["req_id"] == "bad":
            assert (status, doc["code"]) == (400, 3)
        else:
            assert status == 200 and doc["data"]["class_id"] == int(body["req_id"][1:])


def test_yolov8_infer_and_no_jobs() -> None:
    """A demo scene yields boxed detections over HTTP; /jobs is 404."""
    with model_server("conf/server/object_detection/yolov8.toml") as srv:
        status, doc = srv.json(
            "POST", "/mortred/object_detection/yolov8", {"images": [b64("scene_1.png")]}
        )
        assert status == 200 and doc["code"] == 0, doc
        assert doc["data"] and {"class_id", "score", "category", "bbox"} <= set(doc["data"][0])
        assert srv.json("POST", "/jobs", {"images": [b64("scene_1.png")]})[0] == 404


def test_sam_amg_job_runs_to_done() -> None:
    """POST /jobs answers 202; the job finishes and its result holds masks."""
    with model_server("conf/server/segment_anything/sam_amg.toml") as srv:
        body = {"req_id": "amg-1", "images": [b64("scene_1.png")]}
        status, doc = srv.json("POST", "/jobs", body)
        assert status == 202, doc
        job = doc["job_id"]
        status, doc = srv.json("GET", f"/jobs/{job}/wait?timeout=120000", timeout=130)
        assert status == 200 and doc["state"] == "done", doc
        status, doc = srv.json("GET", f"/jobs/{job}/result")
        assert status == 200 and doc["req_id"] == "amg-1"
        data = doc["data"]
        assert (data["width"], data["height"]) == (64, 64) and data["masks"]


def test_missing_weights_leave_the_server_not_ready(tmp_path: Path) -> None:
    """A config naming absent weights starts a server that reports 503 on /ready."""
    conf = tmp_path / "conf" / "server" / "broken.toml"
    conf.parent.mkdir(parents=True)
    names = ROOT / "conf" / "model" / "classification" / "digits_class_names.txt"
    conf.write_text(
        "[server]\n"
        'id = "MOBILENETV2"\ncategory = "classification"\n'
        'server_uri = "/mortred/classification/mobilenetv2"\nasync_enabled = false\n'
        '[model]\ntype = "MOBILENETV2"\n'
        f'model_weights_path = "{ROOT / "weights" / "perception" / "absent.pt"}"\n'
        f'model_class_names_path = "{names}"\n'
    )
    with model_server(conf) as srv:
        assert "NOT READY" in srv.ready_line
        assert srv.request("GET", "/ready")[0] == 503
