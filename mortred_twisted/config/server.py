"""The model-server configuration: schema, TOML loading, environment overrides (pure).

A server TOML has two tables::

    [server]            # process, HTTP and job-ledger keys (SERVER_KEYS below)
    [model]             # type = "<registry key>", config = "<model toml>", overrides...

Every problem of a file is collected and raised together as :class:`ConfigErrors`.
Unknown keys are errors, with "did you mean" for near misses. Paths are relative to
the project root: the parent of the ``conf/`` folder that holds the file (or an
explicit ``root``).

Environment overrides (the supervisor sets the first three when it spawns a model):
``MORTRED_LISTEN_HOST``, ``MORTRED_LISTEN_PORT``, ``MORTRED_AUTH_TOKEN``, and
``MORTRED_<KEY>`` for any other server key (e.g. ``MORTRED_ASYNC_MAX_QUEUE=4``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlsplit

from mortred_twisted.config.errors import ConfigErrors, check_value, did_you_mean
from mortred_twisted.jobs.webhooks import normalise_allowed_hosts, secret_key
from mortred_twisted.model_api.input_limits import input_limit_problems, takes_input_limits


@dataclass(frozen=True)
class ServerConfig:
    """A validated model-server configuration. Times are milliseconds unless named."""

    id: str
    category: str = "default"
    host: str = "127.0.0.1"
    port: int = 18100
    server_uri: str = "/infer"
    worker_nums: int = 1
    max_connections: int = 1024
    max_connections_per_client: int = 0  # per client address; 0 = no cap
    body_budget: float = 256.0  # MB of request bodies held at once; 0 = no budget
    peer_resp_timeout: int = 600  # s a connection may wait on its client; 0 = none
    request_size_limit: float = 16.0  # MB
    request_read_timeout: int = 60000  # head + body of one request; 0 = none
    model_run_timeout: int = 60000
    auth_token: str = ""
    rate_limit_qps: float = 0.0
    max_queue_depth: int = 64
    max_batch_size: int = 1
    max_batch_delay_ms: float = 0.0
    worker_isolation: str = "thread"
    worker_nice: int = 10
    torch_threads: int = 0  # intra-op threads; 0 = CPUs // worker_nums
    async_enabled: bool = False
    async_timeout: int = 600000
    async_max_queue: int = 8
    async_job_ttl: int = 300000
    async_max_completed: int = 100
    async_max_queue_per_caller: int = 0  # a caller's pending + running (0 = no own limit)
    job_store: str = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_ca_file: str = ""  # rediss://: CA bundle to verify Redis with ("" = system store)
    redis_cert_file: str = ""  # rediss://: client certificate (mutual TLS), PEM
    redis_key_file: str = ""  # its private key, PEM
    redis_timeout_ms: int = 3000  # a Redis connection silent this long is replaced
    job_lease_ms: int = 10000
    job_max_attempts: int = 2
    cancel_grace_ms: int = 5000  # process workers: kill a run that ignores cancel after this
    webhook_allowed_hosts: tuple[str, ...] = ()  # deny by default (no webhooks)
    webhook_secret: str = ""  # Standard Webhooks signing secret (env MORTRED_WEBHOOK_SECRET)
    output_files: str = "files"  # SDK jobs' Image/File outputs: "files" (URLs) or "inline"
    result_files_dir: str = ""  # where result files live ("": see stores/result_files.py)
    result_files_s3_endpoint: str = ""  # for an s3:// result_files_dir ("": AWS's)
    result_files_s3_region: str = "us-east-1"
    model_type: str = "fake"
    model_config: str | None = None
    model_options: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    root: str = "."

    @property
    def request_size_limit_bytes(self) -> int:
        return int(self.request_size_limit * 1024 * 1024)

    @property
    def body_budget_bytes(self) -> int:
        return int(self.body_budget * 1024 * 1024)


#: server-table key -> accepted Python types, in the order the docs list them.
SERVER_KEYS: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {
        "id": (str,),
        "category": (str,),
        "host": (str,),
        "port": (int,),
        "server_uri": (str,),
        "worker_nums": (int,),
        "max_connections": (int,),
        "max_connections_per_client": (int,),
        "body_budget": (int, float),
        "http_server": (str,),
        "peer_resp_timeout": (int,),
        "request_size_limit": (int, float),
        "request_read_timeout": (int,),
        "model_run_timeout": (int,),
        "auth_token": (str,),
        "rate_limit_qps": (int, float),
        "max_queue_depth": (int,),
        "max_batch_size": (int,),
        "max_batch_delay_ms": (int, float),
        "worker_isolation": (str,),
        "worker_nice": (int,),
        "torch_threads": (int,),
        "async_enabled": (bool,),
        "async_timeout": (int,),
        "async_max_queue": (int,),
        "async_job_ttl": (int,),
        "async_max_completed": (int,),
        "async_max_queue_per_caller": (int,),
        "job_store": (str,),
        "redis_url": (str,),
        "redis_ca_file": (str,),
        "redis_cert_file": (str,),
        "redis_key_file": (str,),
        "redis_timeout_ms": (int,),
        "job_lease_ms": (int,),
        "job_max_attempts": (int,),
        "cancel_grace_ms": (int,),
        "webhook_allowed_hosts": (list,),
        "webhook_secret": (str,),
        "output_files": (str,),
        "result_files_dir": (str,),
        "result_files_s3_endpoint": (str,),
        "result_files_s3_region": (str,),
    }
)

_ENV_ALIASES = {
    "MORTRED_LISTEN_HOST": "host",
    "MORTRED_LISTEN_PORT": "port",
    "MORTRED_AUTH_TOKEN": "auth_token",
}

_RANGES: Mapping[str, tuple[float | None, float | None]] = {
    "port": (1, 65535),
    "redis_timeout_ms": (200, 60000),
    "worker_nums": (1, 256),
    "max_connections": (1, None),
    "max_connections_per_client": (0, None),
    "body_budget": (0, 1048576),
    "peer_resp_timeout": (0, None),
    "request_size_limit": (0.001, 4096),
    "request_read_timeout": (0, None),
    "model_run_timeout": (0, None),
    "rate_limit_qps": (0, None),
    "max_queue_depth": (0, None),
    "max_batch_size": (1, 1024),
    "max_batch_delay_ms": (0, 10000),
    "worker_nice": (0, 19),
    "torch_threads": (0, 1024),
    "async_timeout": (0, None),
    # async_max_queue <= 0 is legal: it admits nothing (seed contract).
    "async_job_ttl": (0, None),
    "async_max_completed": (0, None),
    "async_max_queue_per_caller": (0, None),
    "job_lease_ms": (500, None),
    "job_max_attempts": (1, 100),
    "cancel_grace_ms": (0, None),
}


@dataclass(frozen=True)
class RedisAddress:
    """Where the Redis job store lives and how to reach it: ``redis_url`` plus the
    ``redis_*_file`` keys.

    ``redis[s]://[[user]:password@]host[:port][/db]``: ``rediss`` is TLS (verified
    against ``ca_file``, else the system's trust store; ``cert_file``/``key_file``
    add a client certificate); ``host`` is a name, an IPv4 address or a bracketed
    IPv6 one (``[::1]``). :meth:`redacted` is the only form that may be logged or
    shown (the password never is).
    """

    host: str
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def redacted(self) -> str:
        auth = ""
        if self.password is not None:
            auth = f"{self.username or ''}:***@"
        elif self.username:
            auth = f"{self.username}@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'rediss' if self.tls else 'redis'}://{auth}{host}:{self.port}/{self.db}"


def parse_redis_url(url: str) -> RedisAddress:
    """Parse ``redis_url``; ValueError (whose text never holds the password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("must start with redis:// or rediss:// (TLS)")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("invalid port") from None
    if not parts.hostname:
        raise ValueError("needs a host (redis://127.0.0.1:6379/0)")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError("the path must be a database number (/0)")
    if parts.query or parts.fragment:
        raise ValueError("takes no query or fragment")
    return RedisAddress(
        host=parts.hostname,
        port=port,
        db=int(path or 0),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme == "rediss",
    )


def redis_address(config: ServerConfig) -> RedisAddress:
    """The Redis job store's address with its TLS files (paths relative to the
    project root); the config was validated, so the URL parses."""
    address = parse_redis_url(config.redis_url)

    def path(value: str) -> str:
        return str(Path(config.root) / value) if value else ""

    return replace(
        address,
        ca_file=path(config.redis_ca_file),
        cert_file=path(config.redis_cert_file),
        key_file=path(config.redis_key_file),
    )


def job_store_problems(server: Mapping[str, Any], root: Path | None = None) -> list[str]:
    """Problems of the job-store keys (``job_store``, ``redis_*``) of one server."""
    problems: list[str] = []
    store = server.get("job_store", "memory")
    if store not in ("memory", "redis"):
        problems.append(f"server.job_store: must be 'memory' or 'redis' (got {store!r})")
    url = server.get("redis_url", ServerConfig.redis_url)
    tls = False
    if isinstance(url, str):
        try:
            tls = parse_redis_url(url).tls
        except ValueError as exc:
            problems.append(f"server.redis_url: {exc}")
            tls = True  # one problem is enough
    files = {k: server.get(k, "") for k in ("redis_ca_file", "redis_cert_file", "redis_key_file")}
    for key, value in files.items():
        if not isinstance(value, str) or not value:
            continue
        if not tls:
            problems.append(f"server.{key}: needs a rediss:// redis_url (TLS)")
        elif root is not None and not (root / value).is_file():
            problems.append(f"server.{key}: file not found: {root / value}")
    if bool(files["redis_cert_file"]) != bool(files["redis_key_file"]):
        problems.append("server.redis_cert_file and redis_key_file: give both or neither")
    return problems


def is_file_target(model_type: str) -> bool:
    """``models/x.py:Class`` (a file), as opposed to ``pkg.mod:Class`` or a name."""
    module, sep, _ = model_type.rpartition(":")
    return bool(sep) and module.endswith(".py")


def _resolve_model_file(model_type: str, source: str) -> tuple[str, str | None]:
    """A ``file.py:Class`` type with its file made absolute (relative to the folder of
    the server file ``source``), and the problem if that file does not exist."""
    if not is_file_target(model_type):
        return model_type, None
    file, _, attr = model_type.rpartition(":")
    path = Path(file)
    if not path.is_absolute():
        base = Path(source).parent if source and not source.startswith("<") else Path(".")
        path = (base / path).resolve()
    if not attr.isidentifier():
        return model_type, f"model.type: {model_type!r}: {attr!r} is not a class name"
    if not path.is_file():
        return model_type, f"model.type: {model_type!r}: file not found: {path}"
    return f"{path}:{attr}", None


def find_root(path: Path) -> Path:
    """The project root for a config file: the parent of the nearest ``conf/`` folder
    above it, else the file's own folder (never the working directory). The one rule
    for relative paths in ``mortred.toml`` and server files (docs/operations.md
    § Configure); only ``[model] type = "file.py:Class"`` is relative to the server
    file itself (:func:`_resolve_model_file`)."""
    for parent in path.resolve().parents:
        if parent.name == "conf":
            return parent.parent
    return path.resolve().parent


def _parse_env_value(raw: str, types: tuple[type, ...]) -> Any:
    if list in types:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if bool in types:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {raw!r}")
    if int in types:
        try:
            return int(raw)
        except ValueError:
            if float in types:
                return float(raw)
            raise
    if float in types:
        return float(raw)
    return raw


def env_overrides(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Server keys set through the environment, and problems parsing them."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    candidates = {f"MORTRED_{key.upper()}": key for key in SERVER_KEYS}
    candidates.update(_ENV_ALIASES)
    for var, key in candidates.items():
        if var not in env:
            continue
        try:
            values[key] = _parse_env_value(env[var], SERVER_KEYS[key])
        except ValueError as exc:
            problems.append(f"environment {var}: {exc}")
    return values, problems


def _s3_problems(server: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """An ``s3://`` ``result_files_dir``: its URL, endpoint, region and credentials."""
    from mortred_twisted.config.s3 import credentials_problem, is_s3_url, parse_s3_url

    where = server.get("result_files_dir", "")
    if not isinstance(where, str) or not is_s3_url(where):
        return []
    problems: list[str] = []
    try:
        parse_s3_url(where)
    except ValueError as exc:
        problems.append(f"server.result_files_dir: {exc}")
    endpoint = server.get("result_files_s3_endpoint", "")
    if isinstance(endpoint, str) and endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            problems.append(
                f"server.result_files_s3_endpoint: an http(s) URL, e.g. "
                f"'http://127.0.0.1:8333' (got {endpoint!r})"
            )
    region = server.get("result_files_s3_region", "us-east-1")
    if isinstance(region, str) and not (region and region.replace("-", "").isalnum()):
        problems.append(f"server.result_files_s3_region: e.g. 'us-east-1' (got {region!r})")
    missing = credentials_problem(env)
    if missing is not None:
        problems.append(f"server.result_files_dir = {where!r}: {missing}")
    return problems


def build_server_config(
    document: Mapping[str, Any],
    *,
    source: str = "<memory>",
    root: Path | None = None,
    env: Mapping[str, str] | None = None,
    read_model_file: bool = True,
) -> ServerConfig:
    """Validate a parsed server TOML document and return the frozen config.

    Raises :class:`ConfigErrors` listing every problem.
    """
    problems: list[str] = []
    root = (root or Path(".")).resolve()
    for table in document:
        if table not in ("server", "model"):
            problems.append(f"unknown table [{table}]{did_you_mean(table, ['server', 'model'])}")
    server = dict(document.get("server", {}))
    model = dict(document.get("model", {}))
    for key in list(server):
        if key not in SERVER_KEYS:
            problems.append(f"server.{key}: unknown key{did_you_mean(key, SERVER_KEYS)}")
            del server[key]
    env_values, env_problems = env_overrides(env if env is not None else os.environ)
    problems.extend(env_problems)
    server.update(env_values)
    if "id" not in server:
        problems.append("server.id: required (the catalog id, e.g. 'DDPM')")
    for key, value in server.items():
        check_value(
            f"server.{key}", value, SERVER_KEYS[key], _RANGES.get(key, (None, None)), problems
        )
    isolation = server.get("worker_isolation", "thread")
    if isolation not in ("thread", "process"):
        problems.append(
            f"server.worker_isolation: must be 'thread' or 'process' (got {isolation!r})"
        )
    # Kept as a key so that old configs get a clear word: one server serves every port.
    http_server = server.pop("http_server", "llhttp")
    if http_server != "llhttp":
        problems.append(
            f"server.http_server: {http_server!r} is no longer offered: every port is served "
            "by the project's HTTP/1.1 server (remove the key)"
        )
    problems.extend(job_store_problems(server, root))
    hosts = server.get("webhook_allowed_hosts", [])
    if isinstance(hosts, list):
        if not all(isinstance(h, str) and h.strip() for h in hosts):
            problems.append(
                "server.webhook_allowed_hosts: must be a list of host names, addresses "
                "or CIDR ranges"
            )
        else:
            try:
                server["webhook_allowed_hosts"] = tuple(sorted(normalise_allowed_hosts(hosts)))
            except ValueError as exc:
                problems.append(f"server.webhook_allowed_hosts: {exc}")
    secret = server.get("webhook_secret", "")
    if isinstance(secret, str) and secret:
        try:
            secret_key(secret)
        except ValueError as exc:
            problems.append(f"server.{exc}")
    output_files = server.get("output_files", "files")
    if output_files not in ("files", "inline"):
        problems.append(f"server.output_files: must be 'files' or 'inline' (got {output_files!r})")
    problems.extend(_s3_problems(server, env if env is not None else os.environ))
    uri = server.get("server_uri", "/infer")
    if isinstance(uri, str) and not uri.startswith("/"):
        problems.append(f"server.server_uri: must start with '/' (got {uri!r})")
    if isinstance(uri, str) and (uri == "/jobs" or uri.startswith("/jobs/")):
        problems.append("server.server_uri: must not shadow the /jobs routes")

    model_type = model.pop("type", None)
    if not isinstance(model_type, str) or not model_type:
        problems.append(
            "model.type: required (a built-in type such as 'fake' or 'DDPM', "
            "'package.module:Class' or 'path/to/file.py:Class')"
        )
        model_type = "fake"
    model_type, type_problem = _resolve_model_file(model_type, source)
    if type_problem:
        problems.append(type_problem)
    model_config = model.pop("config", None)
    options: dict[str, Any] = {}
    if model_config is not None:
        if not isinstance(model_config, str):
            problems.append("model.config: expected a path string")
            model_config = None
        elif read_model_file:
            path = root / model_config
            try:
                options.update(tomllib.loads(path.read_text(encoding="utf-8")))
            except FileNotFoundError:
                problems.append(f"model.config: file not found: {path}")
            except tomllib.TOMLDecodeError as exc:
                problems.append(f"model.config: {path}: invalid TOML: {exc}")
    options.update(model)
    if takes_input_limits(model_type):  # max_images, max_pixels (not a generator's own)
        problems.extend(input_limit_problems(options))

    if problems:
        raise ConfigErrors(source, problems)
    known = {f.name for f in fields(ServerConfig)}
    return ServerConfig(
        **{k: v for k, v in server.items() if k in known},
        model_type=model_type,
        model_config=model_config,
        model_options=MappingProxyType(options),
        source=source,
        root=str(root),
    )


def load_server_config(
    path: str | Path,
    *,
    root: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Read and validate the server TOML at ``path``; see :func:`build_server_config`."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigErrors(str(path), ["file not found"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors(str(path), [f"invalid TOML: {exc}"]) from None
    return build_server_config(document, source=str(path), root=root or find_root(path), env=env)
