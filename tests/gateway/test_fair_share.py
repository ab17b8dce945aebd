"""A key's share through the gateway (issue 19): its weight, max_pending and
max_priority travel to the model on a submit and on GET /v1/models/{id}/queue (with
the internal token only); a client cannot send its own."""

from __future__ import annotations

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.gateway.apikeys import ApiKey, hash_key, parse_keys
from mortred_twisted.gateway.metrics import KeySubmitStats

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
