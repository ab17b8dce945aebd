"""The customer guide T1–T16 (seed 002) through the gateway, on a fresh control plane.

One supervisor runs the gateway, an async model and a sync-only model (the T12
negative control), all on free loopback ports. The plane is shared by the module,
but every test stands alone: it submits the jobs it needs through the ``jobs``
fixture, which at teardown cancels them and waits until each has ended, so the next
test starts on an idle model whatever ran before it (any test passes when run alone).
The SIGTERM test starts a plane of its own.

Timing checks are relative to the model's own run time (``run_time``: the fake's
configured ``delay_ms``, else one measured blocking infer) or to a budget the test
itself sets (a wait's ``timeout``), and are backed by what the answers say (a job
seen not done right after its 202, a wait answering with a terminal state).

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
from dataclasses import dataclass
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
TERMINAL = ("done", "failed", "timeout", "cancelled")
#: The wait budget of the "wait until terminal" cases, in ms (the guide's example).
LONG_WAIT_MS = 120_000
#: More submits than any catalog model's ``async_max_queue`` (8 for async models).
OVERFILL = 12


@dataclass(frozen=True)
class Submitted:
    """The gateway's answer to one ``POST …/jobs``."""

    code: int
    headers: dict[str, str]
    doc: dict[str, Any]
    took: float

    @property
    def job_id(self) -> str:
        return str(self.doc["job_id"])


class Jobs:
    """Submits jobs through the gateway and remembers them, to wait for them at the end."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.ids: list[str] = []

    def submit(self) -> Submitted:
        code, headers, body, took = self.plane.gw("POST", JOBS, body=BODY)
        doc = json.loads(body)
        if code == 202:
            self.ids.append(doc["job_id"])
        return Submitted(code, headers, doc, took)

    def wait(self, job_id: str, budget_ms: int = LONG_WAIT_MS) -> tuple[int, dict[str, Any], float]:
        """``GET …/wait?timeout=budget_ms``: ``(status, body, seconds)``."""
        code, _, body, took = self.plane.gw(
            "GET", f"{JOBS}/{job_id}/wait?timeout={budget_ms}", timeout=budget_ms / 1000 + 60
        )
        return code, json.loads(body), took

    def overfill(self) -> list[Submitted]:
        """Submit :data:`OVERFILL` jobs back to back; the answers, in order."""
        return [self.submit() for _ in range(OVERFILL)]

    def drain(self) -> None:
        """End every job submitted here: cancel it (supervisor API, 200/202, or 409 when
        already finished, 404 when a restart dropped it), then wait until it is
        terminal or gone, so the model is idle again."""
        for job_id in self.ids:
            code, _, body, _ = self.plane.api("DELETE", f"/api/v1/jobs/{MODEL}/{job_id}")
            assert code in (200, 202, 404, 409), body
        for job_id in self.ids:

            def ended(job_id: str = job_id) -> bool:
                code, doc, _ = self.wait(job_id)
                return code == 404 or doc.get("state") in TERMINAL

            wait_until(ended, 120, f"job {job_id} to end")


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp: Path = tmp_path_factory.mktemp("plane")
    with control_plane(tmp, [MODEL, SYNC_MODEL]) as cp:
        cp.wait_ready(["gateway", MODEL, SYNC_MODEL])
        yield cp


@pytest.fixture(scope="module")
def run_time(plane: ControlPlane) -> float:
    """Seconds one job of ``MODEL`` takes: the fake's ``delay_ms``, else one measured infer."""
    if "delay_ms" in PARAMS:
        return float(PARAMS["delay_ms"]) / 1000.0
    code, _, body, took = plane.gw("POST", f"/v1/models/{MODEL}/infer", body=BODY, timeout=600)
    assert code == 200, body
    return took


@pytest.fixture
def jobs(plane: ControlPlane) -> Iterator[Jobs]:
    """A job client whose jobs have all ended when the test is over."""
    client = Jobs(plane)
    yield client
    client.drain()


def test_prerequisites(plane: ControlPlane) -> None:
    """§3: gateway /healthz 200 without a token; the model is in the catalog and ready."""
    assert plane.gw("GET", "/healthz", token=None)[0] == 200
    code, _, body, _ = plane.api("GET", "/api/v1/catalog")
    assert code == 200 and MODEL in [s["id"] for s in json.loads(body)["servers"]]
    assert plane.status()[MODEL]["state"] == "running"


def test_t01_blocking_infer_baseline(plane: ControlPlane, run_time: float) -> None:
    """T1: POST …/infer is 200 with the envelope and lasts at least the model's run time."""
    code, _, body, took = plane.gw("POST", f"/v1/models/{MODEL}/infer", body=BODY, timeout=600)
    assert code == 200, body
    doc = json.loads(body)
    assert doc["code"] == 0 and doc["msg"] == "success"
    if "delay_ms" in PARAMS:
        assert took >= run_time, "the answer came before the model's configured delay"
    assert run_time >= 1.0, "pick params so that one run takes a couple of seconds"
    print(f"\nT1 infer {MODEL}: {took * 1000:.0f} ms")


def test_t02_submit_is_202_at_once(plane: ControlPlane, jobs: Jobs, run_time: float) -> None:
    """T2: 202 before the job could have run; job_…, pending, gateway Location/poll/result."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    # The 202 is an admission: the job has not finished when it arrives.
    code, _, body, _ = plane.gw("GET", sub.doc["poll_url"])
    assert code == 200 and json.loads(body)["state"] in ("pending", "running")
    assert sub.took < run_time / 2, "submit took as long as a run: 202 is not at admission"
    print(f"\nT2 submit: {sub.took * 1000:.1f} ms (run time {run_time * 1000:.0f} ms)")
    assert sub.job_id.startswith("job_") and sub.doc["state"] == "pending"
    prefix = f"/v1/models/{MODEL}/jobs/{sub.job_id}"
    assert sub.headers["location"] == prefix
    assert sub.doc["poll_url"] == prefix and sub.doc["result_url"] == prefix + "/result"


def test_t03_not_done_right_after_submit(plane: ControlPlane, jobs: Jobs) -> None:
    """T3: right after a submit, poll is pending/running and result is 409 naming the state."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    code, _, body, _ = plane.gw("GET", sub.doc["poll_url"])
    assert code == 200 and json.loads(body)["state"] in ("pending", "running")
    code, _, body, _ = plane.gw("GET", sub.doc["result_url"])
    doc = json.loads(body)
    assert code == 409 and "error" in doc
    assert "pending" in doc["error"] or "running" in doc["error"]


def test_t04_poll_until_terminal(plane: ControlPlane, jobs: Jobs, run_time: float) -> None:
    """T4: polling reaches done; elapsed_ms increases while the job runs."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    seen: list[tuple[str, int]] = []

    def terminal() -> bool:
        code, _, body, _ = plane.gw("GET", sub.doc["poll_url"])
        assert code == 200
        doc = json.loads(body)
        seen.append((doc["state"], doc.get("elapsed_ms", 0)))
        if doc["state"] in TERMINAL:
            return True
        # Pace the loop on the job itself instead of sleeping: a short wait.
        plane.gw("GET", f"{sub.doc['poll_url']}/wait?timeout=300")
        return False

    wait_until(terminal, 30 + 10 * run_time, "job terminal", interval=0)
    assert seen[-1][0] == "done"
    running = [ms for state, ms in seen if state == "running"]
    assert len(running) >= 2 and running == sorted(running) and running[-1] > running[0]


def test_t05_result_repeatable(plane: ControlPlane, jobs: Jobs) -> None:
    """T5: once done, result is 200 with the envelope, twice, echoing the submit's req_id."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    code, doc, _ = jobs.wait(sub.job_id)
    assert code == 200 and doc["state"] == "done", doc
    for _ in range(2):
        code, _, body, _ = plane.gw("GET", sub.doc["result_url"])
        doc = json.loads(body)
        assert code == 200 and doc["code"] == 0 and doc["req_id"] == "jobs-test-1"


def test_t06_wait_until_terminal(jobs: Jobs, run_time: float) -> None:
    """T6: wait answers done once the job has run, long before its 120 s budget."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    code, doc, took = jobs.wait(sub.job_id, LONG_WAIT_MS)
    assert code == 200 and doc["state"] == "done", doc
    if "delay_ms" in PARAMS:
        # It answered at the job's end: the job ran its full delay before the answer ...
        assert doc["elapsed_ms"] >= 0.99 * PARAMS["delay_ms"], doc
    # ... and not at the budget's expiry.
    assert took < LONG_WAIT_MS / 1000 / 2
    print(f"\nT6 wait to done: {took * 1000:.0f} ms (job elapsed {doc['elapsed_ms']} ms)")


def test_t07_wait_budget_expiry(jobs: Jobs, run_time: float) -> None:
    """T7: wait?timeout=200 answers 200 after its budget with a non-terminal state."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    code, doc, took = jobs.wait(sub.job_id, 200)
    # Not done: it answered at the budget, not at the job's end ...
    assert code == 200 and doc["state"] in ("pending", "running"), doc
    # ... and not before the budget (client clock vs server timer: 5 % slack).
    assert took >= 0.19
    print(f"\nT7 wait?timeout=200: {took * 1000:.0f} ms (run time {run_time * 1000:.0f} ms)")


def test_t08_two_waiters(jobs: Jobs, run_time: float) -> None:
    """T8: two clients waiting on one job both get 200 with the same terminal state."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    results: list[tuple[int, str]] = []

    def waiter() -> None:
        code, doc, _ = jobs.wait(sub.job_id)
        results.append((code, doc["state"]))

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 + 10 * run_time)
    assert results == [(200, "done"), (200, "done")]


def test_t09_serial_submits_hit_429(jobs: Jobs) -> None:
    """T9: serial submits past async_max_queue get 429 'async queue full' + Retry-After."""
    answers = jobs.overfill()
    codes = [a.code for a in answers]
    assert codes.count(202) >= 1 and codes.count(429) >= 1, codes
    for refused in (a for a in answers if a.code != 202):
        assert refused.code == 429 and "queue full" in refused.doc["error"], refused
        assert "retry-after" in refused.headers


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


def test_t13_wrong_method_is_405(plane: ControlPlane, jobs: Jobs) -> None:
    """T13: POST on a job URL is 405."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    assert plane.gw("POST", f"{JOBS}/{sub.job_id}")[0] == 405


def test_t14_restart_drops_jobs(plane: ControlPlane, jobs: Jobs) -> None:
    """T14: after a supervisor restart of the model, an earlier job is 404."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    before = plane.status()[MODEL]
    code, _, _, _ = plane.api("POST", f"/api/v1/servers/{MODEL}/restart")
    assert code == 202
    wait_until(
        lambda: (st := plane.status().get(MODEL, {})).get("ready") and st["pid"] != before["pid"],
        60,
        "model ready again",
    )
    code, _, body, _ = plane.gw("GET", f"{JOBS}/{sub.job_id}")
    assert code == 404 and "job not found" in json.loads(body)["error"]
    assert plane.status()[MODEL]["restart_count"] == before["restart_count"] + 1


def test_t15_bare_jobs_not_routed(plane: ControlPlane, jobs: Jobs) -> None:
    """T15: the model-port paths are not gateway routes."""
    sub = jobs.submit()
    assert sub.code == 202, sub.doc
    assert plane.gw("POST", "/jobs", body=BODY)[0] == 404
    assert plane.gw("GET", f"/jobs/{sub.job_id}")[0] == 404


def test_t16_malformed_envelope_is_422_before_admission(
    plane: ControlPlane, run_time: float
) -> None:
    """T16: a JSON body that is not an envelope is 422, no job_id, without running the model."""
    code, _, body, took = plane.gw("POST", JOBS, body={"not": "the envelope"}, timeout=10)
    assert code in (422, 400) and "job_id" not in json.loads(body)
    assert took < run_time / 2, "the refusal waited for a model run"
    print(f"\nT16 malformed envelope: {code} in {took * 1000:.1f} ms")


def test_gateway_metrics(plane: ControlPlane, jobs: Jobs) -> None:
    """§6: gateway /metrics (token) counts submits by route and status, 202 and 429 alike."""
    codes = [a.code for a in jobs.overfill()]
    assert 202 in codes and 429 in codes, codes
    code, _, body, _ = plane.gw("GET", "/metrics")
    text = body.decode()
    assert code == 200
    assert 'mortred_gateway_requests_total{route="jobs_submit",status="202"}' in text
    assert 'route="jobs_submit",status="429"' in text


def test_sigterm_stops_everything(tmp_path: Path) -> None:
    """SIGTERM on the supervisor stops models, then the gateway, and leaves no orphans."""
    with control_plane(tmp_path, [MODEL, SYNC_MODEL]) as own:
        own.wait_ready(["gateway", MODEL, SYNC_MODEL])
        pids = own.child_pids()
        assert len(pids) == 3
        code = own.stop()
        assert code in (0, -15), "".join(own.output[-40:])
        assert [p for p in pids if pid_alive(p)] == []
        text = "".join(own.output)
        assert "stopping models, then the gateway" in text
