"""The model port's checks before a route runs: bearer auth, the POST pre-checks
(401 → 415 → 413), the answer to a head that announces a body (404 → 405 → 401 →
415 → 413, then 429 for a POST, before any of it is read), readiness, per-client
rate limits, envelope parsing plus model validation, routing errors, and
per-request metrics (edge, reactor thread only)."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from twisted.web.http import Headers
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.config.server import ServerConfig
from mortred_twisted.http import errors as E
from mortred_twisted.http.answers import EarlyResponse
from mortred_twisted.http.envelope import (
    new_request_id,
    parse_envelope,
    parse_form_envelope,
    render_error,
)
from mortred_twisted.http.errors import ApiError, to_api_error
from mortred_twisted.http.multipart import is_multipart
from mortred_twisted.http.protocols.submission import RequestHead
from mortred_twisted.http.responder import Responder, is_json_content_type, json_bytes
from mortred_twisted.http11.auth import (
    CLIENT_IP_HEADER,
    WWW_AUTHENTICATE,
    bearer_token,
    host_refusal,
    token_matches,
)
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.runtime.model_runtime import ModelRuntime

#: ``ServerRequest.decided`` of a POST whose rate-limit token was taken from its head
#: (the route then takes none).
RATE_TAKEN = "rate-limit-taken"


class RequestChecks:
    """The checks of one model server. ``klein``: its Klein app (the route table,
    whose werkzeug map decides 404/405 from a head)."""

    def __init__(
        self,
        runtime: ModelRuntime,
        responder: Responder,
        klein: Any,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.runtime = runtime
        self.config: ServerConfig = runtime.config
        self.responder = responder
        self.klein = klein
        self.token: str | None = self.config.auth_token or None
        self._rate_limiter = rate_limiter
        #: ``(method, path) -> bool``: routes known to exist without a werkzeug match
        #: (the hot routes, set by the model server once its handlers are registered)
        self.known_route: Callable[[bytes, bytes], bool] = lambda _method, _path: False

    def instrumented(self, label: str, handler: Callable) -> Callable:
        """Tag the request with its route and start time; :meth:`record_request`
        (called by the site when the response is finished) counts it."""

        def endpoint(request: IRequest, **kwargs: Any) -> Any:
            request.mortred_route = label  # type: ignore[attr-defined]
            request.mortred_started = time.perf_counter()  # type: ignore[attr-defined]
            return handler(request, **kwargs)

        # Klein names werkzeug endpoints after the function: keep them distinct.
        endpoint.__name__ = endpoint.__qualname__ = f"mortred_{label}"
        return endpoint

    def record_request(self, request: IRequest) -> None:
        """Count a finished request (the site's per-request hook; reactor thread)."""
        label = getattr(request, "mortred_route", None)
        if label is not None:
            elapsed_ms = (time.perf_counter() - request.mortred_started) * 1000.0
            self.runtime.metrics.http.record(label, request.code, elapsed_ms)

    def auth_error(self, headers: Headers) -> ApiError | None:
        if self.token is None:
            return None
        given = bearer_token(headers.getRawHeaders(b"authorization", [None])[0])
        if token_matches(given, self.token):
            return None
        message = "missing bearer token" if given is None else "invalid bearer token"
        return ApiError(E.UNAUTHORIZED, message, {"WWW-Authenticate": WWW_AUTHENTICATE})

    def post_prechecks(self, request: IRequest, head: RequestHead | None = None) -> ApiError | None:
        """401 → 415 → 413, from headers (the body limit was enforced while reading);
        ``head``: the request's :class:`RequestHead` when the caller holds it."""
        err = self.auth_error(request.requestHeaders)
        if err is not None:
            return err
        if head is None:
            head = self.responder.head(request)
        if not self.body_type_accepted(head.content_type):
            return self.unsupported_type()
        content = request.content
        size = content.seek(0, 2)
        content.seek(0)
        if size > self.config.request_size_limit_bytes:
            return self.too_large()
        return None

    def body_type_accepted(self, content_type: bytes | None) -> bool:
        """JSON always; ``multipart/form-data`` for a model declared with the SDK (the
        built-in families take the JSON envelope only)."""
        if is_json_content_type(content_type):
            return True
        return (
            self.takes_forms
            and content_type is not None
            and is_multipart(content_type.decode("latin-1"))
        )

    @property
    def takes_forms(self) -> bool:
        from mortred_twisted.models.registry import MODEL_FACTORIES, SDK_TYPES
        from mortred_twisted.models.transformers_tasks.contract import serves_sdk_contract

        model_type = self.config.model_type
        if model_type not in MODEL_FACTORIES:
            return True
        # contract = "mortred-v1" serves the seed's JSON-only contract (issue 28.3)
        return model_type in SDK_TYPES and serves_sdk_contract(self.config.model_options)

    def unsupported_type(self) -> ApiError:
        if self.takes_forms:
            return ApiError(
                E.UNSUPPORTED_MEDIA_TYPE,
                "content type must be application/json or multipart/form-data",
            )
        return ApiError(E.UNSUPPORTED_MEDIA_TYPE, "content type must be application/json")

    def host_refused(self, host: bytes | None) -> ApiError | None:
        """421 for a ``Host`` that is not a loopback name on a port without a token
        (the DNS-rebinding defence, :func:`~mortred_twisted.http11.auth.host_refusal`);
        None with a token."""
        if self.token is not None:
            return None
        refusal = host_refusal(host, token_configured=False)
        return None if refusal is None else ApiError(E.MISDIRECTED, refusal)

    def too_large(self) -> ApiError:
        return ApiError(
            E.ENTITY_TOO_LARGE,
            f"request body exceeds request_size_limit ({self.config.request_size_limit} MB)",
        )

    def early_reject(
        self, method: bytes, path: bytes, headers: Headers, length: int
    ) -> EarlyResponse:
        """The response for a body over the limit, honouring 405 → 401 → 415 → 413."""
        answer = self.refuse_from_head(method, path, headers, length)
        if answer is None:  # within the limit after all (a chunked body that grew)
            answer = self.early_response(path, headers, self.too_large())
        return answer

    def refuse_from_head(
        self, method: bytes, path: bytes, headers: Headers, length: int
    ) -> EarlyResponse | None:
        """The answer to a request with a body, decided from its head alone (before
        a body byte is read), or None to read it: 421 (Host, on a port without a
        token) → 404 (no route) → 405 → 401 → 413 (a route that takes no body: all
        but the POST routes) → 415 (POST routes: the body must be JSON) → 413
        (``length`` over the limit; -1: chunked, checked while it is read)."""
        refused = self.host_refused(headers.getRawHeaders(b"host", [None])[-1])
        if refused is not None:
            return self.early_response(path, headers, refused)
        route_path = path.split(b"?", 1)[0]
        err: ApiError | None = None
        if not self.known_route(method, route_path):
            err = self._route_error(method, route_path)
        if err is None:
            err = self.auth_error(headers)
        if err is None and method.upper() != b"POST":  # only POST routes take a body
            err = ApiError(E.ENTITY_TOO_LARGE, "this route takes no request body")
        content_type = headers.getRawHeaders(b"content-type", [None])[0]
        takes_any = route_path.startswith(b"/v2/")  # OIP: JSON or binary, typed or not
        if (
            err is None
            and method.upper() == b"POST"
            and not takes_any
            and not self.body_type_accepted(content_type)
        ):
            err = self.unsupported_type()
        if err is None and length > self.config.request_size_limit_bytes:
            err = self.too_large()
        if err is None:
            return None
        return self.early_response(path, headers, err)

    def _route_error(self, method: bytes, route_path: bytes) -> ApiError | None:
        """404 or 405 from the Klein table's werkzeug map, None when a rule matches."""
        try:
            path_info = unquote_to_bytes(route_path).decode("utf-8")
        except UnicodeDecodeError:
            path_info = ""
        mapper = self.klein.url_map.bind(
            "localhost", path_info=path_info, default_method=method.decode("latin-1")
        )
        try:
            mapper.match()
        except MethodNotAllowed as exc:
            allow = ", ".join(sorted(exc.valid_methods or []))
            return ApiError(E.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": allow})
        except NotFound:
            return ApiError(E.NOT_FOUND, f"not found: {route_path.decode('latin-1')}")
        return None

    def early_response(self, path: bytes, headers: Headers, err: ApiError) -> EarlyResponse:
        """``err`` as the route would render it (job routes: ``{"error", "code"}``;
        the sync route: an envelope), with ``X-Request-ID``."""
        route_path = path.split(b"?", 1)[0].decode("latin-1")
        is_job_route = route_path == "/jobs" or route_path.startswith("/jobs/")
        rid_raw = headers.getRawHeaders(b"x-request-id", [b""])[0]
        req_id = rid_raw.decode("utf-8", "replace")[:256] or new_request_id()
        if route_path.startswith(("/v1/predictions", "/v1/models/")):  # Replicate's shape
            from mortred_twisted.http.protocols.replicate_routes import replicate_error

            body = json_bytes(replicate_error(err).body())
        elif route_path.startswith("/v1/"):  # the OpenAI door: its error object
            from mortred_twisted.http.protocols.openai_routes import openai_error

            body = json_bytes(openai_error(err).body())
        elif is_job_route or err.code == E.NOT_FOUND:
            body = json_bytes({"error": err.message, "code": err.code})
        else:
            body = render_error(req_id, err.code, err.message)
        hdrs = {**err.headers, "X-Request-ID": req_id}
        return EarlyResponse(err.http_status, body, hdrs)

    def not_ready(self) -> ApiError:
        rt = self.runtime
        detail = f": {rt.load_error}" if rt.load_error else ""
        return ApiError(E.NOT_READY, f"model not ready ({rt.readiness.value}){detail}")

    def client_ip(self, request: IRequest) -> str:
        """The client's address for per-client limits: the peer's, unless this server
        has a token and the request names the client in ``X-Mortred-Client-IP`` (set
        by the gateway, which authenticates with the internal token; a request that
        reached this point on such a server carried the token). Without a token the
        header is ignored, so a client cannot pick its own bucket."""
        if self.token is not None:
            named = self.responder.header(request, CLIENT_IP_HEADER)
            if named:
                try:
                    return str(ipaddress.ip_address(named.decode("ascii").strip()))
                except (UnicodeDecodeError, ValueError):
                    pass
        return str(getattr(request.getClientAddress(), "host", "unknown"))

    def rate_limited(self, request: IRequest) -> ApiError | None:
        """429 + Retry-After when the client is over ``rate_limit_qps`` (one token
        taken), None to go on. A POST with a body took its token from the head
        (``decided`` is :data:`RATE_TAKEN`, see :meth:`ModelPortFactory.judge_head
        <mortred_twisted.http.model_port.ModelPortFactory.judge_head>`): none again."""
        if self._rate_limiter is None or getattr(request, "decided", None) is RATE_TAKEN:
            return None
        retry = self._rate_limiter.acquire(self.client_ip(request), self.config.rate_limit_qps)
        if retry is None:
            return None
        return ApiError(
            E.TOO_MANY_REQUESTS,
            f"rate limit exceeded ({self.config.rate_limit_qps} requests/s per client)",
            {"Retry-After": str(retry)},
        )

    def parse_and_validate(self, request: IRequest, job_fields: dict[str, Any] | None = None):
        """400 → 503 → 422: parse the envelope and let the model validate params
        (job-only envelope fields go into ``job_fields`` when given)."""
        parsed = self.parse(request, job_fields)
        return self.validate(parsed), parsed.req_id

    def parse(
        self,
        request: IRequest,
        job_fields: dict[str, Any] | None = None,
        head: RequestHead | None = None,
    ) -> InferenceRequest:
        """400: the envelope (JSON, or a multipart form) as an :class:`InferenceRequest`
        whose params are not validated yet; job-only fields go into ``job_fields``.
        From here every answer names the envelope's ``req_id``."""
        if head is None:
            head = self.responder.head(request)
        req_id = self.responder.request_id(request, head)
        content_type = head.content_type
        if content_type is not None and not is_json_content_type(content_type):
            parsed = parse_form_envelope(
                request.content.read(), content_type.decode("latin-1"), req_id, job_fields
            )
        else:
            rt = self.runtime
            validator = rt.validator if rt.ready else None
            parsed = parse_envelope(
                request.content.read(),
                req_id,
                job_fields,
                images_required=not getattr(validator, "images_optional", validator is None),
            )
        request.mortred_request_id = parsed.req_id  # type: ignore[attr-defined]
        return parsed

    def validate(self, parsed: InferenceRequest) -> InferenceRequest:
        """503 (not ready) → 422: the model's validation of ``parsed``."""
        rt = self.runtime
        if not rt.ready or rt.validator is None:
            raise self.not_ready()
        try:
            return rt.validator.validate(parsed)
        except Exception as exc:
            raise to_api_error(exc) from exc

    # -- errors from routing ----------------------------------------------------------

    def method_not_allowed(self, request: IRequest, failure: Any) -> bytes:
        allow = ", ".join(sorted(failure.value.valid_methods or []))
        err = ApiError(E.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": allow})
        if request.path.startswith(b"/jobs"):
            return self.responder.job_error(request, err)
        return self.responder.envelope_error(request, err, self.responder.request_id(request))

    def not_found(self, request: IRequest, failure: Any) -> bytes:
        path = request.path.decode("latin-1")
        err = ApiError(E.NOT_FOUND, f"not found: {path}")
        return self.responder.job_error(request, err)
