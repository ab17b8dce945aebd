"""What the protocol doors (OpenAI images, OIP v2, Replicate) share: the model
port's job routes they are composed of, and reading a JSON body.

A door is a thin adapter: it turns its protocol's request into the native
:class:`~mortred_twisted.http.protocols.submission.Submission` and answers in its
protocol's shape. Everything else (prechecks, validation, admission, results) is the
server's :class:`~mortred_twisted.http.job_routes.JobRoutes`. Reactor thread only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted.http.responder import is_json_content_type


class Door:
    """A protocol door over one model server's ``JobRoutes`` (``jobs``): its runtime,
    config, responder and request checks, read once at construction."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs
        self.runtime = jobs.runtime
        self.config = jobs.config
        self.responder = jobs.responder
        self.checks = jobs.checks


def read_json_body(
    request: IRequest, content_type: bytes | None, fail: Callable[[int, str], Exception]
) -> Any:
    """The request's JSON document; ``fail(status, message)`` makes the door's own
    error for a body that is not JSON (400) or not declared as JSON (415)."""
    if not is_json_content_type(content_type):
        raise fail(415, "content type must be application/json")
    try:
        return json.loads(request.content.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise fail(400, f"the body is not JSON: {exc}") from None
