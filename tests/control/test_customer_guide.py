"""The customer guide T1–T16 (seed 002) through the gateway, on a fresh control plane.

One supervisor runs the gateway, an async model and a sync-only model (the T12
negative control), all on free loopback ports. Tests run in file order and share the
plane (and a few job ids), like the guide itself; the last one stops the supervisor
with SIGTERM and checks no child outlived it.

By default the async model is ``FAKE_ASYNC`` with ``params.delay_ms`` = 2500 (each job
takes 2.5 s) and the sync one ``FAKE_SYNC``. Any catalog model can stand in::

    MORTRED_E2E_MODEL=DDPM MORTRED_E2E_PARAMS='{"timesteps": 200}' \
    MORTRED_E2E_SYNC_MODEL=MOBILENETV2 \
    .venv/bin/python -m pytest tests/control/test_customer_guide.py

(pick params so one job takes a couple of seconds on the machine).
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .plane import ControlPlane, control_plane, pid_alive, wait_until


def _png_base64() -> str:
    """A small valid PNG (classifiers decode pixels; generative models ignore them)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 60, 60)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


pytestmark = pytest.mark.slow

MODEL = os.environ.get("MORTRED_E2E_MODEL", "FAKE_ASYNC")
SYNC_MODEL = os.environ.get("MORTRED_E2E_SYNC_MODEL", "FAKE_SYNC")
PARAMS = json.loads(os.environ.get("MORTRED_E2E_PARAMS", '{"delay_ms": 2500}'))
IMG = _png_base64()
BODY = {"images": [IMG], "req_id": "jobs-test-1", "params": PARAMS}
JOBS = f"/v1/models/{MODEL}/jobs"

S: dict[str, Any] = {}


def t_infer() -> float:
    """T_infer of T1, in seconds (the baseline every timing check is relative to)."""
    return float(S["t_infer"])


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp: Path = tmp_path_factory.mktemp("plane")
    with control_plane(tmp, [MODEL, SYNC_MODEL]) as cp:
        cp.wait_ready(["gateway", MODEL, SYNC_MODEL])
        yield cp


def submit(plane: ControlPlane) -> tuple[int, dict[str, str], dict[str, Any], float]:
    code, headers, body, took = plane.gw("POST", JOBS, body=BODY)
    return code, headers, json.loads(body), took


def test_prerequisites(plane: ControlPlane) -> None:
    """§3: gateway /healthz 200 without a token; the model is in the catalog and ready."""
    assert plane.gw("GET", "/healthz", token=None)[0] == 200
    code, _, body, _ = plane.api("GET", "/api/v1/catalog")
    assert code == 200 and MODEL in [s["id"] for s in json.loads(body)["servers"]]
    assert plane.status()[MODEL]["state"] == "running"


def test_t01_blocking_infer_baseline(plane: ControlPlane) -> None:
    """T1: POST …/infer is 200 with the envelope and takes about the model's run time."""
    code, _, body, took = plane.gw("POST", f"/v1/models/{MODEL}/infer", body=BODY)
    assert code == 200, body
    doc = json.loads(body)
    assert doc["code"] == 0 and doc["msg"] == "success"
    assert took >= 1.0, "pick params so that one run takes a couple of seconds"
    S["t_infer"] = took
    print(f"\nT1 infer {MODEL}: {took * 1000:.0f} ms")


def test_t02_submit_is_202_at_once(plane: ControlPlane) -> None:
    """T2: 202 in ≪ T_infer; job_…, pending, gateway Location/poll_url/result_url."""
    code, headers, doc, took = submit(plane)
    assert code == 202, doc
    assert took < 0.5 and took < t_infer() / 4
    print(f"\nT2 submit: {took * 1000:.1f} ms (T_infer {t_infer() * 1000:.0f} ms)")
    assert doc["job_id"].startswith("job_") and doc["state"] == "pending"
    prefix = f"/v1/models/{MODEL}/jobs/{doc['job_id']}"
    assert headers["location"] == prefix
    assert doc["poll_url"] == prefix and doc["result_url"] == prefix + "/result"
    S.update(job=doc["job_id"], poll=doc["poll_url"], result=doc["result_url"])


def test_t03_not_done_right_after_submit(plane: ControlPlane) -> None:
    """T3: poll is pending/running and result is 409 naming the state."""
    code, _, body, _ = plane.gw("GET", S["poll"])
    assert code == 200 and json.loads(body)["state"] in ("pending", "running")
    code, _, body, _ = plane.gw("GET", S["result"])
    doc = json.loads(body)
    assert code == 409 and "error" in doc
    assert "pending" in doc["error"] or "running" in doc["error"]


def test_t04_poll_until_terminal(plane: ControlPlane) -> None:
    """T4: polling reaches done; elapsed_ms increases while the job runs."""
    seen: list[tuple[str, int]] = []

    def terminal() -> bool:
        code, _, body, _ = plane.gw("GET", S["poll"])
        assert code == 200
        doc = json.loads(body)
        seen.append((doc["state"], doc.get("elapsed_ms", 0)))
        if doc["state"] in ("done", "failed", "timeout"):
            return True
        # Pace the loop on the job itself instead of sleeping: a short wait.
        plane.gw("GET", f"{S['poll']}/wait?timeout=300")
        return False

    wait_until(terminal, 30 + 10 * t_infer(), "job terminal", step=0)
    assert seen[-1][0] == "done"
    running = [ms for state, ms in seen if state == "running"]
    assert len(running) >= 2 and running == sorted(running) and running[-1] > running[0]


def test_t05_result_repeatable(plane: ControlPlane) -> None:
    """T5: result is 200 with the envelope, twice, echoing the submit's req_id."""
    for _ in range(2):
        code, _, body, _ = plane.gw("GET", S["result"])
        doc = json.loads(body)
        assert code == 200 and doc["code"] == 0 and doc["req_id"] == "jobs-test-1"


def test_t06_wait_until_terminal(plane: ControlPlane) -> None:
    """T6: wait returns done after about the remaining run time, not the 120 s budget."""
    code, _, doc, took = submit(plane)
    assert code == 202 and took < 0.5
    code, _, body, took = plane.gw(
        "GET", f"{JOBS}/{doc['job_id']}/wait?timeout=120000", timeout=180
    )
    assert code == 200 and json.loads(body)["state"] == "done"
    assert t_infer() * 0.5 < took < t_infer() * 2 + 5
    print(f"\nT6 wait to done: {took * 1000:.0f} ms")


def test_t07_wait_budget_expiry(plane: ControlPlane) -> None:
    """T7: wait?timeout=200 answers 200 in about 200 ms with a non-terminal state."""
    code, _, doc, _ = submit(plane)
    assert code == 202
    code, _, body, took = plane.gw("GET", f"{JOBS}/{doc['job_id']}/wait?timeout=200", timeout=10)
    assert code == 200 and json.loads(body)["state"] in ("pending", "running")
    assert 0.15 < took < 1.5
    print(f"\nT7 wait?timeout=200: {took * 1000:.0f} ms")
    S["t7_job"] = doc["job_id"]


def test_t08_two_waiters(plane: ControlPlane) -> None:
    """T8: two clients waiting on one job both get 200 with the same terminal state."""
    code, _, doc, _ = submit(plane)
    assert code == 202
    results: list[tuple[int, str]] = []

    def waiter() -> None:
        c, _, b, _ = plane.gw("GET", f"{JOBS}/{doc['job_id']}/wait?timeout=120000", timeout=180)
        results.append((c, json.loads(b)["state"]))

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 + 10 * t_infer())
    assert results == [(200, "done"), (200, "done")]


def test_t09_serial_submits_hit_429(plane: ControlPlane) -> None:
    """T9: serial submits past async_max_queue get 429 'async queue full' + Retry-After."""
    codes = []
    admitted = []
    for _ in range(12):
        code, headers, body, _ = plane.gw("POST", JOBS, body=BODY)
        codes.append(code)
        doc = json.loads(body)
        if code == 202:
            admitted.append(doc["job_id"])
        else:
            assert code == 429 and "queue full" in doc["error"] and "retry-after" in headers
    assert codes.count(202) >= 1 and codes.count(429) >= 1, codes
    S["t9_last"] = admitted[-1]


def test_t10_auth(plane: ControlPlane) -> None:
    """T10: missing or wrong bearer is 401 with WWW-Authenticate; /healthz stays public."""
    code, headers, _, _ = plane.gw("POST", JOBS, body=BODY, token=None)
    assert code == 401 and headers["www-authenticate"].startswith("Bearer")
    assert plane.gw("POST", JOBS, body=BODY, token="definitely-wrong")[0] == 401
    assert plane.gw("GET", "/healthz", token=None)[0] == 200


def test_t11_unknown_job(plane: ControlPlane) -> None:
    """T11: an unknown job is 404 'job not found' on poll, wait and result."""
    for suffix in ("", "/wait", "/result"):
        code, _, body, _ = plane.gw("GET", f"{JOBS}/job_does_not_exist{suffix}")
        assert code == 404 and "job not found" in json.loads(body)["error"]


def test_t12_async_disabled_is_404(plane: ControlPlane) -> None:
    """T12: /jobs of a sync-only model is the model's 404, passed through."""
    code, _, _, _ = plane.gw("POST", f"/v1/models/{SYNC_MODEL}/jobs", body=BODY)
    assert code == 404
    code, _, body, _ = plane.gw("POST", f"/v1/models/{SYNC_MODEL}/infer", body={"images": [IMG]})
    # (any sync model answers its own infer: the 404 above is about /jobs only)
    assert code == 200, body


def test_t13_wrong_method_is_405(plane: ControlPlane) -> None:
    """T13: POST on a job URL is 405."""
    assert plane.gw("POST", f"{JOBS}/{S['job']}")[0] == 405


def test_t14_restart_drops_jobs(plane: ControlPlane) -> None:
    """T14: after a supervisor restart of the model, an earlier job is 404."""
    plane.gw("GET", f"{JOBS}/{S['t9_last']}/wait?timeout=120000", timeout=180)
    code, _, doc, _ = submit(plane)
    assert code == 202, doc
    old_pid = plane.status()[MODEL]["pid"]
    code, _, _, _ = plane.api("POST", f"/api/v1/servers/{MODEL}/restart")
    assert code == 202
    wait_until(
        lambda: (st := plane.status().get(MODEL, {})).get("ready") and st["pid"] != old_pid,
        60,
        "model ready again",
    )
    code, _, body, _ = plane.gw("GET", f"{JOBS}/{doc['job_id']}")
    assert code == 404 and "job not found" in json.loads(body)["error"]
    assert plane.status()[MODEL]["restart_count"] == 1


def test_t15_bare_jobs_not_routed(plane: ControlPlane) -> None:
    """T15: the model-port paths are not gateway routes."""
    assert plane.gw("POST", "/jobs", body=BODY)[0] == 404
    assert plane.gw("GET", f"/jobs/{S['job']}")[0] == 404


def test_t16_malformed_envelope_is_422_fast(plane: ControlPlane) -> None:
    """T16: a JSON body that is not an envelope is 422 in milliseconds, no job_id."""
    code, _, body, took = plane.gw("POST", JOBS, body={"not": "the envelope"}, timeout=10)
    assert code in (422, 400) and took < 0.5
    print(f"\nT16 malformed envelope: {code} in {took * 1000:.1f} ms")
    assert "job_id" not in json.loads(body)


def test_gateway_metrics(plane: ControlPlane) -> None:
    """§6: gateway /metrics (token) counts the guide's requests by route and status."""
    code, _, body, _ = plane.gw("GET", "/metrics")
    text = body.decode()
    assert code == 200
    assert 'mortred_gateway_requests_total{route="jobs_submit",status="202"}' in text
    assert 'route="jobs_submit",status="429"' in text


def test_sigterm_stops_everything(plane: ControlPlane) -> None:
    """SIGTERM on the supervisor stops models, then the gateway, and leaves no orphans."""
    pids = plane.child_pids()
    assert len(pids) == 3
    code = plane.stop()
    assert code in (0, -15), "".join(plane.output[-40:])
    assert [p for p in pids if pid_alive(p)] == []
    text = "".join(plane.output)
    assert "stopping models, then the gateway" in text
