"""An :class:`~mortred_twisted.sdk.adapter.SdkModel` whose served instance steps runs
together, and checks that need its configuration before admission.

The served instance may define (both optional):

* ``run_capacity`` (an int above 1) and ``step_batch()``: an object with
  ``join(key, ctx, kwargs)`` (``ctx`` the run's SDK :class:`~mortred_twisted.sdk.Context`,
  ``kwargs`` the keyword arguments ``predict`` would get, without ``ctx``),
  ``step() -> [(key, output | exception)]``, ``abandon() -> [key]`` and ``active``:
  the :class:`~mortred_twisted.models.base.StepBatch` contract in ``predict``'s
  terms. :class:`_SdkStepBatch` translates: it builds each run's arguments and
  context as :meth:`SdkModel.run` does (file references become ``Image`` values,
  events go through the run's encoder) and encodes each output as ``run`` encodes
  ``predict``'s (result files through the run's sink);
* ``check_inputs(params)``: called on the reactor thread after the declaration's
  checks, with the normalised params; raises
  :class:`~mortred_twisted.models.base.InvalidRequest` (a 422 before admission).

The validation twin (process isolation) is the plain ``SdkModel`` twin: it keeps the
declaration's checks; ``predict`` repeats ``check_inputs`` on the worker.
"""

from __future__ import annotations

from typing import Any

from mortred_twisted.models.base import InferenceRequest, RunContext, StepBatch
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.sdk.outputs import OutputEncoder


class StepBatchedSdkModel(SdkModel):
    """See the module docstring."""

    def __init__(self, declaration: Any, instance: Any, *, input_limits: Any = None) -> None:
        super().__init__(declaration, instance, input_limits=input_limits)
        capacity = int(getattr(instance, "run_capacity", 1) or 1)
        maker = getattr(instance, "step_batch", None)
        self.run_capacity = capacity if capacity > 1 and callable(maker) else 1
        self._batch = _SdkStepBatch(self, maker()) if self.run_capacity > 1 else None

    @classmethod
    def around(cls, model: SdkModel) -> StepBatchedSdkModel:
        """The same declaration, instance and limits as ``model``, batched."""
        return cls(model.declaration, model.instance, input_limits=model.input_limits)

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        checked = super().validate(request)
        check = getattr(self.instance, "check_inputs", None)
        if check is not None:
            check(checked.params)
        return checked

    def step_batch(self) -> StepBatch | None:
        return self._batch


class _SdkStepBatch(StepBatch):
    """The instance's batch behind the server's StepBatch contract (same thread rules)."""

    def __init__(self, model: StepBatchedSdkModel, inner: Any) -> None:
        self._model = model
        self._inner = inner
        self._encoders: dict[int, OutputEncoder] = {}

    @property
    def active(self) -> int:
        return int(self._inner.active)

    def join(self, key: int, request: InferenceRequest, ctx: RunContext) -> None:
        model = self._model
        encoder = OutputEncoder(ctx.result_files)
        kwargs = model._kwargs(request)
        run_ctx = model._context(ctx, request.req_id, encoder)
        self._inner.join(key, run_ctx, kwargs)
        self._encoders[key] = encoder

    def step(self) -> list[tuple[int, Any]]:
        left: list[tuple[int, Any]] = []
        for key, outcome in self._inner.step():
            encoder = self._encoders.pop(key)
            if isinstance(outcome, BaseException):
                left.append((key, outcome))
                continue
            try:
                left.append((key, encoder.encode(outcome)))
            except (TypeError, ValueError) as exc:
                left.append((key, exc))
        return left

    def abandon(self) -> list[int]:
        keys = list(self._inner.abandon())
        for key in keys:
            self._encoders.pop(key, None)
        return keys
