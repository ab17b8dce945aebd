"""Declarations across inputs, and constraints from the loaded configuration (pure).

* :func:`check_declaration` (load time): the contract is one the server speaks; a
  renamed input's old name is not declared and its new name is; ``only_when`` names
  another declared input and values that input accepts, and no chain of them loops;
  the ``"mortred-v1"`` contract's own rules
  (:func:`~mortred_twisted.sdk.seed_contract.check_seed_declaration`).
* :func:`refine` (load time, after ``setup``): the declaration with the constraints
  :meth:`~mortred_twisted.sdk.served.ServedModel.configure_inputs` read from the
  configuration (a bound from the weights, a default from the options), checked as
  the class's own. The refined declaration is what validates, what the OpenAPI
  document shows and what a validation twin carries.
* :func:`drop_inapplicable` (reactor thread, per request): ``only_when`` applied to
  validated params, on both contracts (``sdk/validation.py``, ``sdk/seed_contract.py``).

Everything here is data in, data out: a twin built from a declaration's JSON checks
exactly what the loaded model checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping
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
    for decl in declaration.inputs:
        chain = [decl.name]
        current = decl
        while current is not None and current.only_when is not None:
            current = declaration.input(current.only_when[0])
            if current is None:
                break
            if current.name in chain:
                loop = " -> ".join([*chain[chain.index(current.name) :], current.name])
                raise DeclarationError(model, decl.name, f"only_when conditions loop: {loop}")
            chain.append(current.name)
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
    declaration: Declaration,
    params: dict[str, Any],
    given: Container[str],
    *,
    missing: Container[str] = (),
) -> dict[str, Any]:
    """``params`` without the inputs whose ``only_when`` does not hold (the same rule
    on every contract). An input applies while its ``only_when`` input applies and has
    one of the listed values (a chain of conditions reads the same in any order).

    An input that does not apply: given by the request (a name in ``given``: the
    request's keys after renames; the seed's rule counts a key given as null, the
    SDK contract does not) is a 422 ``params.<name>: applies only to …``; its default
    is dropped (``predict`` gets None). An input that applies and is in ``missing``
    (required, not given) is a 422 ``params.<name>: is required``."""
    memo: dict[str, bool] = {}

    def applies(decl: InputDecl) -> bool:
        if decl.only_when is None:
            return True
        if decl.name not in memo:
            memo[decl.name] = True  # a loop is refused at load (check_declaration)
            other_name, allowed = decl.only_when
            other = declaration.input(other_name)
            memo[decl.name] = (
                other is not None and applies(other) and params.get(other_name) in allowed
            )
        return memo[decl.name]

    for decl in declaration.inputs:
        if decl.only_when is None:
            continue
        if applies(decl):
            if decl.name in missing:
                raise InvalidRequest(f"params.{decl.name}", "is required")
            continue
        if decl.name in given:
            other, allowed = decl.only_when
            choices = " or ".join(repr(v) for v in allowed)
            other_decl = declaration.input(other)
            state = (
                f"{other} is {params.get(other)!r}"
                if other_decl is not None and applies(other_decl)
                else f"{other} does not apply"
            )
            message = f"applies only to {other} {choices} ({state})"
            raise InvalidRequest(f"params.{decl.name}", message)
        params.pop(decl.name, None)
    return params
