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


job_views = st.fixed_dictionaries(
    {
        "job_id": st.from_regex(r"job_[0-9a-f]{6}", fullmatch=True),
        "state": st.sampled_from(["pending", "running", "done"]),
        "poll_url": st.from_regex(r"/jobs/job_[0-9a-f]{6}", fullmatch=True),
        "result_url": st.from_regex(r"/jobs/job_[0-9a-f]{6}/result", fullmatch=True),
    },
    optional={
        "error": st.text(max_size=40),
        "elapsed_ms": st.integers(0, 10**6),
        "progress": st.fixed_dictionaries({"step": st.integers(0, 9)}),
    },
)


@given(job_views, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_fast_path_equals_json_rewrite(doc: dict[str, object], seps: tuple[str, str]) -> None:
    """The bytes fast path gives the same document as rewriting the parsed JSON."""
    body = json.dumps(doc, separators=seps).encode()
    out = json.loads(rewrite_job_urls(body, "DDPM"))
    expected = dict(doc)
    expected["poll_url"] = "/v1/models/DDPM" + str(doc["poll_url"])
    expected["result_url"] = "/v1/models/DDPM" + str(doc["result_url"])
    assert out == expected


def test_key_inside_a_string_is_not_rewritten() -> None:
    """Text that merely looks like a poll_url inside another value stays as it was."""
    body = json.dumps({"error": 'x "poll_url": "/jobs/a"', "poll_url": "/jobs/b"}).encode()
    out = json.loads(rewrite_job_urls(body, "M"))
    assert out == {"error": 'x "poll_url": "/jobs/a"', "poll_url": "/v1/models/M/jobs/b"}


def test_result_file_urls_move_under_the_public_prefix() -> None:
    """Each result file's compact ``"url":"/jobs/…"`` is rewritten; an escaped one
    inside a string value is not."""
    from mortred_twisted.gateway.rewrite import gateway_prefix, rewrite_file_urls

    body = b'{"data":{"a":{"url":"/jobs/j/files/a.png"},"s":"{\\"url\\":\\"/jobs/x\\"}"}}'
    out = rewrite_file_urls(body, gateway_prefix("M"))
    assert out == (
        b'{"data":{"a":{"url":"/v1/models/M/jobs/j/files/a.png"},"s":"{\\"url\\":\\"/jobs/x\\"}"}}'
    )
    assert rewrite_file_urls(b'{"data":1}', gateway_prefix("M")) == b'{"data":1}'


def test_an_sdk_models_file_urls_in_its_events_are_rewritten() -> None:
    """A preview/output event's result-file url points at the public prefix."""
    from mortred_twisted.gateway.rewrite import EventRecords

    records = EventRecords("/v1/models/M/jobs/")
    raw = b'id: m1\nevent: output\ndata: {"url":"/jobs/job_1/files/output-0.png","name":"x"}\n\n'
    assert records.feed(raw) == (
        b'id: m1\nevent: output\ndata: {"url":"/v1/models/M/jobs/job_1/files/output-0.png",'
        b'"name":"x"}\n\n'
    )
