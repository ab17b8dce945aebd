"""OpenAI's images API as a front door (pure: no reactor, no HTTP objects).

``POST /v1/images/generations`` maps onto a text-to-image model's declared inputs:
``prompt`` → ``prompt``, ``n`` → ``num_images``, ``size`` (``WxH``) → ``width`` and
``height``; ``response_format`` picks ``b64_json`` (the files inline, the default:
the answer is self-contained) or ``url`` (the job's result files); ``user`` is
accepted and not used. Any other field is passed as the model's own input (``seed``,
``guidance_scale``, ``sample_steps``, ``negative_prompt``) and validated by the
model's declaration. OpenAI fields this server cannot honour (``quality``, ``style``,
``stream``, …) are a 400 naming them, never silently dropped. Errors are OpenAI's
error object ``{"error": {"message", "type", "param", "code"}}`` (docs/protocols.md).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: ``size`` as OpenAI writes it: ``<width>x<height>``, at most 5 digits each
SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")
MAX_PROMPT_CHARS = 32_000
MAX_USER_CHARS = 256
RESPONSE_FORMATS = ("b64_json", "url")
#: OpenAI fields with no meaning here: refused, named
UNSUPPORTED = (
    "quality", "style", "background", "moderation", "output_compression", "output_format",
    "partial_images", "stream", "input_fidelity",
)  # fmt: skip
#: the model inputs the door fills from OpenAI's own fields (not given directly)
MAPPED = {"num_images": "n", "width": "size", "height": "size", "prompt": "prompt"}


class OpenAIError(Exception):
    """An answer in OpenAI's error shape: HTTP ``status``, ``type``, ``param``, ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message, "type": self.kind, "param": self.param,
                "code": self.code,
            }
        }  # fmt: skip


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error object for an answer made without a model (the gateway's own
    refusals on the door's routes: 401, 403, 404, 405, 413, 415, 429, 502…)."""
    kind = "invalid_request_error"
    code = None
    if status == 401:
        code = "invalid_api_key"
    elif status == 429:
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    elif status >= 500:
        kind = "server_error"
    return OpenAIError(status, message, kind=kind, code=code).body()


def bad(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


@dataclass(slots=True)
class ImagesAsk:
    """A parsed ``images/generations`` body: the model's inputs by name and how the
    pictures come back (``response_format``)."""

    model: str
    params: dict[str, Any]
    response_format: str


def parse_generations(doc: Any, model_id: str) -> ImagesAsk:
    """``doc`` (the JSON body) as an :class:`ImagesAsk` for the model ``model_id``;
    raises :class:`OpenAIError` (400 naming the ``param``, 404 for another model)."""
    if not isinstance(doc, dict):
        raise bad("the body must be a JSON object")
    model = doc.get("model", model_id)
    if not isinstance(model, str):
        raise bad("model: must be a string", "model")
    if model != model_id:
        raise OpenAIError(
            404, f"The model '{model[:200]}' does not exist (this port serves '{model_id}')",
            param="model", code="model_not_found",
        )  # fmt: skip
    prompt = doc.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("prompt: a non-empty string is required", "prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise bad(f"prompt: at most {MAX_PROMPT_CHARS} characters", "prompt")
    params: dict[str, Any] = {"prompt": prompt}
    n = doc.get("n", 1)
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise bad("n: must be an integer of at least 1", "n")
        params["num_images"] = n
    size = doc.get("size")
    if size is not None and size != "auto":
        match = SIZE.fullmatch(size) if isinstance(size, str) else None
        if match is None:
            raise bad("size: must be 'WIDTHxHEIGHT' in pixels, e.g. '32x32'", "size")
        params["width"], params["height"] = int(match[1]), int(match[2])
    response_format = doc.get("response_format") or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise bad("response_format: must be 'b64_json' or 'url'", "response_format")
    user = doc.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise bad(f"user: must be a string of at most {MAX_USER_CHARS} characters", "user")
    for name, value in doc.items():
        if name in ("model", "prompt", "n", "size", "response_format", "user"):
            continue
        if name in UNSUPPORTED:
            raise bad(f"{name}: not supported by this server", name, "unsupported_parameter")
        if name in MAPPED:
            raise bad(f"{name}: give it as '{MAPPED[name]}'", name)
        params[name] = value  # the model's own input: its declaration validates it
    return ImagesAsk(model, params, response_format)


def param_of(field: str) -> str:
    """The OpenAI parameter a model's validation error names (``params.num_images``
    → ``n``, ``params.width`` → ``size``, ``params.seed`` → ``seed``)."""
    name = field.removeprefix("params.").split(".", 1)[0].split("[", 1)[0]
    return MAPPED.get(name, name) if name != "prompt" else "prompt"


def images_answer(data: Mapping[str, Any], response_format: str, base_url: str) -> dict:
    """The ``{"created", "data": [...]}`` answer of a done job's result ``data`` (its
    ``images`` are inline ``base64`` or result-file descriptions with a ``url``
    relative to the port, made absolute with ``base_url``; on a port that keeps
    files inline a ``url`` is a ``data:`` URL)."""
    out: list[dict[str, str]] = []
    for image in data.get("images") or ():
        inline, url = image.get("base64"), image.get("url")
        if response_format == "b64_json" and inline is not None:
            out.append({"b64_json": inline})
        elif url is not None:
            out.append({"url": base_url + url})
        else:  # a port that keeps files inline (output_files = "inline"): a data URL
            kind = image.get("content_type") or "application/octet-stream"
            out.append({"url": f"data:{kind};base64,{inline}"})
    return {"created": int(time.time()), "data": out}


def models_answer(model_ids: list[str], created: int) -> dict:
    """``GET /v1/models`` in OpenAI's shape."""
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": created, "owned_by": "mortred"}
            for m in model_ids
        ],
    }


#: a Host header fit to start an absolute URL with
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


def public_base(host: bytes | None) -> str:
    """``http://<host>`` for a well-formed ``Host`` header, else "" (relative URLs):
    a Host that could not start a URL is never echoed."""
    if not host:
        return ""
    text = host.decode("latin-1")
    return "http://" + text if _HOST.fullmatch(text) else ""


def public_image_urls(body: bytes, public_prefix: str, base: str) -> bytes:
    """An images answer whose ``data[].url`` point at a model port's ``/jobs/…``
    files, pointed at ``base + public_prefix + "<job>/files/<name>"`` instead (the
    gateway's public file route; ``public_prefix`` ends with ``/jobs/``). Any other
    body, or URL, is returned unchanged."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body
    items = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return body
    changed = False
    for item in items:
        url = item.get("url") if isinstance(item, dict) else None
        if not isinstance(url, str) or url.startswith("data:"):
            continue
        path = urlsplit(url).path
        if path.startswith("/jobs/"):
            item["url"] = base + public_prefix + path[len("/jobs/") :]
            changed = True
    return json.dumps(doc, separators=(",", ":")).encode() if changed else body


#: the multipart fields of ``images/edits`` the door maps itself
_EDIT_FIELDS = ("model", "prompt", "n", "size", "response_format", "user")


def parse_edits(fields: Mapping[str, list[str]], files: Mapping[str, list[Any]],
                model_id: str) -> tuple[ImagesAsk, bool]:  # fmt: skip
    """A multipart ``images/edits`` (its text ``fields`` and file parts ``files``,
    :class:`~mortred_twisted.http.multipart.FormSubmit`) as an :class:`ImagesAsk`
    whose ``image`` and ``mask`` are the uploads; the bool says the params are form
    text (the declaration converts them). Raises :class:`OpenAIError` naming the param."""
    doc: dict[str, Any] = {}
    for name in _EDIT_FIELDS:
        values = fields.get(name)
        if values is None:
            continue
        if len(values) != 1:
            raise bad(f"{name}: given {len(values)} times", name)
        doc[name] = values[0]
    n = doc.get("n")
    if n is not None:
        if not n.isdigit() or len(n) > 6:
            raise bad("n: must be an integer of at least 1", "n")
        doc["n"] = int(n)
    ask = parse_generations(doc, model_id)
    images = list(files.get("image", ())) + list(files.get("image[]", ()))
    if len(images) != 1:
        raise bad(f"image: exactly one picture (got {len(images)})", "image")
    ask.params["image"] = images[0]
    masks = files.get("mask", [])
    if len(masks) > 1:
        raise bad("mask: at most one", "mask")
    if masks:
        ask.params["mask"] = masks[0]
    for name, values in fields.items():
        if name in _EDIT_FIELDS:
            continue
        if name in UNSUPPORTED:
            raise bad(f"{name}: not supported by this server", name, "unsupported_parameter")
        if name in MAPPED or name in ("image", "mask"):
            raise bad(f"{name}: give it as '{MAPPED.get(name, name)}'", name)
        if len(values) != 1:
            raise bad(f"{name}: given {len(values)} times", name)
        ask.params[name] = values[0]  # the model's own input, as form text
    for name in files:
        if name not in ("image", "image[]", "mask"):
            raise bad(f"{name}: not a file this API takes (image, mask)", name)
    return ask, True
