"""Served models the harness tests run, named by behaviour."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mortred_twisted.sdk import Context, File, Image, Input, ServedModel


class Inverts(ServedModel):
    """Inverts a picture's bytes' last byte, in ``steps`` steps (progress and cancel),
    emitting a preview after the first step."""

    def setup(self) -> None:
        self.calls = 0
        self.scale = float(self.options.get("scale", 1.0))

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        amount: float = Input(1.0, ge=0.0, le=4.0),
        steps: int = Input(4, ge=1, le=100),
    ) -> Image:
        self.calls += 1
        for i in range(steps):
            ctx.check_cancelled()
            if i == 0:
                ctx.emit("preview", {"step": 1, "amount": amount * self.scale})
            ctx.progress(i + 1, steps)
        ctx.log(f"done {steps} steps")
        data = image.read()
        return Image(data[:-1] + bytes([255 - data[-1]]), "image/png")


class IgnoresCancel(ServedModel):
    """Reports progress but never checks for cancellation."""

    def predict(self, ctx: Context, steps: int = Input(5, ge=1)) -> int:
        for i in range(steps):
            ctx.progress(i + 1, steps)
        return steps


class ProgressGoesBack(ServedModel):
    """Reports 2 of 4, then 1 of 4."""

    def predict(self, ctx: Context) -> str:
        ctx.progress(2, 4)
        ctx.progress(1, 4)
        return "ok"


class LiesAboutItsOutput(ServedModel):
    """Declares an Image and returns text."""

    def predict(self, text: str = Input("x")) -> Image:
        return text  # type: ignore[return-value]


@dataclass
class Report:
    label: str
    picture: Image


class Structured(ServedModel):
    """Returns a dataclass with a file field and a file output list."""

    def predict(self, label: str = Input("cat"), count: int = Input(2, ge=0, le=5)) -> Report:
        return Report(label=label * count, picture=Image(b"\x89PNG\r\n\x1a\n" + label.encode()))


class Frames(ServedModel):
    """Streams ``n`` frames (each a file), with a preview event before each."""

    def predict(self, ctx: Context, n: int = Input(3, ge=1, le=10)) -> Iterator[File]:
        for i in range(n):
            ctx.emit("preview", {"frame": i})
            yield File(f"frame {i}".encode(), "text/plain")


class Batches(ServedModel):
    """Doubles ``x`` in one batched call; an ``x`` of 13 fails its own item."""

    max_batch_size = 4

    def predict(self, x: int) -> int:
        return self.predict_batch(None, [{"x": x}])[0]

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        return [ValueError("unlucky") if item["x"] == 13 else item["x"] * 2 for item in items]


class SetupFails(ServedModel):
    """Its setup raises (a missing weight file)."""

    def setup(self) -> None:
        raise FileNotFoundError("weights/missing.pt")

    def predict(self) -> int:
        return 1


class TakesFiles(ServedModel):
    """Sums the sizes of a list of files."""

    def predict(self, files: list[File] = Input(max_items=3)) -> int:
        return sum(f.size for f in files)
