"""Step batching for a served model: its instance's batch behind the server's
:class:`~mortred_twisted.model_api.base.StepBatch` contract.

A served instance that steps runs together defines ``run_capacity`` (an int above
1: its places in the worker pool) and ``step_batch()``: an object with
``join(key, ctx, kwargs)`` (``ctx`` the run's SDK :class:`~mortred_twisted.sdk.Context`,
``kwargs`` the keyword arguments ``predict`` would get, without ``ctx``),
``step() -> [(key, output | exception)]``, ``abandon() -> [key]`` and ``active``:
the ``StepBatch`` contract in ``predict``'s terms (same thread rules: one thread at
a time, the server's batch loop). :class:`SdkStepBatch` builds each run's arguments
and context as :meth:`SdkModel.run <mortred_twisted.sdk.adapter.SdkModel.run>` does
(file references become ``Image`` values, events go through the run's encoder) and
encodes each output as ``run`` encodes ``predict``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mortred_twisted.model_api.base import InferenceRequest, RunContext, StepBatch
from mortred_twisted.sdk.outputs import encode_outcome

if TYPE_CHECKING:
    from mortred_twisted.sdk.adapter import SdkModel


class SdkStepBatch(StepBatch):
    """See the module docstring. Owned by one :class:`SdkModel` (one per instance)."""

    def __init__(self, model: SdkModel, inner: Any) -> None:
        self._model = model
        self._inner = inner
        self._encoders: dict[int, Any] = {}

    @property
    def active(self) -> int:
        return int(self._inner.active)

    def join(self, key: int, request: InferenceRequest, ctx: RunContext) -> None:
        model = self._model
        encoder = model.encoder(ctx)
        kwargs = model._kwargs(request)
        run_ctx = model._context(ctx, request.req_id, encoder)
        self._inner.join(key, run_ctx, kwargs)
        self._encoders[key] = encoder

    def step(self) -> list[tuple[int, Any]]:
        left: list[tuple[int, Any]] = []
        for key, outcome in self._inner.step():
            left.append((key, encode_outcome(self._encoders.pop(key), outcome)))
        return left

    def abandon(self) -> list[int]:
        keys = list(self._inner.abandon())
        for key in keys:
            self._encoders.pop(key, None)
        return keys
