"""The deterministic fake model: for tests, benchmarks and the quick start.

Selected with ``[model] type = "fake"``. Options (model TOML or ``[model]`` keys):

* ``fake_delay_ms`` (int, default 1000): how long a run takes.
* ``fake_mode``: ``"sleep"`` (releases the GIL, like a GPU-bound model),
  ``"cpu"`` (real single-threaded torch matrix work for the whole delay: a
  CPU-bound model whose ops release the GIL between Python glue), ``"python"``
  (a pure-Python busy loop that holds the GIL: the worst case for the reactor),
  ``"fail"`` (every run raises after the delay).
* ``fake_fail_every`` (int, default 0): the Nth, 2Nth, … run of an instance raises.
* ``fake_steps`` (int, default 10): progress steps reported per run; the
  cancellation flag is checked between steps.
* ``fake_preload_torch`` (bool, default false; implied by ``fake_mode = "cpu"``):
  import torch while loading, as a real torch model does, instead of on the first
  ``cpu``-mode run (then the server's post-load ``gc.freeze()`` covers torch's
  objects, as it does for a real model).
* ``fake_exit_on_run`` (bool, default false): the process exits abruptly
  (``os._exit``) when a run starts — a stand-in for a segfault or an OOM kill, for
  testing process-isolated workers. Config only, never a request param.

Request ``params``: ``delay_ms`` (0–600000), ``mode`` and ``steps`` override the
options for one request; ``fail`` (bool) makes this run raise. Images are required (any bytes:
the fake does not decode pixels) and echoed as a digest, so results are
deterministic functions of the request.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import (
    InferenceRequest,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.models.params import ParamSpec
from mortred_twisted.models.schemas import FAKE_OUTPUT

MODES = ("sleep", "cpu", "python", "fail")


class FakeModelFailure(RuntimeError):
    """The failure the fake raises on purpose."""


class FakeModel(Model):
    """See the module docstring."""

    output_schema = FAKE_OUTPUT

    params_schema = (
        ParamSpec("delay_ms", int, minimum=0, maximum=600_000, description="run time"),
        ParamSpec("mode", str, choices=MODES, description="how the run spends its time"),
        ParamSpec("fail", bool, description="raise instead of returning a result"),
        ParamSpec("steps", int, minimum=1, maximum=10_000, description="progress steps"),
    )

    def __init__(
        self, delay_ms: int, mode: str, fail_every: int, steps: int, exit_on_run: bool = False
    ) -> None:
        self.exit_on_run = exit_on_run
        self.delay_ms = delay_ms
        self.mode = mode
        self.fail_every = fail_every
        self.steps = max(1, steps)
        self._runs = 0
        self._lock = threading.Lock()

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        if self.exit_on_run:
            os._exit(70)
        with self._lock:
            self._runs += 1
            run_number = self._runs
        delay_s = int(request.params.get("delay_ms", self.delay_ms)) / 1000.0
        mode = str(request.params.get("mode", self.mode))
        steps = int(request.params.get("steps", self.steps))
        step_s = delay_s / steps
        for step in range(1, steps + 1):
            ctx.check_cancelled()
            if step_s > 0:
                _spend(mode, step_s)
            ctx.progress(step, steps)
        if (
            mode == "fail"
            or request.params.get("fail")
            or (self.fail_every and run_number % self.fail_every == 0)
        ):
            raise FakeModelFailure(f"fake model failure (run {run_number})")
        digest = hashlib.sha256()
        for image in request.images:
            digest.update(hashlib.sha256(image).digest())
        return {
            "model": "fake",
            "req_id": request.req_id,
            "images": len(request.images),
            "digest": digest.hexdigest(),
            "params": dict(request.params),
            "steps": steps,
        }


def _spend(mode: str, seconds: float) -> None:
    """Spend ``seconds`` the way ``mode`` says (see the module docstring)."""
    end = time.perf_counter() + seconds
    if mode == "cpu":
        import torch

        # One intra-op thread: the fake stands for one model instance per worker,
        # and torch's default (a thread per CPU, spinning between ops) would make
        # each worker occupy every core.
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        a = torch.ones(256, 256)
        while time.perf_counter() < end:
            a = (a @ a).clamp_(max=1.0)
    elif mode == "python":
        x = 0
        while time.perf_counter() < end:
            for i in range(1000):
                x ^= i
    else:
        time.sleep(seconds)


def create(options: Mapping[str, Any], root: Path) -> FakeModel:
    """Build one fake instance; raises ModelLoadError on a bad option."""
    problems = []
    delay = options.get("fake_delay_ms", 1000)
    mode = options.get("fake_mode", "sleep")
    fail_every = options.get("fake_fail_every", 0)
    steps = options.get("fake_steps", 10)
    if not isinstance(delay, int) or delay < 0:
        problems.append(f"fake_delay_ms must be an int >= 0 (got {delay!r})")
    if mode not in MODES:
        problems.append(f"fake_mode must be one of {', '.join(MODES)} (got {mode!r})")
    if not isinstance(fail_every, int) or fail_every < 0:
        problems.append(f"fake_fail_every must be an int >= 0 (got {fail_every!r})")
    if not isinstance(steps, int) or steps < 1:
        problems.append(f"fake_steps must be an int >= 1 (got {steps!r})")
    if options.get("fake_load_error"):
        problems.append(str(options["fake_load_error"]))
    if problems:
        raise ModelLoadError("fake model: " + "; ".join(problems))
    if mode == "cpu" or options.get("fake_preload_torch"):
        import torch  # noqa: F401  (loaded like a real torch model's dependency)
    return FakeModel(delay, mode, fail_every, steps, bool(options.get("fake_exit_on_run")))
