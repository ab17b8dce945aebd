"""The declaration read from predict()'s signature, and the load errors it gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from mortred_twisted.sdk import Context, DeclarationError, File, Image, Input, ServedModel
from mortred_twisted.sdk.declaration import Declaration, declare


class Sharpen(ServedModel):
    """Sharpens a picture."""

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        amount: float = Input(1.0, ge=0.0, le=4.0),
        mode: str = Input("unsharp", choices=["unsharp", "laplace"]),
        steps: int = Input(10, ge=1, le=1000),
        tags: list[str] = Input(["a"], max_items=3, max_length=5),
        extra: File | None = Input(None),
    ) -> Image:
        raise NotImplementedError


def test_inputs_types_defaults_and_constraints_come_from_the_signature() -> None:
    """Every keyword parameter of predict becomes an input with its type and Input()."""
    decl = declare(Sharpen)
    assert decl.name == "Sharpen" and decl.description == "Sharpens a picture."
    assert decl.takes_context and not decl.streams
    by_name = {d.name: d for d in decl.inputs}
    assert list(by_name) == ["image", "amount", "mode", "steps", "tags", "extra"]
    assert by_name["image"].kind == "image" and by_name["image"].required
    assert by_name["amount"].default == 1.0 and by_name["amount"].le == 4.0
    assert by_name["mode"].choices == ("unsharp", "laplace")
    assert by_name["tags"].is_list and by_name["tags"].default == ("a",)
    assert by_name["extra"].kind == "file" and not by_name["extra"].required
    assert decl.output.kind == "image"
    assert decl.image_input is by_name["image"]


def test_a_declaration_round_trips_through_json() -> None:
    """A process worker sends its declaration as JSON; it comes back equal."""
    import json

    decl = declare(Sharpen)
    assert Declaration.from_json(json.loads(json.dumps(decl.to_json()))) == decl


def test_the_inputs_schema_names_bounds_choices_and_required_inputs() -> None:
    """The JSON schema of params carries what the OpenAPI document and the UI show."""
    schema = declare(Sharpen).inputs_schema()
    assert schema["required"] == ["image"]
    assert schema["properties"]["amount"] == {
        "type": "number", "minimum": 0.0, "maximum": 4.0, "default": 1.0,
    }  # fmt: skip
    assert schema["properties"]["mode"]["enum"] == ["unsharp", "laplace"]
    assert schema["properties"]["tags"]["maxItems"] == 3
    assert schema["properties"]["image"]["x-mortred-kind"] == "image"


@dataclasses.dataclass
class Found:
    boxes: list[list[float]]
    mask: Image
    crops: list[File]


class Streams(ServedModel):
    def predict(self, n: int = 3) -> Iterator[Image]:
        yield from ()


class Structured(ServedModel):
    def predict(self, ctx: Context) -> Found:
        raise NotImplementedError


def test_outputs_streaming_and_dataclasses_are_declared() -> None:
    """A generator streams its item type; a dataclass declares each field."""
    streams = declare(Streams)
    assert streams.streams and streams.output.kind == "image"
    out = declare(Structured).output
    assert out.kind == "object"
    assert dict(out.fields)["mask"].kind == "image"
    assert dict(out.fields)["crops"].is_list


def _model(**annotations_and_defaults: object) -> type:
    """A ServedModel whose predict has one parameter ``x`` (annotation, default)."""
    annotation, default = annotations_and_defaults["x"]  # type: ignore[misc]

    def predict(self, x=default):  # type: ignore[no-untyped-def]
        return None

    predict.__annotations__ = {"x": annotation}
    return type("Bad", (ServedModel,), {"predict": predict})


@pytest.mark.parametrize(
    ("annotation", "default", "reason"),
    [
        (dict, None, "unsupported input type"),
        (list, None, "needs its item type"),
        (float, Input(9.0, ge=0, le=4), "must be <= 4"),
        (str, Input("z", choices=["a", "b"]), "must be one of"),
        (int, Input(1, ge=5, le=2), "above le"),
        (str, Input("a", ge=1), "ge/le bound numbers"),
        (int, Input(1, max_items=2), "max_items bounds lists"),
        (Image, Input(b"x"), "default can only be None"),
        (list[int], Input([1, 2, 3], max_items=2), "more items than max_items"),
        (int, Input(1.5), "must be an integer"),
    ],
)
def test_a_declaration_the_sdk_cannot_serve_is_a_load_error_naming_the_input(
    annotation: object, default: object, reason: str
) -> None:
    """Bad types, defaults outside bounds or choices name the model, input and reason."""
    with pytest.raises(DeclarationError) as info:
        declare(_model(x=(annotation, default)), name="Broken")
    assert "Broken.predict(x)" in str(info.value)
    assert reason in str(info.value)


def test_a_context_under_another_name_is_refused() -> None:
    """The Context parameter must be called ctx."""

    class Misnamed(ServedModel):
        def predict(self, context: Context, n: int = 1) -> int:
            return n

    with pytest.raises(DeclarationError, match=r"predict\(context\).*named ctx"):
        declare(Misnamed)


def test_varargs_and_missing_annotations_are_refused() -> None:
    """*args, **kwargs and unannotated inputs cannot be declared."""

    class Varargs(ServedModel):
        def predict(self, **kwargs: int) -> int:
            return 0

    class Untyped(ServedModel):
        def predict(self, n=1):  # type: ignore[no-untyped-def]
            return n

    with pytest.raises(DeclarationError, match="kwargs"):
        declare(Varargs)
    with pytest.raises(DeclarationError, match=r"predict\(n\): needs a type annotation"):
        declare(Untyped)


def test_predict_batch_declares_batching_with_its_class_attributes() -> None:
    """predict_batch makes the model batch; max_batch_size and batch_wait_ms come along."""

    class Batches(ServedModel):
        max_batch_size = 4
        batch_wait_ms = 5.0

        def predict(self, n: int = 1) -> int:
            return n

        def predict_batch(self, ctx: Context, items: list[dict]) -> list[int]:
            return [i["n"] for i in items]

    decl = declare(Batches)
    assert (decl.max_batch_size, decl.batch_wait_ms) == (4, 5.0)
    assert declare(Sharpen).max_batch_size == 1
