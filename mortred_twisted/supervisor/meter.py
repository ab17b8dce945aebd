"""``StoreMeter``: the figures an autoscaled id is scaled on (reactor thread).

* **Backlog** from the Redis job store the id's replicas share: the ``depth`` key
  (admitted jobs not terminal: pending + running, the store's invariant 3) and the
  ``leases`` ZSET's size (running jobs), read with ``GET`` and ``ZCARD`` on the
  supervisor's own :class:`~mortred_twisted.stores.redis_link.RedisLink` (it
  subscribes to a channel nobody publishes on). Readable with no replica running,
  so the scaler sees a backlog at zero.
* **Busy workers** of one replica: ``mortred_workers_busy`` from its ``/metrics``
  (with the internal token). The scaler counts the busy workers not running a job
  as the synchronous requests in flight.

Nothing raises: a figure that cannot be read is None.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.internet import defer

from mortred_twisted.config.server import (
    RedisAddress,
    ServerConfig,
    build_server_config,
    find_root,
    redis_address,
)
from mortred_twisted.http11.upstream import UpstreamClient
from mortred_twisted.stores.redis_scripts import key_prefix
from mortred_twisted.supervisor.scaler import Reading

_BUSY = b"mortred_workers_busy "


def child_config(config_path: str, env: Mapping[str, str]) -> ServerConfig:
    """The server config a model child loads from ``config_path`` with ``env`` (its
    environment: ``MORTRED_REDIS_URL`` and the like apply, as in the child)."""
    path = Path(config_path)
    document = tomllib.loads(path.read_text(encoding="utf-8"))
    return build_server_config(
        document, source=str(path), root=find_root(path), env=env, read_model_file=False
    )


def child_redis_address(config_path: str, env: Mapping[str, str]) -> RedisAddress:
    """Where the children of ``config_path`` keep their jobs (see :func:`child_config`)."""
    return redis_address(child_config(config_path, env))


class StoreMeter:
    """One model id's :class:`~mortred_twisted.supervisor.scaler.Meter`."""

    def __init__(
        self,
        model_id: str,
        link: Any,
        http: UpstreamClient,
        internal_token: str = "",
    ) -> None:
        self.model_id = model_id
        self.link = link
        self.http = http
        prefix = key_prefix(model_id)
        self._depth = prefix + "depth"
        self._leases = prefix + "leases"
        self._headers: dict[bytes, list[bytes]] = {}
        if internal_token:
            self._headers[b"authorization"] = [b"Bearer " + internal_token.encode("latin-1")]

    @classmethod
    def on_redis(
        cls,
        reactor: Any,
        model_id: str,
        address: RedisAddress,
        http: UpstreamClient,
        internal_token: str = "",
        timeout_s: float = 3.0,
    ) -> StoreMeter:
        """A meter with its own link to ``address`` (call :meth:`start`)."""
        from mortred_twisted.stores.redis_link import RedisLink

        prefix = key_prefix(model_id)
        link = RedisLink(
            reactor,
            address,
            channel=prefix + "autoscale",
            stream=prefix + "queue",
            on_event=lambda _m: None,
            on_subscribed=lambda: None,
            reply_timeout_s=timeout_s,
        )
        return cls(model_id, link, http, internal_token)

    def start(self) -> None:
        self.link.start()

    def stop(self) -> defer.Deferred[Any]:
        return self.link.stop()

    def backlog(self) -> defer.Deferred[Reading]:
        d = defer.gatherResults(
            [self.link.call("GET", self._depth), self.link.call("ZCARD", self._leases)],
            consumeErrors=True,
        )

        def read(reply: list[Any]) -> Reading:
            depth, running = reply
            return Reading(int(depth or 0), int(running or 0))

        d.addCallback(read)
        d.addErrback(lambda _f: Reading(None, None))
        return d

    def busy_workers(self, base_url: str) -> defer.Deferred[int | None]:
        d = self.http.request("GET", base_url + "/metrics", self._headers)

        def parse(response: Any) -> int | None:
            if response.code != 200:
                return None
            for line in response.body.splitlines():
                if line.startswith(_BUSY):
                    return int(float(line[len(_BUSY) :]))
            return None

        d.addCallback(parse)
        d.addErrback(lambda _f: None)
        return d
