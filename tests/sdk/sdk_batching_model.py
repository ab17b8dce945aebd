"""A model that batches on the sync path (its declared max_batch_size / batch_wait_ms)."""

from __future__ import annotations

from mortred_twisted.sdk import Context, Input, ServedModel

BATCHES: list[int] = []


class Doubler(ServedModel):
    max_batch_size = 4
    batch_wait_ms = 5.0

    def predict(self, n: int = Input(1, ge=0, le=100)) -> int:
        return 2 * n

    def predict_batch(self, ctx: Context, items: list[dict]) -> list[object]:
        BATCHES.append(len(items))
        return [ValueError("thirteen") if i["n"] == 13 else 2 * i["n"] for i in items]
