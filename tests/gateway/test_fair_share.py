"""A key's share through the gateway (issue 19): its weight, max_pending and
max_priority travel to the model on a submit and on GET /v1/models/{id}/queue (with
the internal token only); a client cannot send its own."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config
from mortred_twisted.gateway.apikeys import ApiKey, hash_key, parse_keys
from mortred_twisted.gateway.metrics import KeySubmitStats
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.jobs.states import JobState
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads

from .test_gateway_app import AUTH, Harness

JOB = "/v1/models/ASYNC/jobs"
KEYS = [
    ApiKey("tenant", hash_key("tenant-key"), max_pending=20, weight=3, max_priority="high"),
    ApiKey("plain", hash_key("plain-key")),
]
SPOOF = {"X-Mortred-Weight": "1000", "X-Mortred-Max-Pending": "0",
         "X-Mortred-Max-Priority": "high"}  # fmt: skip


def test_a_keys_terms_reach_the_model_on_submit_and_queue() -> None:
    """The tenant key's weight 3, max_pending 20 and max_priority high are sent on a
    submit and on the queue route (mapped to GET /queue); a client's own values are
    dropped, and a plain key gets the defaults."""
    h = Harness(keys=KEYS)
    for method, path, data in (("POST", JOB, b"{}"), ("GET", "/v1/models/ASYNC/queue", None)):
        h.call(method, path, headers={"Authorization": "Bearer tenant-key", **SPOOF}, data=data)
        seen = h.model.seen[-1]
        assert seen.headers["x-mortred-principal"] == "key:tenant"
        assert (seen.headers["x-mortred-weight"], seen.headers["x-mortred-max-pending"],
                seen.headers["x-mortred-max-priority"]) == ("3", "20", "high")  # fmt: skip
    assert h.model.seen[-1].path == "/queue"
    h.call("POST", JOB, headers={"Authorization": "Bearer plain-key", **SPOOF}, data=b"{}")
    seen = h.model.seen[-1].headers
    assert (seen["x-mortred-weight"], seen["x-mortred-max-pending"],
            seen["x-mortred-max-priority"]) == ("1", "0", "normal")  # fmt: skip
    h.call("POST", JOB, headers=AUTH, data=b"{}")  # the operator's token: every band
    assert h.model.seen[-1].headers["x-mortred-max-priority"] == "high"
    h.call("GET", f"{JOB}/job_known", headers={"Authorization": "Bearer tenant-key"})
    assert "x-mortred-weight" not in h.model.seen[-1].headers  # only where it is used


def test_the_queue_route_takes_get_only() -> None:
    """POST on the queue route is 405 naming GET; nothing reaches the model."""
    h = Harness(keys=KEYS)
    r, _ = h.call("POST", "/v1/models/ASYNC/queue", headers=AUTH, data=b"{}")
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET"]
    assert h.model.seen == []


def test_key_file_share_fields_are_checked_all_at_once() -> None:
    """max_pending >= 0, weight 1..1000 and max_priority low|normal|high; every
    problem is reported together."""
    ring = parse_keys({"keys": [{"name": "t", "sha256": "a" * 64, "max_pending": 5,
                                 "weight": 2, "max_priority": "low"}]})  # fmt: skip
    assert (ring.keys[0].max_pending, ring.keys[0].weight, ring.keys[0].max_priority) == (
        5, 2, "low",
    )  # fmt: skip
    with pytest.raises(ConfigErrors) as err:
        parse_keys({"keys": [{"name": "t", "sha256": "a" * 64, "max_pending": -1,
                              "weight": 0, "max_priority": "urgent"}]})  # fmt: skip
    text = str(err.value)
    assert "max_pending" in text and "weight" in text and "max_priority" in text


def test_submits_are_counted_per_key_name_with_a_cap() -> None:
    """mortred_gateway_key_job_submits_total counts each key's submits by status
    (the key file's name, never a header); names past the cap count as other."""
    h = Harness(keys=KEYS)
    tenant = {"Authorization": "Bearer tenant-key", "X-Mortred-Principal": "key:spoof"}
    h.call("POST", JOB, headers=tenant, data=b"{}")
    h.call("POST", JOB, headers=tenant, data=b"{}")
    h.model.submit_status = 429
    h.call("POST", JOB, headers={"Authorization": "Bearer plain-key"}, data=b"{}")
    text = h.app.metrics.render().decode()
    assert 'mortred_gateway_key_job_submits_total{key="tenant",status="202"} 2.0' in text
    assert 'mortred_gateway_key_job_submits_total{key="plain",status="429"} 1.0' in text
    assert "spoof" not in text
    stats = KeySubmitStats(max_keys=2)
    for name in ("a", "b", "c", "d"):
        stats.count(name, 202)
    labels = {m.labels["key"] for fam in stats.collect() for m in fam.samples}
    assert labels == {"a", "b", "other"}


def real_model_behind(h: Harness) -> tuple[Any, HandThreads]:
    """Replace the fake model of ``h`` by a real model port (fake model, one worker,
    memory store, the gateway's internal token) on the harness's clock."""
    doc = {
        "server": {"id": "ASYNC", "server_uri": "/mortred/fake/infer", "worker_nums": 1,
                   "async_enabled": True, "async_max_queue": 100, "auth_token": "internal"},
        "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1},
    }  # fmt: skip
    threads = HandThreads()
    runtime = ModelRuntime(
        build_server_config(doc, env={}), clock=h.clock, threads=threads,
        metrics=ServerMetrics(), build_model=lambda _t, options, root: create_fake(options, root),
    )  # fmt: skip
    runtime.load_models()
    threads.step()
    app = ModelServerApp(runtime)
    h.sites[("127.0.0.1", 18100)] = ModelPortFactory.for_app(app, h.clock)
    return runtime, threads


IMAGE = {"images": [base64.b64encode(b"x").decode()]}


def test_fairness_and_quota_through_the_gateway() -> None:
    """Through the gateway to a real model port (one worker): alice's key floods 12
    jobs, bob's then submits 3; bob's three finish within the next 9 completions. A
    key with max_pending 2 gets the model's 429 naming its own quota."""
    keys = [ApiKey("alice", hash_key("alice-key")), ApiKey("bob", hash_key("bob-key")),
            ApiKey("small", hash_key("small-key"), max_pending=2)]  # fmt: skip
    h = Harness(keys=keys)
    runtime, threads = real_model_behind(h)
    body = json.dumps(IMAGE).encode()
    json_type = {"Content-Type": "application/json"}

    def submit(key: str) -> tuple[int, Any]:
        r, raw = h.call("POST", JOB, headers={"Authorization": f"Bearer {key}", **json_type},
                        data=body)  # fmt: skip
        return r.code, json.loads(raw)

    alice = [submit("alice-key")[1]["job_id"] for _ in range(12)]
    h.clock.advance(0)
    bob = [submit("bob-key")[1]["job_id"] for _ in range(3)]
    h.clock.advance(0)
    finished: list[str] = []
    while threads.pending:
        threads.step()
        h.clock.advance(0)
        for job_id in alice + bob:
            snap = runtime.store.snapshot(job_id)
            if snap.state is JobState.DONE and job_id not in finished:
                finished.append(job_id)
    assert len(finished) == 15 and max(finished.index(j) for j in bob) < 9
    assert {runtime.store.snapshot(j).owner for j in bob} == {"key:bob"}
    codes = [submit("small-key") for _ in range(3)]
    assert [c for c, _ in codes] == [202, 202, 429]
    assert "caller quota reached: key:small" in codes[2][1]["error"]
