"""The model port's hot routes, matched by hand (pure: no reactor, no twisted.web).

Werkzeug's matching costs a large share of a tiny request's CPU, and the job API's
hot routes (submit, poll, wait, result, sync infer) are few and fixed, so
:class:`HotRoutes` matches them on ``request.path`` and ``request.method`` and names
the *same* handlers the Klein app registers for them. Every other request goes
through the Klein app's werkzeug map. The route table is declared once, in
:class:`~mortred_twisted.http.model_server.ModelServerApp`;
``tests/http/test_hot_routes.py`` enumerates that table and proves this matcher picks
the handler werkzeug would for every hot rule, and nothing for any other rule.

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[..., Any]

#: The Klein route labels the matcher serves (``ModelServerApp``'s ``add`` labels).
HOT_LABELS = (
    "infer", "jobs_submit", "jobs_status", "jobs_wait", "jobs_result", "openai_images",
    "replicate_create",
)  # fmt: skip


class HotRoutes:
    """``match(request)``: the hot route's handler and arguments, or None."""

    def __init__(self, infer_path: bytes, handlers: dict[str, Handler]) -> None:
        self._infer_path = infer_path.rstrip(b"/") or b"/"
        self._infer = handlers["infer"]
        self._submit = handlers["jobs_submit"]
        self._status = handlers["jobs_status"]
        self._wait = handlers["jobs_wait"]
        self._result = handlers["jobs_result"]
        self._openai_images = handlers.get("openai_images")  # the front doors' submits
        self._replicate_create = handlers.get("replicate_create")

    def serves(self, method: bytes, path: bytes) -> bool:
        """Whether ``method path`` (no query) is a hot route: a head that names one
        needs no werkzeug match to know its route exists."""
        return self.match_path(method, path) is not None

    def match(self, request: Any) -> tuple[Handler, dict[str, str]] | None:
        """Reads only ``request.path`` and ``request.method``."""
        return self.match_path(request.method, request.path)

    def match_path(self, method: bytes, path: bytes) -> tuple[Handler, dict[str, str]] | None:
        """The handler and arguments of ``method path`` (no query), or None."""
        path = path.rstrip(b"/") or b"/"
        if method == b"POST":
            if path == b"/jobs":
                return self._submit, {}
            if path == self._infer_path:
                return self._infer, {}
            if path == b"/v1/images/generations" and self._openai_images is not None:
                return self._openai_images, {}
            if path == b"/v1/predictions" and self._replicate_create is not None:
                return self._replicate_create, {}
            return None
        if method != b"GET" or not path.startswith(b"/jobs/"):
            return None
        parts = path[6:].split(b"/")
        if not parts[0] or len(parts) > 2:
            return None
        job_id = parts[0].decode("utf-8", "replace")
        if len(parts) == 1:
            return self._status, {"job_id": job_id}
        if parts[1] == b"wait":
            return self._wait, {"job_id": job_id}
        if parts[1] == b"result":
            return self._result, {"job_id": job_id}
        return None
