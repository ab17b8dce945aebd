"""Declarations across inputs, and constraints from the loaded configuration (pure).

* :func:`check_declaration` (load time): the contract is one the server speaks; a
  renamed input's old name is not declared and its new name is; ``only_when`` names
  another declared input and values that input accepts; the ``"mortred-v1"``
  contract's own rules (:func:`~mortred_twisted.sdk.seed_contract.check_seed_declaration`).
* :func:`refine` (load time, after ``setup``): the declaration with the constraints
  :meth:`~mortred_twisted.sdk.served.ServedModel.configure_inputs` read from the
  configuration (a bound from the weights, a default from the options), checked as
  the class's own. The refined declaration is what validates, what the OpenAPI
  document shows and what a validation twin carries.
* :func:`drop_inapplicable` (reactor thread, per request): ``only_when`` applied to
  validated params.

Everything here is data in, data out: a twin built from a declaration's JSON checks
exactly what the loaded model checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mortred_twisted.model_api.base import InvalidRequest
from mortred_twisted.sdk.declaration import (
    Declaration,
    DeclarationError,
    Input,
    InputDecl,
    _check_value,
    _input_decl,
)
from mortred_twisted.sdk.media import File, Image

#: The wire contracts a declaration may name.
CONTRACTS = ("sdk", "mortred-v1")

_ANNOTATIONS: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "image": Image,
    "file": File,
}


def check_declaration(declaration: Declaration) -> Declaration:
    """``declaration`` when its cross-input parts hold (raises DeclarationError)."""
    model = declaration.name
    if declaration.contract not in CONTRACTS:
        raise DeclarationError(
            model, None, f"contract must be one of {', '.join(CONTRACTS)}, not "
            f"{declaration.contract!r}"
        )  # fmt: skip
    for old, new in declaration.renamed:
        if declaration.input(old) is not None:
            raise DeclarationError(model, old, f"is declared and also renamed to {new!r}")
        if declaration.input(new) is None:
            raise DeclarationError(model, old, f"is renamed to {new!r}, which is not declared")
    for decl in declaration.inputs:
        if decl.only_when is None:
            continue
        other_name, allowed = decl.only_when
        other = declaration.input(other_name)
        if other is None or other.binary or other.is_list:
            raise DeclarationError(
                model, decl.name, f"only_when names {other_name!r}, not a declared scalar input"
            )
        for value in allowed:
            _check_value(model, other, value, f"only_when value of {other_name}")
    if declaration.contract == "mortred-v1":
        from mortred_twisted.sdk.seed_contract import check_seed_declaration

        check_seed_declaration(declaration)
    return declaration


def refine(declaration: Declaration, overrides: Mapping[str, Any]) -> Declaration:
    """``declaration`` with the inputs in ``overrides`` (name -> :class:`Input`)
    constrained anew; an input keeps its ``only_when`` unless the override sets one.
    Raises DeclarationError for an undeclared name or a constraint that does not hold."""
    if not overrides:
        return declaration
    model = declaration.name
    inputs = []
    for decl in declaration.inputs:
        spec = overrides.get(decl.name)
        inputs.append(decl if spec is None else _refined(model, decl, spec))
    for name, spec in overrides.items():
        if declaration.input(name) is None:
            raise DeclarationError(model, name, "configure_inputs() names an undeclared input")
        if not isinstance(spec, Input):
            raise DeclarationError(model, name, "configure_inputs() values must be Input(...)")
    return check_declaration(dataclasses.replace(declaration, inputs=tuple(inputs)))


def _refined(model: str, decl: InputDecl, spec: Input) -> InputDecl:
    if not isinstance(spec, Input):
        raise DeclarationError(model, decl.name, "configure_inputs() values must be Input(...)")
    annotation = _ANNOTATIONS[decl.kind]
    if decl.is_list:
        annotation = list[annotation]  # type: ignore[valid-type]
    refined = _input_decl(model, decl.name, annotation, spec)
    if spec.only_when is None and decl.only_when is not None:
        refined = dataclasses.replace(refined, only_when=decl.only_when)
    return refined


def drop_inapplicable(
    declaration: Declaration, params: dict[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """``params`` without the inputs whose ``only_when`` does not hold: a key the
    request gave (even as null: the seed's rule) is a 422 (``params.<name>: applies
    only to …``), a default is dropped. ``given`` is the request's params as sent
    (after renames)."""
    for decl in declaration.inputs:
        if decl.only_when is None or decl.name not in params:
            continue
        other, allowed = decl.only_when
        current = params.get(other)
        if current in allowed:
            continue
        if decl.name in given:
            choices = " or ".join(repr(v) for v in allowed)
            raise InvalidRequest(
                f"params.{decl.name}", f"applies only to {other} {choices} ({other} is {current!r})"
            )
        params.pop(decl.name)
    return params
