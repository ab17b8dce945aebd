"""End to end: each perception server config runs as a real model server
(``twistd -n mortred-model``) on a free loopback port and answers over HTTP.

MOBILENETV2, YOLOV8 and RTDETR answer ``/infer`` (their ``/jobs`` is 404); SAM_AMG
runs as an async job to ``done``. A server whose checkpoint is missing stays not ready
(503). Reduced stand-ins of public transformers checkpoints (sam-vit-base,
mobilenet_v2_1.0_224, RT-DETR r18; random weights) are served from a directory as a
user would serve a downloaded one, and answer RGB, grey and RGBA pictures of any size.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.models.perception.conftest import DEMO, ROOT, png_bytes
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


@pytest.mark.parametrize(
    ("conf", "uri"),
    [
        ("conf/server/object_detection/yolov8.toml", "/mortred/object_detection/yolov8"),
        ("conf/server/object_detection/rtdetr.toml", "/mortred/object_detection/rtdetr"),
    ],
)
def test_detectors_infer_and_no_jobs(conf: str, uri: str) -> None:
    """A demo scene yields boxed detections over HTTP (same schema for YOLOV8 and
    RTDETR); /jobs is 404."""
    with model_server(conf) as srv:
        status, doc = srv.json("POST", uri, {"images": [b64("scene_1.png")]})
        assert status == 200 and doc["code"] == 0, doc
        assert doc["data"] and {"class_id", "score", "category", "bbox"} <= set(doc["data"][0])
        assert doc["data"][0]["category"] in ("circle", "rectangle", "triangle")
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


def test_missing_checkpoint_leaves_the_server_not_ready(tmp_path: Path) -> None:
    """A config naming an absent checkpoint directory starts a server that reports 503
    on /ready."""
    conf = tmp_path / "conf" / "server" / "broken.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        "[server]\n"
        'id = "MOBILENETV2"\ncategory = "classification"\n'
        'server_uri = "/mortred/classification/mobilenetv2"\nasync_enabled = false\n'
        '[model]\ntype = "MOBILENETV2"\n'
        f'pretrained = "{ROOT / "weights" / "perception" / "absent"}"\n'
    )
    with model_server(conf) as srv:
        assert "NOT READY" in srv.ready_line
        assert srv.request("GET", "/ready")[0] == 503


RNG = np.random.default_rng(5)
# RGB, grey and RGBA pictures of odd sizes: tall, wide, tiny, larger than the input.
ODD_PICTURES = [
    png_bytes(RNG.integers(0, 256, (97, 31, 3), dtype=np.uint8)),
    png_bytes(RNG.integers(0, 256, (20, 300), dtype=np.uint8)),
    png_bytes(RNG.integers(0, 256, (7, 9, 4), dtype=np.uint8)),
    png_bytes(RNG.integers(0, 256, (300, 260, 3), dtype=np.uint8)),
]
SIZES = [(31, 97), (300, 20), (9, 7), (260, 300)]


def _server_conf(tmp_path: Path, family: str, directory: Path, extra: str = "") -> Path:
    conf = tmp_path / f"{family.lower()}.toml"
    is_async = family == "SAM_AMG"
    conf.write_text(
        "[server]\n"
        f'id = "STAND_IN"\ncategory = "{family.lower()}"\n'
        f'server_uri = "/stand_in"\nasync_enabled = {str(is_async).lower()}\n'
        f'[model]\ntype = "{family}"\npretrained = "{directory}"\n{extra}'
    )
    return conf


def _post_all(srv: object, uri: str, params: dict[str, object]) -> list[dict[str, object]]:
    body = {"images": [base64.b64encode(p).decode() for p in ODD_PICTURES], "params": params}
    status, doc = srv.json("POST", uri, body, timeout=120)  # type: ignore[attr-defined]
    assert status == 200 and doc["code"] == 0, doc
    return doc["data"]["results"]


def test_public_classifier_layout_is_served(
    stand_in: Callable[[str], Path], tmp_path: Path
) -> None:
    """A mobilenet_v2_1.0_224-shaped directory serves well-formed classifications (1,001
    id2label classes, top_k) for pictures of any size and mode."""
    conf = _server_conf(tmp_path, "IMAGE_CLASSIFICATION", stand_in("IMAGE_CLASSIFICATION"))
    with model_server(conf) as srv:
        results = _post_all(srv, "/stand_in", {"top_k": 5})
    assert len(results) == len(ODD_PICTURES)
    for item in results:
        assert len(item["scores"]) == 1001 and abs(sum(item["scores"]) - 1) < 1e-3
        assert item["category"] in ("background", f"imagenet_{item['class_id']}")
        assert [t["score"] for t in item["top_k"]] == sorted(
            (t["score"] for t in item["top_k"]), reverse=True
        )


def test_public_detector_layout_is_served(stand_in: Callable[[str], Path], tmp_path: Path) -> None:
    """An RT-DETR r18-shaped directory serves well-formed detections (boxes inside each
    picture, at most top-k, COCO id2label) for pictures of any size and mode."""
    conf = _server_conf(
        tmp_path, "OBJECT_DETECTION", stand_in("OBJECT_DETECTION"), "model_score_threshold = 0.0\n"
    )
    with model_server(conf) as srv:
        results = _post_all(srv, "/stand_in", {"model_keep_top_k": 5})
    for dets, (w, h) in zip(results, SIZES, strict=True):
        assert 0 < len(dets) <= 5
        for det in dets:
            x1, y1, x2, y2 = det["bbox"]
            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h
            assert det["category"] == f"coco_{det['class_id']}"


def test_public_sam_layout_is_served(stand_in: Callable[[str], Path], tmp_path: Path) -> None:
    """A sam-vit-base-shaped directory runs the AMG as a job to done; every picture gets
    its size back and masks (if any) of that size."""
    from mortred_twisted.models.transformers_tasks.sam.masks import rle_to_mask

    extra = (
        "points_per_side = 4\npred_iou_thresh = 0.0\nstability_score_thresh = 0.0\n"
        "stability_score_offset = 0.0\n"
    )
    conf = _server_conf(tmp_path, "SAM_AMG", stand_in("SAM_AMG"), extra)
    body = {"images": [base64.b64encode(p).decode() for p in ODD_PICTURES]}
    with model_server(conf) as srv:
        status, doc = srv.json("POST", "/jobs", body)
        assert status == 202, doc
        job = doc["job_id"]
        status, doc = srv.json("GET", f"/jobs/{job}/wait?timeout=120000", timeout=130)
        assert status == 200 and doc["state"] == "done", doc
        status, doc = srv.json("GET", f"/jobs/{job}/result")
    results = doc["data"]["results"]
    assert [(r["width"], r["height"]) for r in results] == SIZES
    assert any(r["masks"] for r in results)
    for r in results:
        for m in r["masks"]:
            assert rle_to_mask(m["segmentation"]).shape == (r["height"], r["width"])
