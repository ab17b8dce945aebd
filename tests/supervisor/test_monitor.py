"""ManagedServer lifecycle and Supervisor ordering, on task.Clock with fake children."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.monitor import ManagedServer, Supervisor, Timing
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.process import ProcessSpec

from .fakes import FakeProber, FakeSpawner


def server(
    sid: str,
    clock: Clock,
    spawner: FakeSpawner,
    prober: FakeProber,
    policy: str = "on-failure",
    kind: str = "model",
) -> ManagedServer:
    return ManagedServer(
        sid,
        kind=kind,
        spec=ProcessSpec((sid,)),
        probe_url=f"http://{sid}/ready",
        tracker=RestartTracker(policy),
        clock=clock,
        spawner=spawner,
        prober=prober,
        log_buffer=LogBuffer(),
        timing=Timing(probe_interval=0.5, ready_timeout=10, grace=3),
    )


def fired(d: Any) -> list[Any]:
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def test_start_probe_ready_running() -> None:
    """start → starting; the first OK probe makes it running + ready and fires start()."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr)
    result = fired(s.start())
    assert s.state == "starting" and s.pid == 1000 and result == []
    clock.advance(0.5)
    assert s.state == "starting"
    pr.ready["http://A/ready"] = True
    clock.advance(0.5)
    assert s.state == "running" and s.ready and result == [True]


def test_crash_restarts_with_backoff_then_fails() -> None:
    """Crashes restart after 0.5, 1, 2, 4, 8 s; the 6th crash in 60 s is failed."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr)
    result = fired(s.start())
    for delay in (0.5, 1, 2, 4, 8):
        sp.children[-1].exit(code=1)
        assert s.state == "backoff"
        clock.advance(delay)
        assert s.state == "starting"
    sp.children[-1].exit(code=1)
    assert s.state == "failed" and "crash loop" in (s.error or "")
    assert s.restart_count == 5 and result == [False]
    st = s.status()
    assert st["last_exit"]["code"] == 1 and st["pid"] is None


def test_operator_start_after_failed() -> None:
    """A failed server starts again on an explicit start()."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr, policy="no")
    s.start()
    sp.children[-1].exit(code=3)
    assert s.state == "failed"
    s.start()
    assert s.state == "starting" and len(sp.children) == 2


def test_clean_exit_with_on_failure_is_stopped() -> None:
    """on-failure leaves a cleanly exited child stopped."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr)
    s.start()
    sp.children[-1].exit(code=0)
    assert s.state == "stopped"


def test_stop_sends_term_then_kill_after_grace() -> None:
    """A child that ignores SIGTERM gets SIGKILL after the grace period."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    sp.exit_on_term = False
    s = server("A", clock, sp, pr)
    s.start()
    done = fired(s.stop())
    assert sp.children[0].signals == ["TERM"] and done == []
    clock.advance(3)
    assert sp.children[0].signals == ["TERM", "KILL"] and done == [None]
    assert s.state == "stopped" and not clock.getDelayedCalls()


def test_stop_is_not_restarted_by_policy() -> None:
    """An operator stop never triggers the restart policy, even 'always'."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr, policy="always")
    s.start()
    s.stop()
    clock.advance(60)
    assert s.state == "stopped" and len(sp.children) == 1


def test_restart_spawns_new_pid() -> None:
    """restart() stops the child and starts a new one (restart_count 1)."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    pr.ready["http://A/ready"] = True
    s = server("A", clock, sp, pr)
    s.start()
    clock.advance(0.5)
    result = fired(s.restart())
    assert s.state == "starting" and s.pid == 1001
    clock.advance(0.5)
    assert result == [True] and s.restart_count == 1


def test_never_ready_is_stopped_and_restarted() -> None:
    """A child not ready within ready_timeout is terminated and goes through the policy."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr)
    s.start()
    clock.advance(11)
    assert sp.children[0].signals == ["TERM"]
    assert s.state == "backoff" and "not ready" in (s.error or "")


def test_ready_lost_while_running() -> None:
    """A failing probe on a running child clears ready but keeps it running."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    pr.ready["http://A/ready"] = True
    s = server("A", clock, sp, pr)
    s.start()
    clock.advance(0.5)
    pr.ready["http://A/ready"] = False
    clock.advance(0.5)
    assert s.state == "running" and not s.ready


def test_supervisor_concurrency_and_shutdown_order() -> None:
    """Autostart holds start_concurrency slots until ready; stop_all stops models then gateway."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    gw = server("gateway", clock, sp, pr, kind="gateway")
    models = [server(x, clock, sp, pr) for x in ("A", "B", "C")]
    sup = Supervisor(models, gateway=gw, start_concurrency=2)
    result = fired(sup.start_all(["A", "B", "C"]))
    assert [c.spec.argv[0] for c in sp.children] == ["gateway", "A", "B"]
    pr.ready["http://A/ready"] = True
    clock.advance(0.5)
    assert [c.spec.argv[0] for c in sp.children] == ["gateway", "A", "B", "C"]
    pr.ready.update({"http://B/ready": True, "http://C/ready": True, "http://gateway/ready": True})
    clock.advance(0.5)
    assert result == [{"A": True, "B": True, "C": True, "gateway": True}]
    order: list[str] = []
    for child in sp.children:
        child.ended.addCallback(lambda _, n=child.spec.argv[0]: order.append(n))
    sp.exit_on_term = False
    for c in sp.children:
        c.exit_on_term = False
    done = fired(sup.stop_all())
    assert sp.children[0].signals == [] and all(c.signals == ["TERM"] for c in sp.children[1:])
    for c in sp.children[1:]:
        c.exit(signal=15)
    assert sp.children[0].signals == ["TERM"] and order == ["A", "B", "C"]
    sp.children[0].exit(signal=15)
    assert order == ["A", "B", "C", "gateway"] and done == [None]


def test_restart_with_slow_exit_spawns_once() -> None:
    """restart() of a child that exits after a while spawns exactly one new child."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    sp.exit_on_term = False
    s = server("A", clock, sp, pr)
    s.start()
    s.restart()
    assert len(sp.children) == 1 and sp.children[0].signals == ["TERM"]
    sp.children[0].exit(signal=15)
    assert len(sp.children) == 2 and s.restart_count == 1 and s.state == "starting"


def test_start_while_stopping_starts_after_exit() -> None:
    """A start() that arrives during a stop waits for the exit, then spawns once."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    sp.exit_on_term = False
    s = server("A", clock, sp, pr)
    s.start()
    s.stop()
    result = fired(s.start())
    sp.children[0].exit(signal=15)
    assert len(sp.children) == 2 and s.state == "starting" and result == []


def test_no_autostart_after_shutdown_began() -> None:
    """Models still queued for autostart are not spawned once stop_all has begun."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    models = [server(x, clock, sp, pr) for x in ("A", "B")]
    sup = Supervisor(models, start_concurrency=1)
    result = fired(sup.start_all(["A", "B"]))
    assert [c.spec.argv[0] for c in sp.children] == ["A"]
    fired(sup.stop_all())
    assert [c.spec.argv[0] for c in sp.children] == ["A"]
    assert result == [{"A": False, "B": False}]


def test_a_model_that_fails_to_load_says_why_in_the_status() -> None:
    """The reason a model's /ready gives (its load error) is the status' error and a log
    line; past ready_timeout it is kept in the error that stops the child."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = server("A", clock, sp, pr)
    s.start()
    reason = "model not ready (failed): ModelLoadError: model M: setup() failed: OSError"
    pr.ready["http://A/ready"] = (False, reason)  # type: ignore[assignment]
    clock.advance(0.5)
    assert s.state == "starting" and s.status()["error"] == reason
    assert any(reason in line for line in s.logs.read(0).lines)
    clock.advance(11)
    assert s.error is not None and s.error.startswith("not ready after 10 s: ")
    assert reason in s.error


def test_http_prober_reads_the_reason_of_a_503() -> None:
    """A 503 /ready's JSON error becomes the probe's reason; a 200 is ready."""
    from twisted.internet import defer

    from mortred_twisted.supervisor.monitor import http_prober

    class Response:
        def __init__(self, code: int, body: bytes) -> None:
            self.code, self.body = code, body

    class Http:
        def __init__(self, response: Response) -> None:
            self.response = response

        def get(self, url: str, **kw: Any) -> Any:
            return defer.succeed(self.response)

    import treq

    original = treq.content
    treq.content = lambda response: defer.succeed(response.body)  # type: ignore[assignment]
    try:
        body = b'{"ready":false,"state":"failed","error":"model not ready (failed): boom"}'
        answers = fired(http_prober(Http(Response(503, body)), Clock())("u"))
        assert answers == [(False, "model not ready (failed): boom")]
        assert fired(http_prober(Http(Response(200, b"{}")), Clock())("u")) == [True]
        assert fired(http_prober(Http(Response(503, b"<html>")), Clock())("u")) == [(False, None)]
    finally:
        treq.content = original  # type: ignore[assignment]
