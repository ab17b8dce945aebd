"""An ``s3://bucket/prefix`` result-file location and its credentials, checked as
config (pure: no IO; the store itself is ``stores/result_files_s3.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_BUCKET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!-_.*'()/")
#: the environment variables the credentials come from
ACCESS_KEY_ENV, SECRET_KEY_ENV, TOKEN_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


@dataclass(frozen=True)
class S3Location:
    """Where result files go: ``bucket`` and a key ``prefix`` ("" or ending in /)."""

    bucket: str
    prefix: str


def is_s3_url(value: str) -> bool:
    return value.startswith("s3://")


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket[/prefix]`` as an :class:`S3Location`; ``ValueError`` naming
    what is wrong (a bucket name S3 refuses, a prefix with characters outside S3's
    safe set, a query or fragment)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"expected s3://<bucket>/<prefix>, got {url!r}")
    bucket = parts.netloc
    if not 3 <= len(bucket) <= 63 or not set(bucket) <= _BUCKET_CHARS or bucket[0] in ".-":
        raise ValueError(f"{bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
    prefix = parts.path.strip("/")
    if not set(prefix) <= _PREFIX_CHARS or "//" in prefix or ".." in prefix.split("/"):
        raise ValueError(f"prefix {prefix!r}: only letters, digits and !-_.*'()/ are safe")
    return S3Location(bucket, f"{prefix}/" if prefix else "")


def credentials_problem(env: Mapping[str, str]) -> str | None:
    """What is missing for S3 in ``env`` (None: both keys are set)."""
    missing = [k for k in (ACCESS_KEY_ENV, SECRET_KEY_ENV) if not env.get(k)]
    return f"set {' and '.join(missing)} in the environment" if missing else None
