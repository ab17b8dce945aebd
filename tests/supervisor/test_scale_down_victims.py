"""Issue 36.2: scale-down stops idle replicas first, and the in-flight count keeps the
sync requests of ready replicas while another replica drains (task.Clock, fakes)."""

from __future__ import annotations

from mortred_twisted.supervisor.replicas import victims

from .test_scaler import Rig


def test_victims_prefer_not_ready_then_idle_then_highest_index() -> None:
    up = [(0, True, 0), (1, True, 3), (2, True, 0), (3, False, None)]
    assert victims(up, 1) == [3]  # not ready: serves nothing yet
    assert victims(up, 2) == [3, 2]  # then the idle ones, highest index first
    assert victims(up, 3) == [3, 2, 0]
    assert victims(up, 4) == [3, 2, 0, 1]  # the busy one only when nothing else is left
    # An unreadable figure is not taken for idle.
    assert victims([(0, True, None), (1, True, 1), (2, True, 0)], 2) == [2, 1]


def test_a_scale_down_keeps_the_replica_running_a_job() -> None:
    """3 ready replicas, one job running on replica 3 (index 2): when the load falls
    to one replica's worth, replicas 1 and 2 are stopped and replica 3 keeps its job."""
    rig = Rig()
    for i in range(3):
        rig.boot(i)
    rig.meter.backlog_value = 40
    rig.run(2.0)
    assert [r.ready for r in rig.group.replicas] == [True, True, True]
    rig.meter.backlog_value = 1
    rig.meter.running = 1
    rig.meter.busy = {"http://m2": 1}
    rig.spawner.exit_on_term = False  # see who is told to stop
    for child in rig.spawner.children:
        child.exit_on_term = False
    rig.run(8)
    stopped = [r.id for r in rig.group.replicas if r.stopping]
    assert stopped == ["M@1", "M@2"]
    assert not rig.group.replicas[2].stopping and rig.group.replicas[2].ready
    assert rig.scaler.decisions["scale_down"] == 1


def test_in_flight_counts_sync_requests_while_a_replica_drains_its_jobs() -> None:
    """Replica 1 serves one sync request; replica 3 is being stopped and still runs
    two jobs (their leases are in the store's running count). In flight is 1: the
    draining replica's busy workers are read too, so its jobs are not taken off
    replica 1's sync request (before: max(0, 1 - 2) = 0, an undercount)."""
    rig = Rig()
    for i in range(3):
        rig.boot(i)
    rig.meter.backlog_value = 40
    rig.run(2.0)
    for child in rig.spawner.children:
        child.exit_on_term = False
    draining = rig.group.replicas[2]
    draining.stop()
    assert draining.stopping and draining.pid is not None
    rig.meter.backlog_value = 2
    rig.meter.running = 2
    rig.meter.busy = {"http://m0": 1, "http://m2": 2}
    rig.scaler.tick()
    assert rig.scaler.status()["inflight"] == 1
