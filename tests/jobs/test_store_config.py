"""The job-store keys of a model server's config: job_store, redis_url and friends."""

from __future__ import annotations

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config, parse_redis_url


def config(env: dict[str, str] | None = None, **server: object):
    doc = {"server": {"id": "T", **server}, "model": {"type": "fake"}}
    return build_server_config(doc, env=env or {}, read_model_file=False)


def test_the_default_is_the_memory_store_on_local_redis_url() -> None:
    """Without the keys a server keeps its jobs in memory."""
    cfg = config()
    assert cfg.job_store == "memory" and cfg.redis_url == "redis://127.0.0.1:6379/0"
    assert cfg.job_lease_ms == 10000 and cfg.job_max_attempts == 2


def test_the_environment_url_wins_over_the_file() -> None:
    """MORTRED_REDIS_URL overrides redis_url from the file."""
    cfg = config({"MORTRED_REDIS_URL": "redis://10.0.0.9:7000/3"}, job_store="redis",
                 redis_url="redis://127.0.0.1:6379/0")  # fmt: skip
    assert cfg.redis_url == "redis://10.0.0.9:7000/3"


def test_every_store_problem_is_reported_together() -> None:
    """An unknown store, a bad URL and an out-of-range lease are all listed at once."""
    with pytest.raises(ConfigErrors) as err:
        config(job_store="etcd", redis_url="http://x", job_lease_ms=10, job_max_attempts=0)
    text = str(err.value)
    assert "server.job_store: must be 'memory' or 'redis' (got 'etcd')" in text
    assert "server.redis_url: must start with redis://" in text
    assert "server.job_lease_ms: must be >= 500" in text
    assert "server.job_max_attempts: must be >= 1" in text


def test_a_password_in_the_url_is_never_shown() -> None:
    """The parsed URL keeps the password for AUTH but only ever prints it redacted,
    and a config error about the URL does not echo it."""
    address = parse_redis_url("redis://app:s3cr%40t@db.local:6380/2")
    assert (address.username, address.password) == ("app", "s3cr@t")
    assert (address.host, address.port, address.db) == ("db.local", 6380, 2)
    assert address.redacted() == "redis://app:***@db.local:6380/2"
    assert "s3cr" not in repr(address)
    with pytest.raises(ConfigErrors) as err:
        config(redis_url="redis://u:hunter2@host:notaport/0")
    assert "hunter2" not in str(err.value)
