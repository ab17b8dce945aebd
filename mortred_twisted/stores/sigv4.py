"""AWS Signature Version 4 for S3 requests (pure: ``hashlib``/``hmac`` only).

:func:`sign` returns the headers of one request signed for service ``s3``: the
canonical request (method, URI-encoded path, sorted query, lower-cased headers, the
payload's sha256), the string to sign over the day's scope, and the key derived
from the secret by HMAC-SHA256 through date, region, service and ``aws4_request``.
It matches the examples of AWS's S3 documentation (``tests/stores/
test_result_files_s3.py``). Used by ``result_files_s3.py``; thread-safe.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import quote

#: the characters S3's canonical URI and query leave unencoded (besides alphanumerics)
UNRESERVED = "-_.~"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def sign(
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: dict[str, str],
    payload_sha256: str,
    *,
    region: str,
    access_key: str,
    secret_key: str,
    session_token: str = "",
    now: datetime.datetime,
) -> dict[str, str]:
    """``headers`` plus ``Host``, ``x-amz-date``, ``x-amz-content-sha256`` (and the
    session token) and the ``Authorization`` of AWS SigV4 for service ``s3``.
    ``path`` is the raw (unencoded) path; every header given is signed."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {k.lower(): str(v) for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = amz_date
    signed["x-amz-content-sha256"] = payload_sha256
    if session_token:
        signed["x-amz-security-token"] = session_token
    names = sorted(signed)
    canonical_headers = "".join(f"{n}:{' '.join(signed[n].split())}\n" for n in names)
    signed_names = ";".join(names)
    canonical_query = "&".join(
        f"{quote(k, safe=UNRESERVED)}={quote(v, safe=UNRESERVED)}" for k, v in sorted(query.items())
    )
    canonical_request = "\n".join(
        [method, quote(path, safe="/" + UNRESERVED), canonical_query, canonical_headers,
         signed_names, payload_sha256]
    )  # fmt: skip
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope,
         hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()]
    )  # fmt: skip
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), day)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    out = {k: v for k, v in signed.items()}
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    return out
