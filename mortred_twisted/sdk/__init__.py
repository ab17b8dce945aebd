"""The public model SDK: declare a model, and the server serves it.

::

    from mortred_twisted.sdk import ServedModel, Input, Image, File, Context

    class Sharpen(ServedModel):
        \"\"\"Sharpens a picture.\"\"\"
        def setup(self) -> None: ...
        def predict(self, ctx: Context, image: Image = Input(description="the picture"),
                    amount: float = Input(1.0, ge=0.0, le=4.0)) -> Image: ...

These names are the contract (docs/models/your-own.md): :class:`ServedModel`,
:class:`Input`, :class:`Image`, :class:`File`, :class:`Context`, and the errors a
model may raise on purpose (:class:`InvalidRequest` → 422, :class:`InputDecodeError`
→ 400, :class:`RunCancelled` from ``ctx.check_cancelled()``), that validation raises
for an unreadable image input (:class:`UnreadableImage`: an ``InvalidRequest`` and an
``InputDecodeError``, 400) or that loading raises (:class:`DeclarationError`, a
:class:`ModelLoadError`).
"""

from mortred_twisted.model_api.base import (
    InputDecodeError,
    InvalidRequest,
    ModelLoadError,
    RunCancelled,
)
from mortred_twisted.sdk.context import Context
from mortred_twisted.sdk.declaration import Declaration, DeclarationError, Input, declare
from mortred_twisted.sdk.media import File, Image, UnreadableImage
from mortred_twisted.sdk.served import ServedModel

__all__ = [
    "Context",
    "Declaration",
    "DeclarationError",
    "File",
    "Image",
    "Input",
    "InputDecodeError",
    "InvalidRequest",
    "ModelLoadError",
    "RunCancelled",
    "ServedModel",
    "UnreadableImage",
    "declare",
]
