"""Rewriting a submit's model-port URLs to gateway URLs."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mortred_twisted.gateway.rewrite import public_job_path, rewrite_job_urls


def test_location_relative_and_absolute() -> None:
    """Relative and absolute /jobs/ URLs both become /v1/models/<id>/jobs/…."""
    assert public_job_path("/jobs/job_1", "DDPM") == "/v1/models/DDPM/jobs/job_1"
    assert (
        public_job_path("http://127.0.0.1:18110/jobs/job_1/result", "DDPM")
        == "/v1/models/DDPM/jobs/job_1/result"
    )


def test_other_values_unchanged() -> None:
    """Anything outside the model's /jobs/ tree passes unchanged."""
    assert public_job_path("/elsewhere", "DDPM") == "/elsewhere"
    assert public_job_path("/v1/models/DDPM/jobs/j", "DDPM") == "/v1/models/DDPM/jobs/j"


def test_body_fields_rewritten_others_kept() -> None:
    """poll_url and result_url are rewritten; every other field is kept as is."""
    body = json.dumps(
        {
            "job_id": "job_1",
            "state": "pending",
            "poll_url": "/jobs/job_1",
            "result_url": "/jobs/job_1/result",
            "extra": "/jobs/x",
        }
    ).encode()
    doc = json.loads(rewrite_job_urls(body, "LDM"))
    assert doc == {
        "job_id": "job_1",
        "state": "pending",
        "poll_url": "/v1/models/LDM/jobs/job_1",
        "result_url": "/v1/models/LDM/jobs/job_1/result",
        "extra": "/jobs/x",
    }


@given(st.binary(max_size=64))
def test_non_json_bodies_pass_unchanged(body: bytes) -> None:
    """A body that is not a JSON object with job URLs is returned byte for byte."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and ("poll_url" in doc or "result_url" in doc):
            return
    except ValueError:
        pass
    assert rewrite_job_urls(body, "X") == body
