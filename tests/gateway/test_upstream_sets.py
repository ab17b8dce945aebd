"""A model id served by several processes: which upstream gets which request."""

from __future__ import annotations

from pathlib import Path

import pytest

from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import build_control_config
from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.gateway.routing import (
    REFUSED_COOLDOWN_S,
    RouteKind,
    Upstreams,
    UpstreamSet,
    match,
    resolve,
)

A, B, C = "http://127.0.0.1:18001", "http://127.0.0.1:18002", "http://10.0.0.5:18001"

SERVER = """[server]
id = "DDPM"
port = 18001
server_uri = "/ddpm"
async_enabled = true
job_store = "{store}"
[model]
type = "fake"
"""


class Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def catalog_for(tmp_path: Path, store: str, **control: object):
    f = tmp_path / "conf" / "server" / "ddpm.toml"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(SERVER.format(store=store))
    return build_catalog(build_control_config(control, root=tmp_path))


def test_submits_go_to_the_upstream_with_fewest_requests_in_flight() -> None:
    """A busy upstream is passed over for work; ties alternate."""
    group = UpstreamSet((A, B), Now())
    group.begin(A)
    assert [group.pick(RouteKind.SUBMIT) for _ in range(3)] == [B, B, B]
    group.end(A)
    picks = {group.pick(RouteKind.INFER) for _ in range(4)}
    assert picks == {A, B}


def test_polls_rotate_over_every_healthy_upstream() -> None:
    """Polls, waits and results go round robin (the job store is shared)."""
    group = UpstreamSet((A, B, C), Now())
    assert {group.pick(RouteKind.POLL) for _ in range(3)} == {A, B, C}


def test_a_refusing_upstream_is_skipped_for_a_while() -> None:
    """After a refused connection the route moves elsewhere; the refuser rests."""
    now = Now()
    group = UpstreamSet((A, B), now)
    first = group.pick(RouteKind.SUBMIT)
    other = B if first == A else A
    group.refused(first)  # type: ignore[arg-type]
    assert {group.pick(RouteKind.SUBMIT) for _ in range(4)} == {other}
    now.t += REFUSED_COOLDOWN_S + 0.1
    assert {group.pick(RouteKind.SUBMIT) for _ in range(4)} == {A, B}


def test_replicas_map_to_consecutive_ports_and_remote_upstreams(tmp_path: Path) -> None:
    """replicas = 2 serves port and port+1; [gateway.upstreams] adds remote ones;
    resolve picks one of them and elsewhere() tries the other after a refusal."""
    catalog = catalog_for(
        tmp_path, "redis",
        servers={"DDPM": {"replicas": 2}}, gateway={"upstreams": {"DDPM": [C]}},
    )  # fmt: skip
    entry = catalog["DDPM"]
    assert entry.upstream_urls == (A, B, C)
    upstreams = Upstreams(catalog, Now())
    m = match("/v1/models/DDPM/jobs", catalog)
    assert m is not None
    route = resolve(m, catalog, "", upstreams)
    assert route.url in (A + "/jobs", B + "/jobs", C + "/jobs")
    seen = {route.base}
    while (route := route.elsewhere()) is not None:  # type: ignore[assignment]
        seen.add(route.base)
    assert seen == {A, B, C}


def test_replicas_with_the_memory_store_are_a_config_error(tmp_path: Path) -> None:
    """More than one process for an in-memory id is refused, saying why."""
    with pytest.raises(ConfigErrors) as err:
        catalog_for(tmp_path, "memory", servers={"DDPM": {"replicas": 2}})
    text = str(err.value)
    assert 'replicas = 2 needs job_store = "redis"' in text and "404" in text


def test_replica_ports_clash_with_other_servers(tmp_path: Path) -> None:
    """Replica ports count as taken: another server on port+1 is a duplicate."""
    catalog_for(tmp_path, "redis")
    other = tmp_path / "conf" / "server" / "other.toml"
    other.write_text(
        SERVER.format(store="redis").replace("DDPM", "X").replace("18001", "18002")
        .replace("/ddpm", "/x")
    )  # fmt: skip
    with pytest.raises(ConfigErrors, match=r"duplicate port 127\.0\.0\.1:18002"):
        build_catalog(build_control_config({"servers": {"DDPM": {"replicas": 2}}}, root=tmp_path))
