"""The seed's envelope (contract ``"mortred-v1"``) for a declared model (pure).

The built-in families are declared with the SDK and keep the wire of the seed's
acceptance guide (T1–T16) unchanged; any ``ServedModel`` may choose it with
``contract = "mortred-v1"``:

* the envelope's ``images`` (a base64 array) fill the model's one ``list[Image]``
  input. When that input is required, a request without images is a 422
  ``images: at least one image is required``; their count and pixels are checked
  from their headers against the input limits (413). A model without an image
  input ignores ``images``.
* ``params`` are checked by the seed's rules (:func:`~mortred_twisted.model_api.params.
  validate_params` over the scalar inputs): an unknown key is ``unknown parameter
  (did you mean …); accepted: …``, an input whose default is None is absent unless
  given, the others get their default. A renamed input is accepted under its former
  name (its errors then name the old one: ``… (timesteps is now sample_steps)``);
  ``only_when`` drops or refuses inputs that do not apply.
* The validated params are stored with the job as they are (no file references);
  ``predict`` gets every scalar input by name (None when absent), the image input
  as a list of :class:`~mortred_twisted.sdk.media.Image`, and returns the
  envelope's ``data`` (JSON, inline; no result files), described by the class's
  ``output_schema``. JSON bodies only (no multipart).

Declarations this contract cannot carry (a required scalar, a list of scalars, a
``File``, several image inputs, string lengths, a streaming ``predict``, a result
file output) are refused at load (:func:`check_seed_declaration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest
from mortred_twisted.model_api.params import ParamSpec, validate_params
from mortred_twisted.sdk.declaration import Declaration, DeclarationError

if TYPE_CHECKING:
    from mortred_twisted.model_api.input_limits import InputLimits

SEED = "mortred-v1"
_KINDS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def check_seed_declaration(declaration: Declaration) -> None:
    """Refuse what the seed envelope cannot carry (see the module docstring)."""
    model = declaration.name
    images = [d for d in declaration.inputs if d.binary]
    if len(images) > 1 or any(d.kind != "image" or not d.is_list for d in images):
        raise DeclarationError(
            model, images[-1].name, f"the {SEED} contract takes one list[Image] input (images)"
        )
    for decl in declaration.inputs:
        if decl.binary:
            continue
        if decl.is_list:
            raise DeclarationError(model, decl.name, f"the {SEED} contract takes scalar params")
        if decl.required:
            raise DeclarationError(
                model, decl.name, f"a {SEED} param needs a default (None: absent unless given)"
            )
        if decl.min_length is not None or decl.max_length is not None:
            raise DeclarationError(model, decl.name, f"the {SEED} contract bounds no lengths")
    if declaration.streams or declaration.output.kind != "json":
        raise DeclarationError(model, None, f"a {SEED} predict returns the envelope's data (JSON)")


def param_specs(declaration: Declaration) -> tuple[ParamSpec, ...]:
    """The scalar inputs as the seed's :class:`ParamSpec` entries, in order."""
    return tuple(
        ParamSpec(
            decl.name,
            _KINDS[decl.kind],
            default=decl.default,
            minimum=decl.ge,
            maximum=decl.le,
            choices=decl.choices,
            description=decl.description,
        )
        for decl in declaration.inputs
        if not decl.binary
    )


def image_input(declaration: Declaration) -> Any:
    """The declaration's ``list[Image]`` input, or None."""
    for decl in declaration.inputs:
        if decl.binary:
            return decl
    return None


def validate_seed(
    declaration: Declaration,
    specs: tuple[ParamSpec, ...],
    request: InferenceRequest,
    limits: InputLimits | None,
) -> InferenceRequest:
    """``request`` checked by the seed's rules (see the module docstring)."""
    from mortred_twisted.sdk.constraints import drop_inapplicable

    images = image_input(declaration)
    if images is not None:
        if images.required and not request.images:
            raise InvalidRequest("images", "at least one image is required")
        if limits is not None and request.images:
            from mortred_twisted.model_api.input_limits import check_input_limits

            check_input_limits(request.images, limits)
    raw: Any = request.params
    renamed: dict[str, str] = {}
    if declaration.renamed and isinstance(raw, Mapping):
        raw = dict(raw)
        for old, new in declaration.renamed:
            if old in raw:
                if new in raw:
                    raise InvalidRequest(
                        f"params.{old}", f"replaced by params.{new}; give only {new}"
                    )
                raw[new] = raw.pop(old)
                renamed[f"params.{new}"] = old
    try:
        params = validate_params(specs, raw)
    except InvalidRequest as exc:
        old = renamed.get(exc.field)
        if old is None:
            raise
        new = exc.field.removeprefix("params.")
        raise InvalidRequest(f"params.{old}", f"{exc.message} ({old} is now {new})") from exc
    params = drop_inapplicable(declaration, params, raw if isinstance(raw, Mapping) else {})
    return request.with_params(params)


def sdk_declaration(model: Any) -> Declaration | None:
    """``model``'s declaration when it speaks the SDK contract (named inputs, result
    files, a described form); None for the seed contract and for a model without one."""
    declaration = getattr(model, "declaration", None)
    if declaration is None or declaration.contract == SEED:
        return None
    return declaration
