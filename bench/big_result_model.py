"""An SDK model with one result file of ``mb`` MiB (random bytes), for
``bench/file_memory.py``; importable as ``big_result_model:Big`` with ``bench/`` on
``PYTHONPATH`` (so that a checkout of another commit can serve it too)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mortred_twisted.sdk import File, Input, ServedModel


@dataclass
class Blob:
    blob: File


class Big(ServedModel):
    """One file of ``mb`` MiB."""

    def predict(self, mb: int = Input(1, ge=1, le=1024)) -> Blob:
        return Blob(File(os.urandom(mb << 20), content_type="application/octet-stream"))
