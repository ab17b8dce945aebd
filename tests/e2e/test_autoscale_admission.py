# ruff: noqa: F811 - the redis fixture imported from test_autoscale
"""Admission at zero replicas end to end (issue 27 item 3): an SDK model on the Redis
store, autoscaled to zero behind the gateway; its first replica publishes its
validation twin, and from then on a submit at zero is admitted by the gateway (202)
before any replica is ready, a bad input is the model's own 422 and admits nothing,
an idempotent resubmit is the same job, and the job runs to done exactly once when
the replica is up. The replica's start-up is held on a gate file the test opens, so
every ordering asserted is made by the test, not by timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.control.plane import ControlPlane
from tests.e2e.autoscale_fleet import GATED, IMG, MODEL, autoscale, autoscaled_fleet
from tests.e2e.test_autoscale import at_zero, attempts, redis  # noqa: F401
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

JOBS = f"/v1/models/{MODEL}/jobs"


def submit(plane: ControlPlane, params: dict[str, Any], **headers: str) -> tuple[int, Any, dict]:
    code, hdrs, body, _t = plane.gw(
        "POST", JOBS, body={"params": params}, headers=headers, timeout=90
    )
    return code, json.loads(body) if body else {}, hdrs


def view(plane: ControlPlane, job: str, wait_ms: int = 0) -> tuple[int, Any]:
    path = f"{JOBS}/{job}" + (f"/wait?timeout={wait_ms}" if wait_ms else "")
    code, _h, body, _t = plane.gw("GET", path, timeout=wait_ms / 1000 + 30)
    return code, json.loads(body)


def no_replica_ready(plane: ControlPlane) -> bool:
    return (autoscale(plane).get("ready") or 0) == 0


def test_a_submit_at_zero_is_admitted_before_the_replica_is_ready(
    tmp_path: Path, redis: RedisServer
) -> None:
    """At zero with a published twin: 202 while the replica is still in setup, the
    422 of a bad input (the same body the replica gives later) admits nothing, the
    resubmit with the same Idempotency-Key is the same job, and once the gate opens
    the job runs to done on its first attempt."""
    gate = tmp_path / "gate"
    gate.touch()  # the first cold start: no twin yet, the submit is held
    table = {
        "min_replicas": 0, "max_replicas": 1, "idle_to_zero_s": 2,
        "scale_down_window_s": 1, "cooldown_s": 0.5, "autoscale_interval_s": 0.25,
        "cold_start_max_waiting": 4, "cold_start_timeout_s": 90,
    }  # fmt: skip
    with autoscaled_fleet(tmp_path, redis.url, table, GATED % gate) as (plane, _port):
        plane.wait_ready(["gateway"])
        wait_until(lambda: autoscale(plane).get("active") is True, 30, "scaler on")
        code, first, _h = submit(plane, {"name": "eve"})
        assert code == 202, first  # held until the first replica was up
        assert view(plane, first["job_id"], 60_000)[1]["state"] == "done"
        twin = json.loads(redis.command("GET", f"mortred:{{{MODEL}}}:twin"))
        assert twin["admit"] is True, twin
        wait_until(lambda: at_zero(plane), 60, "back to zero, the replica gone")

        gate.unlink()  # the next replica stays in setup until the gate opens
        code, job, headers = submit(plane, {"name": "ada"}, **{"Idempotency-Key": "once"})
        assert code == 202, job
        assert no_replica_ready(plane)  # the 202 came first
        assert headers["location"] == f"{JOBS}/{job['job_id']}"
        bad = {"name": "ada", "times": 9}
        bad_code, bad_doc, _h = submit(plane, bad)
        assert bad_code == 422 and "params.times" in bad_doc["error"], bad_doc
        again_code, again, again_headers = submit(
            plane, {"name": "ada"}, **{"Idempotency-Key": "once"}
        )
        assert (again_code, again["job_id"]) == (202, job["job_id"])
        assert again_headers.get("idempotent-replayed") == "true"
        poll_code, polled = view(plane, job["job_id"])  # answered from Redis
        assert (poll_code, polled["state"]) == (200, "pending")
        assert no_replica_ready(plane)
        assert redis.command("GET", f"mortred:{{{MODEL}}}:depth") == "1"  # the 422 admitted nothing

        gate.touch()
        done = view(plane, job["job_id"], 90_000)[1]
        assert done["state"] == "done", done
        assert attempts(redis, job["job_id"]) == 1
        _c, _h, result, _t = plane.gw("GET", f"{JOBS}/{job['job_id']}/result")
        assert json.loads(result)["data"] == "hello ada"
        # The replica's own 422 for the same input: the very body the gateway gave.
        wait_until(lambda: autoscale(plane).get("ready") == 1, 30, "the replica ready")
        assert submit(plane, bad)[:2] == (bad_code, bad_doc)
        assert redis.command("GET", f"mortred:{{{MODEL}}}:depth") == "0"
        gateway_log = (tmp_path / "logs" / "gateway.log").read_text()
        assert f"admission at zero for {MODEL}: validating with the published twin" in gateway_log


def test_the_fake_built_in_is_admitted_at_zero_too(tmp_path: Path, redis: RedisServer) -> None:
    """The fake family (declared with the SDK, contract mortred-v1) publishes an
    admissible twin: after its first cold start, a submit at zero is admitted by the
    gateway (its log says so), a bad input is the seed's 422, and the job is done
    once."""
    table = {
        "min_replicas": 0, "max_replicas": 1, "idle_to_zero_s": 2,
        "scale_down_window_s": 1, "cooldown_s": 0.5, "autoscale_interval_s": 0.25,
        "cold_start_max_waiting": 4, "cold_start_timeout_s": 90,
    }  # fmt: skip
    with autoscaled_fleet(tmp_path, redis.url, table) as (plane, _port):
        plane.wait_ready(["gateway"])
        wait_until(lambda: autoscale(plane).get("active") is True, 30, "scaler on")
        code, _h, first, _t = plane.gw("POST", JOBS, body={"images": [IMG]}, timeout=90)
        assert code == 202, first
        wait_until(lambda: at_zero(plane), 60, "back to zero, the replica gone")
        code, _h, body, _t = plane.gw("POST", JOBS, body={"params": {}}, timeout=90)
        assert code == 422 and b"images" in body, body
        assert redis.command("GET", f"mortred:{{{MODEL}}}:depth") == "0"
        code, _h, raw, _t = plane.gw(
            "POST", JOBS, body={"images": [IMG], "params": {"delay_ms": 5}}, timeout=90
        )
        assert code == 202, raw
        job_id = json.loads(raw)["job_id"]
        assert view(plane, job_id, 60_000)[1]["state"] == "done"
        assert attempts(redis, job_id) == 1
        gateway_log = (tmp_path / "logs" / "gateway.log").read_text()
        assert f"admission at zero for {MODEL}: validating with the published twin" in gateway_log
