"""``ServedModel``: the base class of a user's model (the public contract).

Lifecycle and threads:

* The server builds one instance per worker (``worker_nums``) on its loader thread,
  sets :attr:`ServedModel.options` (the ``[model]`` options of the server file, or of
  the model file it names, without the server's own keys) and :attr:`ServedModel.root`
  (the project root, for relative weight paths), then calls :meth:`setup` once, off the
  reactor thread. An exception in ``setup`` leaves the server *not ready* with the
  traceback in its log and the reason in ``/healthz``.
* :meth:`predict` (or :meth:`predict_batch`) runs on a worker thread, one call at a
  time per instance; inputs arrive as keyword arguments, already validated against
  the declaration (see ``sdk/declaration.py``). It may raise
  :class:`~mortred_twisted.model_api.base.InvalidRequest` (422) or
  :class:`~mortred_twisted.model_api.base.InputDecodeError` (400); any other exception
  fails the job (500, its type and message in the answer).
* :meth:`predict_batch` (optional) serves several requests of the sync path in one
  call: ``items`` are the keyword arguments of each request, the answer a list of the
  same length whose entries are outputs or exceptions (each item fails alone).
  ``max_batch_size`` and ``batch_wait_ms`` say how many requests to gather and how
  long to wait for them.
* :meth:`close` (optional) runs once at shutdown, off the reactor thread.

Optional declarations beside ``predict`` (all plain data, so that a validation twin
without the instance checks exactly what the model does):

* :meth:`configure_inputs` (after ``setup``): constraints that depend on the loaded
  configuration (a bound read from the weights, a default from the options), as
  :class:`~mortred_twisted.sdk.declaration.Input` values for declared inputs;
* :attr:`renamed_inputs`: former input names still accepted (old → new);
* :attr:`contract`: ``"sdk"`` (named inputs, multipart, result files) or
  ``"mortred-v1"``, the seed's envelope that the built-in families keep (see
  :mod:`mortred_twisted.sdk.seed_contract`), with :attr:`output_schema` the JSON
  schema of the ``data`` that ``predict`` returns as it is;
* ``predict_together(ctxs, items)``: several sync requests in one call, each with its
  own :class:`~mortred_twisted.sdk.context.Context` (its cancel and progress), one
  outcome each — where ``predict_batch``'s one context is too coarse (samplers);
* ``run_capacity`` and ``step_batch()`` (step batching) and ``check_inputs(params)``
  (reactor-thread checks after the declaration's), see ``sdk/step_batching.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar


class ServedModel:
    """See the module docstring. Subclasses define ``predict``."""

    #: how many sync requests :meth:`predict_batch` takes at once (1: no batching)
    max_batch_size: ClassVar[int] = 8
    #: how long a free worker waits for more requests to batch (milliseconds)
    batch_wait_ms: ClassVar[float] = 2.0

    #: the wire contract: "sdk", or "mortred-v1" (the seed envelope, built-ins)
    contract: ClassVar[str] = "sdk"
    #: "mortred-v1" only: the JSON schema of the data ``predict`` returns
    output_schema: ClassVar[Mapping[str, Any] | None] = None
    #: former input names still accepted, old name -> its declared replacement
    renamed_inputs: ClassVar[Mapping[str, str]] = {}

    options: Mapping[str, Any] = {}
    root: Path = Path(".")

    def configure_inputs(self) -> Mapping[str, Any]:
        """Constraints read from the loaded configuration: input name -> ``Input``
        (replacing the declared default and bounds; the type stays the annotation's).
        Called once after :meth:`setup`; the default changes nothing."""
        return {}

    def setup(self) -> None:
        """Load weights; called once per instance, off the reactor thread."""

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        """Several requests at once (override to batch; the default is not used)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`setup` took; called once at shutdown."""

    def path(self, relative: str) -> Path:
        """``relative`` under :attr:`root` (an absolute path stays as it is)."""
        return Path(self.root) / relative
