"""The Open Inference Protocol v2 (KServe / Triton HTTP) as a front door (pure: no
reactor, no HTTP objects).

A model declared with the SDK is described as tensors: ``str``, ``Image`` and
``File`` inputs are ``BYTES``, ``int`` ``INT64``, ``float`` ``FP32``/``FP64``,
``bool`` ``BOOL``; a scalar is shape ``[1]``, a list ``[-1]`` (at most its
``max_items``). An infer request comes as JSON tensors or with the binary data
extension (``Inference-Header-Content-Length``: the JSON head, then each
``binary_data_size`` bytes in input order; ``BYTES`` elements are 4-byte
little-endian length-prefixed). Everything a client sends is checked before the
model sees it: names, datatypes, shapes against element counts, binary sizes against
the body (a length that lies is a 400 naming the input), and then the model's own
declaration. Outputs map back the same way, one tensor per field of the model's
output (files as their bytes: raw in binary mode, base64 in JSON).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: datatype -> (struct code, item size) of the fixed-size types this door reads
FIXED = {
    "BOOL": ("?", 1), "INT8": ("b", 1), "INT16": ("h", 2), "INT32": ("i", 4),
    "INT64": ("q", 8), "UINT8": ("B", 1), "UINT16": ("H", 2), "UINT32": ("I", 4),
    "UINT64": ("Q", 8), "FP32": ("f", 4), "FP64": ("d", 8),
}  # fmt: skip
#: input kind -> the datatypes it takes (the first one is declared in metadata)
TAKES = {
    "str": ("BYTES",),
    "image": ("BYTES",),
    "file": ("BYTES",),
    "int": ("INT64", "INT32", "INT16", "INT8", "UINT8", "UINT16", "UINT32", "UINT64"),
    "float": ("FP32", "FP64"),
    "bool": ("BOOL",),
}
MAX_HEADER = 1 << 20  # bytes of the JSON head in binary mode
MAX_TENSORS = 64
MAX_ELEMENTS = 1 << 16


class OipError(Exception):
    """A 400 (or ``status``) in the protocol's shape ``{"error": "..."}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def datatype_of(kind: str) -> str:
    return TAKES.get(kind, ("BYTES",))[0]


def tensor_meta(name: str, kind: str, is_list: bool) -> dict[str, Any]:
    return {"name": name, "datatype": datatype_of(kind), "shape": [-1] if is_list else [1]}


def model_metadata(model_id: str, declaration: Any) -> dict[str, Any]:
    """``GET /v2/models/{m}``: each declared input and output as a tensor."""
    inputs = [tensor_meta(i.name, i.kind, i.is_list) for i in declaration.inputs]
    return {
        "name": model_id, "versions": ["1"], "platform": "mortred",
        "inputs": inputs, "outputs": output_metas(declaration.output),
    }  # fmt: skip


def output_metas(output: Any) -> list[dict[str, Any]]:
    if output.kind == "object" and not output.is_list:
        return [tensor_meta(name, out.kind, out.is_list) for name, out in output.fields]
    return [tensor_meta("output", output.kind, output.is_list)]


@dataclass(slots=True)
class InferAsk:
    """A parsed infer request: the model's params by name (binary inputs as
    ``(bytes, None)`` pairs for the door to place), the request id and which
    outputs come back binary."""

    params: dict[str, Any]
    files: dict[str, list[bytes]] = field(default_factory=dict)
    request_id: str | None = None
    outputs: dict[str, bool] | None = None  # name -> binary_data (None: all, JSON)
    binary_default: bool = False


def split_body(body: bytes, header_length: bytes | None) -> tuple[Any, bytes]:
    """The JSON head and the binary rest of an infer body (no header: all JSON)."""
    if header_length is None:
        head, rest = body, b""
    else:
        text = header_length.strip()
        if not text.isdigit() or len(text) > 9:
            raise OipError("Inference-Header-Content-Length: must be a byte count")
        n = int(text)
        if n > len(body) or n > MAX_HEADER:
            raise OipError(
                f"Inference-Header-Content-Length: {n} is past the body ({len(body)} bytes)"
            )
        head, rest = body[:n], body[n:]
    try:
        doc = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OipError(f"the request head is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OipError("the request must be a JSON object")
    return doc, rest


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
            if len(out) > MAX_ELEMENTS:
                raise OipError(f"at most {MAX_ELEMENTS} elements per tensor")
        else:
            stack.pop()
    return out


def _bytes_elements(name: str, raw: bytes) -> list[bytes]:
    out: list[bytes] = []
    at = 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise OipError(f"input {name}: a BYTES element's length is cut off")
        (n,) = struct.unpack_from("<I", raw, at)
        at += 4
        if n > len(raw) - at:
            raise OipError(f"input {name}: a BYTES element says {n} bytes, past the data")
        out.append(raw[at : at + n])
        at += n
        if len(out) > MAX_ELEMENTS:
            raise OipError(f"input {name}: at most {MAX_ELEMENTS} elements")
    return out


def parse_infer(doc: Mapping[str, Any], rest: bytes, declaration: Any) -> InferAsk:
    """The request's inputs checked against the declaration (see the module docstring)."""
    tensors = doc.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise OipError("inputs: a non-empty list of tensors is required")
    if len(tensors) > MAX_TENSORS:
        raise OipError(f"inputs: at most {MAX_TENSORS} tensors")
    ask = InferAsk(params={})
    rid = doc.get("id")
    if rid is not None:
        if not isinstance(rid, str) or len(rid) > 256:
            raise OipError("id: must be a string of at most 256 characters")
        ask.request_id = rid or None
    at = 0
    for tensor in tensors:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise OipError("inputs: each tensor needs a name")
        name = tensor["name"]
        decl = declaration.input(name)
        if decl is None:
            known = ", ".join(i.name for i in declaration.inputs)
            raise OipError(f"input {name[:100]}: not an input of this model ({known})")
        if name in ask.params or name in ask.files:
            raise OipError(f"input {name}: given twice")
        datatype = tensor.get("datatype")
        if datatype not in TAKES.get(decl.kind, ()):
            raise OipError(
                f"input {name}: datatype {str(datatype)[:20]} (takes {', '.join(TAKES[decl.kind])})"
            )
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise OipError(f"input {name}: shape must be a list of non-negative integers")
        count = math.prod(shape) if shape else 1
        if count > MAX_ELEMENTS:
            raise OipError(f"input {name}: at most {MAX_ELEMENTS} elements")
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            raise OipError(f"input {name}: parameters must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise OipError(f"input {name}: binary_data_size must be a byte count")
            if size > len(rest) - at:
                raise OipError(
                    f"input {name}: binary_data_size {size} is past the body's binary data"
                )
            raw = rest[at : at + size]
            at += size
            values = _binary_values(name, datatype, raw)
        else:
            if "data" not in tensor:
                raise OipError(f"input {name}: no data (nor binary_data_size)")
            values = _json_values(name, datatype, decl.kind, _flatten(tensor["data"]))
        if len(values) != count:
            raise OipError(f"input {name}: shape {shape} holds {count}, got {len(values)}")
        if not decl.is_list and count != 1:
            raise OipError(f"input {name}: takes one element (shape [1]), got {count}")
        if decl.kind in ("image", "file"):
            ask.files[name] = values
        elif decl.kind == "str":
            try:
                texts = [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
            except UnicodeDecodeError:
                raise OipError(f"input {name}: not UTF-8 text") from None
            ask.params[name] = texts if decl.is_list else texts[0]
        else:
            ask.params[name] = values if decl.is_list else values[0]
    if at != len(rest):
        raise OipError(f"{len(rest) - at} bytes of binary data that no input claims")
    _outputs(doc, ask)
    return ask


def _binary_values(name: str, datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        return _bytes_elements(name, raw)
    code, size = FIXED[datatype]
    if len(raw) % size:
        raise OipError(f"input {name}: {len(raw)} bytes is not a whole number of {datatype}")
    values = list(struct.unpack(f"<{len(raw) // size}{code}", raw))
    if datatype in ("FP32", "FP64") and not all(math.isfinite(v) for v in values):
        raise OipError(f"input {name}: not a finite number")
    return values


def _json_values(name: str, datatype: str, kind: str, values: list[Any]) -> list[Any]:
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise OipError(f"input {name}: BYTES data must be strings")
        if kind in ("image", "file"):  # JSON carries bytes as base64
            try:
                return [base64.b64decode(v, validate=True) for v in values]
            except (binascii.Error, ValueError):
                raise OipError(f"input {name}: file data must be base64 in JSON") from None
        return values
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise OipError(f"input {name}: BOOL data must be true/false")
        return values
    if datatype.startswith("FP"):
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise OipError(f"input {name}: {datatype} data must be numbers")
        if not all(math.isfinite(v) for v in values):
            raise OipError(f"input {name}: not a finite number")
        return [float(v) for v in values]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise OipError(f"input {name}: {datatype} data must be integers")
    return values


def _outputs(doc: Mapping[str, Any], ask: InferAsk) -> None:
    params = doc.get("parameters") or {}
    if isinstance(params, dict) and params.get("binary_data_output") is True:
        ask.binary_default = True
    wanted = doc.get("outputs")
    if wanted is None:
        return
    if not isinstance(wanted, list) or len(wanted) > MAX_TENSORS:
        raise OipError("outputs: a list of requested outputs")
    ask.outputs = {}
    for out in wanted:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise OipError("outputs: each needs a name")
        p = out.get("parameters") or {}
        ask.outputs[out["name"]] = bool(isinstance(p, dict) and p.get("binary_data"))


def _output_tensor(name: str, value: Any) -> tuple[str, list[Any]]:
    """(datatype, flat values) of one output field (files: their bytes)."""
    items = value if isinstance(value, list) else [value]
    if all(isinstance(v, dict) and ("base64" in v or "url" in v) for v in items) and items:
        return "BYTES", [base64.b64decode(v.get("base64") or "") for v in items]
    if all(isinstance(v, bool) for v in items):
        return "BOOL", items
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return "INT64", items
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        return "FP64", [float(v) for v in items]
    if all(isinstance(v, str) for v in items):
        return "BYTES", [v.encode("utf-8") for v in items]
    return "BYTES", [json.dumps(v, separators=(",", ":")).encode() for v in items]


def infer_answer(
    model_id: str, request_id: str | None, data: Any, ask: InferAsk, by_field: bool
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, its JSON head's length
    (the ``Inference-Header-Content-Length`` of the answer). ``by_field``: the model
    returns an object (a dataclass), one tensor per field; else one ``output``."""
    fields = data if by_field and isinstance(data, dict) else {"output": data}
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    names = list(fields) if ask.outputs is None else list(ask.outputs)
    for name in names:
        if name not in fields:
            raise OipError(f"outputs: {name[:100]} is not an output of this model")
        datatype, values = _output_tensor(name, fields[name])
        binary = ask.binary_default if ask.outputs is None else ask.outputs[name]
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": [len(values)]}
        if binary:
            if datatype == "BYTES":
                raw = b"".join(struct.pack("<I", len(v)) + v for v in values)
            else:
                code, _size = FIXED[datatype]
                raw = struct.pack(f"<{len(values)}{code}", *values)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "BYTES":
            tensor["data"] = [_text(v) for v in values]
        else:
            tensor["data"] = values
        outputs.append(tensor)
    doc: dict[str, Any] = {"model_name": model_id, "model_version": "1", "outputs": outputs}
    if request_id is not None:
        doc["id"] = request_id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def _text(value: bytes) -> str:
    """A BYTES element in JSON: its text if UTF-8, else base64."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii")
