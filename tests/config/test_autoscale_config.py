"""Autoscale keys of ``[servers.<id>]``: defaults, checks, and the store they need."""

from __future__ import annotations

from pathlib import Path

import pytest

from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import AutoscaleSettings, build_control_config
from mortred_twisted.config.errors import ConfigErrors

SERVER = """[server]
id = "M"
port = 18001
server_uri = "/m"
async_enabled = true
job_store = "{store}"
[model]
type = "fake"
"""


def catalog_for(tmp_path: Path, store: str, table: dict[str, object]):  # type: ignore[no-untyped-def]
    f = tmp_path / "conf" / "server" / "m.toml"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(SERVER.format(store=store))
    return build_catalog(build_control_config({"servers": {"M": table}}, root=tmp_path))


def test_max_replicas_turns_autoscaling_on_with_defaults(tmp_path: Path) -> None:
    """max_replicas alone: the documented defaults, and every port up to the max is the
    id's (the gateway knows them all)."""
    entry = catalog_for(tmp_path, "redis", {"max_replicas": 3})["M"]
    assert entry.autoscale == AutoscaleSettings(max_replicas=3)
    assert entry.replicas == 3
    assert entry.upstream_urls[-1].endswith(":18003")
    assert entry.to_json()["autoscale"]["min_replicas"] == 1


def test_every_key_is_read(tmp_path: Path) -> None:
    """Each documented key lands in the settings (autoscale_interval_s as interval_s)."""
    table = {
        "min_replicas": 0,
        "max_replicas": 4,
        "target_backlog_per_replica": 2.5,
        "scale_up_window_s": 1,
        "scale_down_window_s": 20,
        "idle_to_zero_s": 45,
        "max_step": 2,
        "cooldown_s": 3,
        "autoscale_interval_s": 0.5,
        "cold_start_max_waiting": 8,
        "cold_start_timeout_s": 30,
    }
    a = catalog_for(tmp_path, "redis", table)["M"].autoscale
    assert a is not None
    assert (a.min_replicas, a.max_replicas, a.target_backlog_per_replica) == (0, 4, 2.5)
    assert (a.scale_up_window_s, a.scale_down_window_s, a.idle_to_zero_s) == (1, 20, 45)
    assert (a.max_step, a.cooldown_s, a.interval_s) == (2, 3, 0.5)
    assert (a.cold_start_max_waiting, a.cold_start_timeout_s) == (8, 30)


def test_the_memory_store_refuses_autoscaling(tmp_path: Path) -> None:
    """Autoscaling on the in-memory store is a config error that says why and what to use."""
    with pytest.raises(ConfigErrors) as e:
        catalog_for(tmp_path, "memory", {"max_replicas": 2, "min_replicas": 0})
    text = str(e.value)
    assert 'autoscaling (max_replicas) needs job_store = "redis"' in text
    assert "fixed replicas = N" in text


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"min_replicas": 0}, "min_replicas need max_replicas"),
        ({"max_replicas": 2, "replicas": 2}, "replicas is a fixed count"),
        ({"max_replicas": 2, "min_replicas": 3}, "max_replicas (2) must be >= min_replicas (3)"),
        ({"max_replicas": 0}, "servers.M.max_replicas: must be >= 1"),
        ({"max_replicas": 2, "target_backlog_per_replica": 0}, "must be >= 0.01"),
        ({"max_replicas": 2, "idle_to_zero_s": -1}, "idle_to_zero_s: must be >= 0"),
        ({"max_replicas": 2, "scale_down_windo_s": 5}, "did you mean 'scale_down_window_s'"),
    ],
)
def test_inconsistent_settings_are_reported(table: dict[str, object], message: str) -> None:
    """Each inconsistent or out-of-range autoscale key is a problem naming the table."""
    with pytest.raises(ConfigErrors) as e:
        build_control_config({"servers": {"M": table}})
    assert message in str(e.value)


def test_the_shipped_autoscale_example_loads() -> None:
    """conf/autoscale/mortred.toml and its catalog form a valid autoscaled catalog."""
    from mortred_twisted.config.control import load_control_config

    root = Path(__file__).resolve().parents[2]
    catalog = build_catalog(load_control_config(root / "conf" / "autoscale" / "mortred.toml"))
    entry = catalog["FAKE_AUTOSCALE"]
    assert entry.autoscale is not None and entry.autoscale.min_replicas == 0
    assert entry.replicas == 3 and entry.job_store == "redis"
