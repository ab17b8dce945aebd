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

Declared with the SDK (:class:`~mortred_twisted.sdk.ServedModel`, the seed's
``"mortred-v1"`` contract): its params, messages and data are the seed's.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.models.schemas import FAKE_OUTPUT
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MODES = ("sleep", "cpu", "python", "fail")


class FakeModelFailure(RuntimeError):
    """The failure the fake raises on purpose."""


class FakeModel(ServedModel):
    """The deterministic fake model (see the module docstring)."""

    contract = "mortred-v1"
    output_schema = FAKE_OUTPUT

    def setup(self) -> None:
        """Read the options (every problem at once); raises ModelLoadError."""
        options = self.options
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
        self.exit_on_run = bool(options.get("fake_exit_on_run"))
        self.delay_ms = delay
        self.mode = mode
        self.fail_every = fail_every
        self.steps = max(1, steps)
        self._runs = 0
        self._lock = threading.Lock()

    def predict(
        self,
        ctx: Context,
        images: list[Image] = Input(description="any bytes (not decoded; echoed as a digest)"),
        delay_ms: int = Input(None, ge=0, le=600_000, description="run time"),
        mode: str = Input(None, choices=MODES, description="how the run spends its time"),
        fail: bool = Input(None, description="raise instead of returning a result"),
        steps: int = Input(None, ge=1, le=10_000, description="progress steps"),
    ) -> dict[str, Any]:
        if self.exit_on_run:
            os._exit(70)
        with self._lock:
            self._runs += 1
            run_number = self._runs
        given = {"delay_ms": delay_ms, "mode": mode, "fail": fail, "steps": steps}
        params = {name: value for name, value in given.items() if value is not None}
        delay_s = int(self.delay_ms if delay_ms is None else delay_ms) / 1000.0
        mode = self.mode if mode is None else mode
        steps = self.steps if steps is None else steps
        step_s = delay_s / steps
        for step in range(1, steps + 1):
            ctx.check_cancelled()
            if step_s > 0:
                _spend(mode, step_s)
            ctx.progress(step, steps)
        if mode == "fail" or fail or (self.fail_every and run_number % self.fail_every == 0):
            raise FakeModelFailure(f"fake model failure (run {run_number})")
        digest = hashlib.sha256()
        for image in images:
            digest.update(hashlib.sha256(image.read()).digest())
        return {
            "model": "fake",
            "req_id": ctx.request_id,
            "images": len(images),
            "digest": digest.hexdigest(),
            "params": params,
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


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One fake instance set up and served through the SDK (no input limits: the
    registry's ``create_model`` adds the configured ones); raises ModelLoadError."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(FakeModel, options, root)
