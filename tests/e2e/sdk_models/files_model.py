"""An SDK model whose outputs are result files (issue 26: result files): a picture
and ``n`` text files, named by their position in the output."""

from __future__ import annotations

from dataclasses import dataclass

from mortred_twisted.sdk import File, Image, Input, ServedModel


@dataclass
class Pictures:
    picture: Image
    notes: list[File]
    count: int


class Pack(ServedModel):
    """A 2x2 picture and `n` notes of `size` bytes each."""

    def predict(
        self,
        n: int = Input(2, ge=0, le=20),
        size: int = Input(10, ge=1, le=8_000_000),
    ) -> Pictures:
        notes = [
            File((f"note {i} ".encode() * size)[:size], content_type="text/plain") for i in range(n)
        ]
        return Pictures(Image.from_array([[0, 255], [255, 0]]), notes, n)
