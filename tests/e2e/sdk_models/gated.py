"""An SDK model whose start-up the test controls: ``setup`` returns once the file
named by the ``gate`` option exists (a cold start that ends when the test says)."""

from __future__ import annotations

import time
from pathlib import Path

from mortred_twisted.sdk import Input, ServedModel

#: how long ``setup`` waits for its gate at most (a bound on a hang)
GATE_TIMEOUT_S = 120.0


class Gated(ServedModel):
    """Greets ``name`` ``times`` times; ready only once its gate file exists."""

    def setup(self) -> None:
        gate = Path(str(self.options["gate"]))
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def predict(
        self,
        name: str = Input(description="who", max_length=8),
        times: int = Input(1, ge=1, le=3),
    ) -> str:
        return " ".join(["hello " + name] * times)
