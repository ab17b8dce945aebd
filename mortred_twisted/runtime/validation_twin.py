"""A model's *validation twin* in Redis: what lets the gateway admit a job while the
model id runs no replica (issue 27 item 3).

**Replica side** (:func:`publish_twin`, reactor thread): every replica of a model on
the Redis job store writes, once it is ready (models loaded, Redis reached), one
JSON document under ``mortred:{<id>}:twin`` (beside the store's other keys, in its
hash slot; never deleted, so it outlives the last replica). The document says
either that the model validates with its declaration alone::

    {"format": 1, "admit": true, "model_id": "...", "declaration": {...},
     "input_limits": [max_images, max_pixels] | null, "settings": {...}}

or that it does not (``"admit": false`` and ``"why"``): a model that is not an
:class:`~mortred_twisted.sdk.adapter.SdkModel` (a built-in that implements
``Model.validate`` in code), a subclass that overrides ``validate``, or an instance
with ``check_inputs`` (config-dependent checks its twin cannot make). The last
replica to become ready wins (replicas of one id run one version).

``settings`` are the submit settings the replica runs with (:data:`SETTINGS`); the
gateway admits only when its own reading of the server file agrees, so a file
edited since, or an environment that differs, falls back to holding.

**Gateway side** (:func:`parse_twin`, pure): the document read back is checked
defensively (size, JSON shape, format, settings, declaration): anything unexpected
is a reason string, never an exception, and the caller keeps holding requests.

Ownership: the key is written by our replicas only; the gateway only reads it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mortred_twisted.config.server import ServerConfig
from mortred_twisted.stores.redis_scripts import key_prefix

log = Logger()

TWIN_FORMAT = 1
#: a document larger than this is refused unread (a declaration is a few KiB)
MAX_TWIN_BYTES = 1 << 20
#: the server settings admission depends on; the gateway's reading must agree
SETTINGS = (
    "async_enabled",
    "async_max_queue",
    "async_max_queue_per_caller",
    "async_job_ttl",
    "async_max_completed",
    "async_timeout",
    "job_lease_ms",
    "job_max_attempts",
    "webhook_allowed_hosts",
    "request_size_limit",
    "rate_limit_qps",
    "output_files",
    "model_type",
)


def twin_key(model_id: str) -> str:
    """``mortred:{<id>}:twin``: where the replicas of ``model_id`` keep their twin."""
    return key_prefix(model_id) + "twin"


def submit_settings(config: ServerConfig) -> dict[str, Any]:
    """The :data:`SETTINGS` of ``config`` as JSON values (tuples as lists)."""
    out: dict[str, Any] = {}
    for name in SETTINGS:
        value = getattr(config, name)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def admissible_twin(model: Any) -> tuple[Any, str]:
    """``(twin, "")``: a weightless :class:`SdkModel` that validates exactly as the
    loaded ``model`` does (a validator of a model server), or ``(None, why)``."""
    from mortred_twisted.models.isolated import IsolatedModel
    from mortred_twisted.sdk.adapter import SdkModel

    local = model
    if isinstance(model, IsolatedModel):
        # The server validates with the twin its worker sent (the instance lives in
        # the worker process): that twin is what a request meets here.
        local = model.validation_twin()
    if not isinstance(local, SdkModel):
        return None, f"{type(local).__name__} is not an SDK model (validate is code)"
    kind = type(local)
    if kind.validate is not SdkModel.validate or getattr(kind, "_validate", None) is not getattr(
        SdkModel, "_validate", None
    ):
        return None, f"{type(local).__name__} overrides validate"
    if local.instance is not None and getattr(local.instance, "check_inputs", None) is not None:
        return None, "the model checks inputs with its instance (check_inputs)"
    return SdkModel(local.declaration, None, input_limits=local.input_limits), ""


def twin_document(model: Any, config: ServerConfig) -> bytes:
    """The document a replica of ``config`` serving ``model`` publishes."""
    twin, why = admissible_twin(model)
    doc: dict[str, Any] = {"format": TWIN_FORMAT, "model_id": config.id}
    if twin is None:
        doc.update(admit=False, why=why)
    else:
        limits = twin.input_limits
        doc.update(
            admit=True,
            declaration=twin.declaration.to_json(),
            input_limits=None if limits is None else [limits.max_images, limits.max_pixels],
            settings=submit_settings(config),
        )
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


@dataclass(frozen=True)
class ParsedTwin:
    """What :func:`parse_twin` made of a document: the twin, or why there is none."""

    twin: Any | None
    why: str = ""


def _limit(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError(f"input limit {value!r}")
    return value


def parse_twin(raw: Any, config: ServerConfig) -> ParsedTwin:
    """The twin in ``raw`` (the key's value: bytes, or None when absent) for a model
    whose server config reads ``config`` (never raises)."""
    if raw is None:
        return ParsedTwin(None, "no twin published yet (no replica of this id was ready)")
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if not isinstance(raw, bytes) or len(raw) > MAX_TWIN_BYTES:
        return ParsedTwin(None, "twin document too large or not a string")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        return ParsedTwin(None, f"twin document is not JSON: {exc}")
    if not isinstance(doc, dict) or doc.get("format") != TWIN_FORMAT:
        return ParsedTwin(None, "twin document of an unknown format")
    if doc.get("model_id") != config.id:
        return ParsedTwin(None, f"twin document names model {doc.get('model_id')!r}")
    if doc.get("admit") is not True:
        why = doc.get("why")
        return ParsedTwin(None, f"the model cannot be validated here: {why}"[:300])
    settings = doc.get("settings")
    if not isinstance(settings, Mapping):
        return ParsedTwin(None, "twin document without settings")
    ours = submit_settings(config)
    differ = sorted(k for k in SETTINGS if settings.get(k) != ours[k])
    if differ:
        return ParsedTwin(
            None, f"the replica ran with other settings than the server file: {', '.join(differ)}"
        )
    try:
        from mortred_twisted.model_api.input_limits import InputLimits
        from mortred_twisted.sdk.adapter import SdkModel
        from mortred_twisted.sdk.declaration import Declaration

        declaration = Declaration.from_json(doc["declaration"])
        packed = doc.get("input_limits")
        limits = None
        if packed is not None:
            if not isinstance(packed, list) or len(packed) != 2:
                raise ValueError("input_limits must be [max_images, max_pixels]")
            limits = InputLimits(_limit(packed[0]), _limit(packed[1]))
        return ParsedTwin(SdkModel(declaration, None, input_limits=limits))
    except Exception as exc:  # a damaged declaration: hold instead
        return ParsedTwin(None, f"twin declaration unreadable: {type(exc).__name__}: {exc}"[:300])


def publish_twin(runtime: Any) -> Deferred[None]:
    """Write ``runtime``'s twin document once its Redis store is reached (a replica
    at ready; reactor thread). Nothing for a memory store or a model that did not
    load; a failure is logged, never raised (the gateway then keeps holding)."""
    config: ServerConfig = runtime.config
    d: Deferred[None] = Deferred()
    if config.job_store != "redis" or not config.async_enabled or not runtime.models:
        d.callback(None)
        return d
    store = runtime.store
    raw = twin_document(runtime.validator, config)
    connected = store.when_connected()
    connected.addCallback(lambda _: store.link.call("SET", twin_key(config.id), raw))

    def done(_: Any) -> None:
        admits = b'"admit":true' in raw
        log.info(
            "validation twin of {id} published ({what})",
            id=config.id,
            what="the gateway may admit jobs at zero replicas" if admits else "hold only",
        )

    def failed(failure: Any) -> None:
        log.warn("publishing the validation twin failed: {e}", e=failure.getErrorMessage())

    connected.addCallbacks(done, failed)
    connected.chainDeferred(d)
    return d
