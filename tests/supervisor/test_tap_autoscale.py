"""The supervisor's entry with an autoscaled id: a scaler per id, reading the Redis
store the children use (their environment applies, as in the child)."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.testing import MemoryReactorClock

from mortred_twisted.supervisor.replicas import ReplicaGroup
from mortred_twisted.tap.supervisor import Options, build_service

SERVER = """[server]
id = "A"
port = 18001
server_uri = "/a"
async_enabled = true
job_store = "redis"
redis_url = "redis://127.0.0.1:6390/0"
[model]
type = "fake"
"""


def test_an_autoscaled_id_gets_a_group_of_max_replicas_and_a_scaler(tmp_path: Path) -> None:
    """max_replicas = 3, min 0: a group of three members with floor 0, a scaler whose
    meter reads the child's Redis (MORTRED_REDIS_URL wins, as in the child) under
    the child's id (MORTRED_ID)."""
    d = tmp_path / "conf" / "server"
    d.mkdir(parents=True)
    (d / "a.toml").write_text(SERVER)
    path = tmp_path / "conf" / "mortred.toml"
    path.write_text(
        f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n'
        "[servers.A]\nmin_replicas = 0\nmax_replicas = 3\n"
    )
    o = Options()
    o.parseOptions(["--config", str(path)])
    env = {"MORTRED_REDIS_URL": "redis://127.0.0.1:6999/2", "MORTRED_ID": "A2"}
    svc = build_service(o, MemoryReactorClock(), env)
    group = svc.supervisor.models["A"]
    assert isinstance(group, ReplicaGroup)
    assert [r.id for r in group.replicas] == ["A@1", "A@2", "A@3"]
    assert group.floor == 0
    scaler = svc.supervisor.scalers["A"]
    meter = scaler.meter
    assert meter.link.address.port == 6999 and meter.link.address.db == 2
    assert meter.model_id == "A2"
    assert svc.meters == [meter]
