"""SDK models in worker processes: the declaration travels as JSON, files and events
come back with the run."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InferenceRequest, RunContext
from mortred_twisted.models.isolated import IsolatedModel

MODEL = '''
from collections.abc import Iterator
from mortred_twisted.sdk import Context, File, ServedModel

class Pages(ServedModel):
    """Writes pages."""
    def predict(self, ctx: Context, n: int = 2) -> Iterator[File]:
        for i in range(n):
            ctx.progress(i + 1, n)
            ctx.emit("preview", {"page": i})
            yield File(f"page {i}".encode(), "text/plain")
'''


class Sink:
    url_prefix = "/jobs/job_1/files/"

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def put(self, name: str, data: bytes, content_type: str) -> None:
        self.files[name] = data


@pytest.fixture
def isolated(tmp_path: Path):
    path = tmp_path / "pages_model.py"
    path.write_text(MODEL)
    model = IsolatedModel(f"{path}:Pages", {}, tmp_path)
    yield model
    model.close()


def test_the_server_validates_with_the_declaration_and_never_imports_the_model(
    isolated: IsolatedModel,
) -> None:
    """The parent gets a weightless twin from JSON; the user's module stays out."""
    assert not [m for m in sys.modules if "pages_model" in m]
    assert isolated.declaration is not None and isolated.declaration.name == "Pages"
    assert isolated.images_optional
    with pytest.raises(Exception, match=r"params\.n: must be an integer"):
        isolated.validate(InferenceRequest("r", params={"n": "x"}))
    with pytest.raises(TypeError, match="does not leave its process"):
        from mortred_twisted.sdk.adapter import SdkModel

        pickle.dumps(SdkModel(isolated.declaration, instance=object()))


def test_files_events_and_progress_cross_the_pipe(isolated: IsolatedModel) -> None:
    """Result files reach the server's sink before the result; events arrive in order."""
    import json

    ctx = RunContext()
    sink = Sink()
    ctx.result_files = sink
    events: list[tuple[str, object]] = []
    ctx.on_event = lambda name, data: events.append((name, data))
    request = isolated.validate(InferenceRequest("r", params={"n": 2}))
    data = json.loads(bytes(isolated.run(request, ctx)))
    assert [d["url"] for d in data] == [
        "/jobs/job_1/files/output-0.txt",
        "/jobs/job_1/files/output-1.txt",
    ]
    assert sink.files == {"output-0.txt": b"page 0", "output-1.txt": b"page 1"}
    assert [name for name, _ in events] == ["preview", "output", "preview", "output"]
    assert ctx.last_progress == (2, 2)
