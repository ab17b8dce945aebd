"""Testing served models: in process, in memory, under pytest and trial.

* :class:`ModelHarness` (``harness.py``): load a declaration once and run it in
  process (no reactor, sockets or Docker): outputs with result files in memory,
  progress and events recorded, cancel at a step, batches with per-item errors,
  validation with the server's own messages.
* :class:`MemoryServer` (``server.py``): the model server's real routes (submit,
  wait, result, files) in memory, on a hand-driven clock.
* :mod:`~mortred_twisted.testing.conformance`: ``check(target)`` asserts the model
  contract of any declaration and lists every problem.
* :mod:`~mortred_twisted.testing.pytest_plugin`: the ``model_harness`` and
  ``served_model`` fixtures; :mod:`~mortred_twisted.testing.trial`:
  ``ModelTestCase``, whose calls return Deferreds.

Guide: docs/models/your-own.md.
"""

from mortred_twisted.testing.harness import ModelHarness, RunResult, load_target
from mortred_twisted.testing.server import Answer, HTTPStatusError, MemoryServer

__all__ = [
    "Answer",
    "HTTPStatusError",
    "MemoryServer",
    "ModelHarness",
    "RunResult",
    "load_target",
]
