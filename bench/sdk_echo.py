"""The fake model's job path declared with the SDK, for ``bench/port_cpu.py --sdk``:
one ``File`` input (the built-in fake's image bytes), its digest out, progress steps."""

import hashlib

from mortred_twisted.sdk import Context, File, Input, ServedModel


class SdkEcho(ServedModel):
    """Echoes a digest of its input (the built-in fake model's zero-delay run)."""

    def predict(
        self,
        ctx: Context,
        data: File,
        steps: int = Input(1, ge=1, le=1000),
        mode: str = Input("sleep", choices=["sleep", "cpu", "python", "fail"]),
    ) -> dict:
        for step in range(steps):
            ctx.check_cancelled()
            ctx.progress(step + 1, steps)
        return {"digest": hashlib.sha256(data.read()).hexdigest()[:16], "steps": steps}
