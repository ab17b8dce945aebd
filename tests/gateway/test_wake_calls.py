"""Issue 36.2: the gateway's wake calls go where the supervisor says, and a failed
wake is logged with its cause (once per cause, then how often it repeated)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.logger import globalLogPublisher

from mortred_twisted.config.control import ControlConfig, with_overrides
from mortred_twisted.gateway.cold_start import WakeLog, Woken, supervisor_wake
from mortred_twisted.http11.pool import RawHeaders
from mortred_twisted.http11.upstream import UpstreamResponse
from mortred_twisted.supervisor.process import gateway_spec, supervisor_url
from mortred_twisted.tap.gateway import Options


class Http:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.urls: list[str] = []

    def request(self, method: str, url: str, headers: Any, body: Any) -> Any:
        self.urls.append(url)
        if isinstance(self.outcome, Exception):
            return defer.fail(self.outcome)
        return defer.succeed(self.outcome)


def warnings() -> tuple[list[str], Any]:
    lines: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        if event.get("log_namespace", "").endswith("cold_start"):
            from twisted.logger import formatEvent

            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observer)
    return lines, observer


def fired(d: defer.Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    return out[0]


def test_a_refused_wake_is_logged_with_its_cause_once_per_cause() -> None:
    lines, observer = warnings()
    try:
        http = Http(ConnectionRefusedError("nobody on 127.0.0.1:8787"))
        wake = supervisor_wake(http, "http://127.0.0.1:8787", "t", WakeLog())
        for _ in range(3):
            assert fired(wake("M")) == Woken(None)
        assert http.urls == ["http://127.0.0.1:8787/api/v1/autoscale/M/wake"] * 3
        failed = [line for line in lines if "wake failed" in line]
        assert len(failed) == 1
        assert "POST http://127.0.0.1:8787/api/v1/autoscale/M/wake" in failed[0]
        assert "nobody on 127.0.0.1:8787" in failed[0]
        http.outcome = UpstreamResponse(401, _headers(), b'{"error": "unauthorized"}')
        assert fired(wake("M")) == Woken(None)
        assert any("repeated 2 times" in line for line in lines)
        assert any("HTTP 401: unauthorized" in line for line in lines)
        # The supervisor's own "none ready in time" is an answer, not a failure.
        before = len(lines)
        http.outcome = UpstreamResponse(503, _headers(), b'{"error": "x", "retry_after_s": 3}')
        assert fired(wake("M")) == Woken(None, 3)
        assert len(lines) == before
        # A wake that finds a replica ends the run of failures.
        http.outcome = UpstreamResponse(200, _headers(), b'{"url": "http://127.0.0.1:1"}')
        assert fired(wake("M")) == Woken("http://127.0.0.1:1")
        assert fired(wake("M")).url is not None and len(lines) == before
    finally:
        globalLogPublisher.removeObserver(observer)


def _headers() -> Any:
    return RawHeaders([])


def test_the_supervisor_gives_its_gateway_its_own_api_address() -> None:
    """--api-port (an override of the file) reaches the gateway child as
    --supervisor-url; a wildcard API host is reached on loopback."""
    base = ControlConfig(root="/tmp", source="/tmp/conf/mortred.toml")
    control = with_overrides(base, supervisor={"api_port": 19999, "api_host": "0.0.0.0"})
    assert supervisor_url(control) == "http://127.0.0.1:19999"
    argv = gateway_spec(control, auth_token="a", internal_token="i", parent_env={}).argv
    assert argv[argv.index("--supervisor-url") + 1] == "http://127.0.0.1:19999"
    ipv6 = with_overrides(base, supervisor={"api_host": "::1", "api_port": 5})
    assert supervisor_url(ipv6) == "http://[::1]:5"


def test_the_gateway_refuses_a_supervisor_url_that_is_not_an_origin() -> None:
    import pytest
    from twisted.python import usage

    for bad in ("ftp://x:1", "http://h:1/path", "http://h:1?q", "h:1", "http://a b:1"):
        with pytest.raises(usage.UsageError, match="--supervisor-url"):
            Options().parseOptions(["--supervisor-url", bad])
    opts = Options()
    opts.parseOptions(["--supervisor-url", "http://127.0.0.1:8787"])
    assert opts["supervisor-url"] == "http://127.0.0.1:8787"
