"""Replicate's mapping, pure (issue 35 item 4): Prefer: wait, the create body, the
prediction object and the gateway's URL rewriting."""

from __future__ import annotations

import json

import pytest

from mortred_twisted.http.protocols.replicate import (
    ReplicateError,
    check_model,
    parse_create,
    parse_wait,
    prediction,
    public_prediction_urls,
)
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.types import JobSnapshot


@pytest.mark.parametrize(
    ("prefer", "seconds"),
    [(None, None), (b"wait", 60), (b"wait=5", 5), (b"wait=0", 1), (b"wait=9999", 60),
     (b"respond-async, wait=3", 3), (b"return=inline", None)],
)  # fmt: skip
def test_prefer_wait(prefer: bytes | None, seconds: int | None) -> None:
    assert parse_wait(prefer) == seconds


@pytest.mark.parametrize("prefer", [b"wait=abc", b"wait=-1", b"wait=12345678", b"wait="])
def test_prefer_wait_refused(prefer: bytes) -> None:
    with pytest.raises(ReplicateError):
        parse_wait(prefer)


def test_create_and_model_checks() -> None:
    assert parse_create({"input": {"a": 1}, "webhook": "http://h/x"}, "M") == (
        {"a": 1}, {"webhook": "http://h/x"})  # fmt: skip
    for bad in ([1], {"input": []}, {"version": "N"}, {"stream": True}, {"extra": 1}):
        with pytest.raises(ReplicateError) as caught:
            parse_create(bad, "M")
        assert caught.value.status == 422
    check_model("mortred", "M", "M")
    for owner, name in (("other", "M"), ("mortred", "N"), ("mortred", "m")):
        with pytest.raises(ReplicateError):
            check_model(owner, name, "M")


def test_the_prediction_object() -> None:
    snap = JobSnapshot("job_1", JobState.DONE, "r", 3000, None, None, 1000, 100.0)
    data = {"images": [{"url": "/jobs/job_1/files/a.png", "sha256": "x", "name": "a.png"}],
            "seed": 3}  # fmt: skip
    doc = prediction("M", snap, data, "http://h", {"prompt": "p"})
    assert doc["status"] == "succeeded" and doc["metrics"]["predict_time"] == 2.0
    assert doc["output"] == {"images": ["http://h/jobs/job_1/files/a.png"], "seed": 3}
    assert doc["urls"]["cancel"] == "http://h/v1/predictions/job_1/cancel"
    assert doc["completed_at"].endswith("Z") and doc["error"] is None
    states = ((JobState.PENDING, "starting"), (JobState.RUNNING, "processing"),
              (JobState.CANCELLED, "canceled"), (JobState.TIMEOUT, "failed"))  # fmt: skip
    for state, status in states:
        assert prediction("M", snap._replace(state=state), None, "", None, 1.0)["status"] == status


def test_public_urls_through_the_gateway() -> None:
    body = json.dumps({
        "id": "job_1", "output": {"images": ["http://10.0.0.5:7/jobs/job_1/files/a.png"],
                                  "note": "http://elsewhere/x"},
        "urls": {"get": "http://10.0.0.5:7/v1/predictions/job_1"},
    }).encode()  # fmt: skip
    doc = json.loads(public_prediction_urls(body, "M", "http://gw"))
    assert doc["output"]["images"] == ["http://gw/v1/models/M/jobs/job_1/files/a.png"]
    assert doc["output"]["note"] == "http://elsewhere/x"
    assert doc["urls"]["get"] == "http://gw/v1/models/M/replicate/v1/predictions/job_1"
    for raw in (b"nope", b"[1]", b"\xff"):
        assert public_prediction_urls(raw, "M", "http://gw") == raw
