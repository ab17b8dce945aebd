"""Gateway API keys from ``conf/api_keys.toml`` (pure).

File format::

    [[keys]]
    name = "ci"                # label for logs/metrics; never the key itself
    sha256 = "<64 hex digits>" # sha256 of the UTF-8 key; the plain key is not stored
    scope = "inference"        # "inference" (/v1/models/...) or "all" (also /metrics)
    enabled = true
    rate_limit_qps = 5         # 0 = unlimited
    max_pending = 20           # its pending + running jobs per model (0 = the model's
                               #   async_max_queue_per_caller)
    weight = 1                 # its share of starts while others wait (1..1000)
    max_priority = "normal"    # highest job priority it may ask for (low|normal|high)

A missing file is an empty key ring. Every problem is reported at once
(:class:`ConfigErrors`); the caller keeps the previous ring when a reload fails.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.config.errors import ConfigErrors, did_you_mean

SCOPES = ("inference", "all")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEY_FIELDS = (
    "name", "sha256", "scope", "enabled", "rate_limit_qps", "max_pending", "weight",
    "max_priority",
)  # fmt: skip
PRIORITIES = ("low", "normal", "high")
MAX_WEIGHT = 1000


@dataclass(frozen=True)
class ApiKey:
    """One configured key (its hash only)."""

    name: str
    sha256: str
    scope: str = "inference"
    enabled: bool = True
    rate_limit_qps: float = 0.0
    max_pending: int = 0
    weight: int = 1
    max_priority: str = "normal"


def hash_key(key: str) -> str:
    """The hex sha256 stored in the file for the plain ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """An immutable set of keys; :meth:`lookup` is constant-time per stored key."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self.keys: tuple[ApiKey, ...] = tuple(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, presented: str | None) -> ApiKey | None:
        """The key whose hash matches ``presented`` (enabled or not), else None.

        Every stored hash is compared, match or not, so timing does not reveal which
        entry matched.
        """
        if not presented:
            return None
        digest = hash_key(presented).encode("ascii")
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.sha256.encode("ascii")):
                found = key
        return found


def parse_keys(document: dict[str, Any], source: str = "<memory>") -> KeyRing:
    """Validate a parsed key file; raises :class:`ConfigErrors`."""
    problems: list[str] = []
    for table in document:
        if table != "keys":
            problems.append(f"unknown table [{table}]{did_you_mean(table, ['keys'])}")
    raw = document.get("keys", [])
    if not isinstance(raw, list):
        raise ConfigErrors(source, ["keys: expected an array of [[keys]] tables"])
    keys: list[ApiKey] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"keys[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: expected a table")
            continue
        for k in item:
            if k not in _KEY_FIELDS:
                problems.append(f"{where}.{k}: unknown key{did_you_mean(k, _KEY_FIELDS)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: required string")
            name = f"key{i}"
        elif name in names:
            problems.append(f"{where}.name: duplicate name {name!r}")
        names.add(name)
        digest = item.get("sha256")
        if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
            problems.append(f"{where}.sha256: required, 64 hex digits")
            digest = "0" * 64
        scope = item.get("scope", "inference")
        if scope not in SCOPES:
            problems.append(f"{where}.scope: must be one of {', '.join(SCOPES)}")
        enabled = item.get("enabled", True)
        if not isinstance(enabled, bool):
            problems.append(f"{where}.enabled: expected a boolean")
        qps = item.get("rate_limit_qps", 0)
        if isinstance(qps, bool) or not isinstance(qps, (int, float)) or qps < 0:
            problems.append(f"{where}.rate_limit_qps: expected a number >= 0")
            qps = 0
        max_pending = item.get("max_pending", 0)
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 0:
            problems.append(f"{where}.max_pending: expected an integer >= 0")
            max_pending = 0
        weight = item.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            problems.append(f"{where}.weight: expected an integer from 1 to {MAX_WEIGHT}")
            weight = 1
        top = item.get("max_priority", "normal")
        if top not in PRIORITIES:
            problems.append(f"{where}.max_priority: must be one of {', '.join(PRIORITIES)}")
            top = "normal"
        keys.append(
            ApiKey(name, digest.lower(), scope, bool(enabled), float(qps), max_pending, weight, top)
        )
    if problems:
        raise ConfigErrors(source, problems)
    return KeyRing(keys)


def load_keys(path: str | Path) -> KeyRing:
    """Read ``path``; a missing file is an empty ring. Raises :class:`ConfigErrors`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return KeyRing()
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors(str(path), [f"invalid TOML: {exc}"]) from None
    return parse_keys(document, str(path))
