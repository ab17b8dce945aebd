"""Webhook rules: targets (SSRF), event filters, signatures, retry policy, throttling."""

from __future__ import annotations

import base64
import itertools

import pytest

from mortred_twisted.jobs.webhooks import (
    WEBHOOK_EVENTS,
    ProgressThrottle,
    WebhookRejected,
    backoff_delays,
    check_target,
    is_retryable,
    jittered,
    message_id,
    normalise_allowed_hosts,
    parse_events_filter,
    secret_key,
    sign,
    verify,
)

ALLOWED = normalise_allowed_hosts(["hooks.example.com", "127.0.0.1:9000", "[::1]"])


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/job-done",
        "http://HOOKS.example.com/x?y=1",
        "http://hooks.example.com.:80/x",
        "http://127.0.0.1:9000/hook",
        "http://[::1]/hook",
    ],
)
def test_allowed_targets_pass(url: str) -> None:
    """An http(s) URL whose host and port are listed (no port listed: the scheme's
    default) is accepted as written."""
    assert check_target(url, ALLOWED) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data", "not in the server's"),
        ("http://hooks.example.com:8080/x", "not in the server's"),  # not the default port
        ("https://hooks.example.com:80/x", "not in the server's"),  # https's default is 443
        ("http://[::ffff:127.0.0.1]/hook", "not in the server's"),  # 127.0.0.1 only on 9000
        ("http://hooks.example.com:0/", "port 0"),
        ("http://127.0.0.1/hook", "not in the server's"),  # port 80 is not the pinned 9000
        ("http://127.0.0.1:9001/hook", "not in the server's"),
        ("http://localhost:9000/hook", "not in the server's"),
        ("http://hooks.example.com.evil.test/", "not in the server's"),
        ("http://evil.test#@hooks.example.com/", "fragment"),
        ("http://user:pw@hooks.example.com/", "credentials"),
        ("http://hooks.example.com@evil.test/", "credentials"),
        ("ftp://hooks.example.com/", "http"),
        ("file:///etc/passwd", "http"),
        ("gopher://127.0.0.1:9000/", "http"),
        ("//hooks.example.com/x", "http"),
        ("/relative", "http"),
        ("http:///nohost", "no host"),
        ("http://hooks.example.com/a b", "spaces"),
        ("http://hooks.example.com/\r\nX: y", "control"),
        ("http://hooks.exämple.com/", "non-ASCII"),
        ("http://hooks.example.com:99999/", "valid URL"),
        ("http://[::1/", "valid URL"),
        ("", "non-empty"),
        (42, "non-empty"),
        ("http://hooks.example.com/" + "a" * 3000, "longer"),
    ],
)
def test_targets_outside_the_allowlist_are_refused(url: object, why: str) -> None:
    """Metadata endpoints, other ports, look-alike hosts and odd schemes are refused."""
    with pytest.raises(WebhookRejected) as caught:
        check_target(url, ALLOWED)
    assert caught.value.field == "webhook"
    assert why in caught.value.message


def test_with_no_allowed_hosts_every_webhook_is_refused() -> None:
    """Deny by default: an empty allowlist refuses every URL and says webhooks are off."""
    with pytest.raises(WebhookRejected, match="webhooks are off"):
        check_target("https://hooks.example.com/", frozenset())


def test_events_filter_defaults_to_all_and_refuses_unknown_names() -> None:
    """No filter means every event; an unknown or empty filter is refused."""
    assert parse_events_filter(None) == frozenset(WEBHOOK_EVENTS)
    assert parse_events_filter(["completed"]) == {"completed"}
    for bad in (["done"], [], "completed", [1]):
        with pytest.raises(WebhookRejected) as caught:
            parse_events_filter(bad)
        assert caught.value.field == "webhook_events_filter"


def test_signature_matches_the_standard_webhooks_reference() -> None:
    """The signature is the spec's: HMAC-SHA256 of id.timestamp.body with the whsec key."""
    # The Standard Webhooks reference vector (from its libraries' test suites).
    key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    header = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert header == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body, "v1,x " + header)
    assert not verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265331, body, header)
    assert not verify(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body + b" ", header)


def test_plain_secrets_are_their_utf8_bytes_and_bad_whsec_is_an_error() -> None:
    """A secret without the whsec_ prefix is used as is; a broken whsec_ value is refused."""
    assert secret_key("s3cret") == b"s3cret"
    assert secret_key("whsec_" + base64.b64encode(b"k").decode()) == b"k"
    with pytest.raises(ValueError, match="base64"):
        secret_key("whsec_not base64!")


def test_backoff_doubles_from_100_ms_over_twelve_attempts() -> None:
    """Twelve attempts mean eleven waits: 0.1, 0.2, 0.4 … 102.4 seconds."""
    delays = backoff_delays()
    assert len(delays) == 11
    assert delays[0] == pytest.approx(0.1)
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(delays))


@pytest.mark.parametrize(
    ("status", "retry"),
    [(None, True), (429, True), (500, True), (503, True), (200, False), (301, False), (400, False),
     (404, False), (410, False)],
)  # fmt: skip
def test_retryable_outcomes(status: int | None, retry: bool) -> None:
    """Connection errors, 429 and 5xx are retried; anything else is final."""
    assert is_retryable(status) is retry


def test_progress_throttle_lets_two_a_second_through_per_job() -> None:
    """Progress events closer than half a second to the last one sent are dropped, per job."""
    throttle = ProgressThrottle()
    assert throttle.allow("a", 10.0)
    assert not throttle.allow("a", 10.3)
    assert throttle.allow("b", 10.3)
    assert throttle.allow("a", 10.5)
    throttle.forget("a")
    assert throttle.allow("a", 10.6)


def test_jitter_stays_within_half_to_all_of_the_delay() -> None:
    """Every jittered wait lies in [delay/2, delay]: never longer than the policy, never
    shorter than half of it, whatever the random draw."""
    for delay in backoff_delays():
        for draw in (0.0, 0.25, 0.5, 0.999999, 1.0, -3.0, 7.0):
            assert delay / 2 <= jittered(delay, draw) <= delay
    assert jittered(0.4, 0.0) == pytest.approx(0.2) and jittered(0.4, 0.5) == pytest.approx(0.3)


def test_message_ids_name_the_event_not_a_count() -> None:
    """The webhook-id comes from the job and what the event reports, so two replicas (or a
    re-run) sending the same event agree on it and different events never collide."""
    assert message_id("job_a", "start", {"state": "running"}) == "job_a.start"
    assert message_id("job_a", "progress", {"progress": {"step": 3, "total": 9}}) == (
        "job_a.progress.3"
    )
    assert message_id("job_a", "progress", {}) == "job_a.progress.0"
    assert message_id("job_a", "completed", {"state": "done"}) == "job_a.completed"
    assert message_id("job_a", "output", {"output_index": 2}) == "job_a.output.2"
    ids = {
        message_id("job_a", e, {"progress": {"step": s, "total": 3}, "output_index": s})
        for e in WEBHOOK_EVENTS
        for s in (1, 2)
    }
    assert len(ids) == 6  # start, progress.1, progress.2, output.1, output.2, completed
