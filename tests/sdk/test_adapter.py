"""An SDK model behind the server's Model interface: runs, files, events, batches."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import threading
from collections.abc import Iterator

import pytest

from mortred_twisted.model_api.base import InferenceRequest, RunCancelled, RunContext
from mortred_twisted.sdk import Context, File, Image, Input, ServedModel
from mortred_twisted.sdk.loading import build_sdk_model, load_served_class


class Echo(ServedModel):
    """Counts and echoes."""

    def setup(self) -> None:
        self.prefix = self.options.get("prefix", "")

    def predict(self, ctx: Context, text: str = "hi", steps: int = Input(3, ge=0, le=100)) -> dict:
        for i in range(steps):
            ctx.check_cancelled()
            ctx.progress(i + 1, steps)
        return {"text": self.prefix + text}


@dataclasses.dataclass
class Report:
    count: int
    pages: list[File]


class Pages(ServedModel):
    def predict(self, n: int = 2) -> Report:
        return Report(n, [File(f"page {i}".encode(), "text/plain") for i in range(n)])


class Frames(ServedModel):
    def predict(self, ctx: Context, n: int = 3) -> Iterator[Image]:
        for i in range(n):
            ctx.emit("preview", {"frame": i})
            yield Image.from_array([[i * 10]])


class Sink:
    url_prefix = "/jobs/job_x/files/"

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}

    def put(self, name: str, data: bytes, content_type: str) -> None:
        self.files[name] = (data, content_type)


def run(cls: type, params: dict, ctx: RunContext | None = None, options: dict | None = None):
    model = build_sdk_model(cls, options or {}, ".")
    request = model.validate(InferenceRequest("r1", params=params))
    return model.run(request, ctx or RunContext())


def test_options_reach_setup_and_progress_reaches_the_run_context() -> None:
    """setup sees the model's options; progress lands on the server's context."""
    ctx = RunContext()
    assert run(Echo, {"text": "x"}, ctx, {"prefix": ">"}) == {"text": ">x"}
    assert ctx.last_progress == (3, 3)


def test_a_cancelled_run_stops_at_its_next_check() -> None:
    """ctx.check_cancelled raises RunCancelled once the server cancelled the run."""
    ctx = RunContext()
    ctx.cancel()
    with pytest.raises(RunCancelled):
        run(Echo, {}, ctx)


def test_file_outputs_go_to_the_sink_or_inline() -> None:
    """With a sink each File is stored and described by URL; without, inlined."""
    ctx = RunContext()
    sink = Sink()
    ctx.result_files = sink
    data = run(Pages, {"n": 2}, ctx)
    assert data["count"] == 2
    assert [p["url"] for p in data["pages"]] == [
        "/jobs/job_x/files/pages-0.txt",
        "/jobs/job_x/files/pages-1.txt",
    ]
    assert sink.files["pages-1.txt"] == (b"page 1", "text/plain")
    assert data["pages"][0]["sha256"] == hashlib.sha256(b"page 0").hexdigest()
    inline = run(Pages, {"n": 1})
    assert base64.b64decode(inline["pages"][0]["base64"]) == b"page 0"


def test_a_streaming_predict_emits_each_output_and_returns_them_all() -> None:
    """Each yielded value is an output event; previews are events too."""
    events: list[tuple[str, object]] = []
    ctx = RunContext()
    ctx.on_event = lambda name, data: events.append((name, data))
    data = run(Frames, {"n": 2}, ctx)
    assert [d["name"] for d in data] == ["output-0.png", "output-1.png"]
    assert [name for name, _ in events] == ["preview", "output", "preview", "output"]
    assert events[0][1] == {"frame": 0}


def test_a_streaming_run_cancelled_between_yields_closes_the_generator() -> None:
    """Cancel between two yields stops the stream and runs its finally block."""
    closed = threading.Event()

    class Endless(ServedModel):
        def predict(self) -> Iterator[int]:
            try:
                i = 0
                while True:
                    yield i
                    i += 1
            finally:
                closed.set()

    ctx = RunContext()
    ctx.on_event = lambda name, data: ctx.cancel() if data == 2 else None
    with pytest.raises(RunCancelled):
        run(Endless, {}, ctx)
    assert closed.is_set()


class Batches(ServedModel):
    max_batch_size = 8

    def predict(self, n: int = 1) -> int:
        return n

    def predict_batch(self, ctx: Context, items: list[dict]) -> list[object]:
        return [ValueError("odd") if i["n"] % 2 else i["n"] * 10 for i in items]


def test_a_batch_item_fails_alone() -> None:
    """predict_batch's exception entries fail only their own request."""
    model = build_sdk_model(Batches, {}, ".")
    requests = [model.validate(InferenceRequest(f"r{n}", params={"n": n})) for n in (2, 3, 4)]
    out = model.run_batch(requests, [RunContext() for _ in requests])
    assert out[0] == 20 and out[2] == 40 and isinstance(out[1], ValueError)


def test_a_batch_of_the_wrong_length_fails_every_item_with_a_reason() -> None:
    """An answer that does not line up with the items is nobody's result."""

    class Short(Batches):
        def predict_batch(self, ctx: Context, items: list[dict]) -> list[object]:
            return [1]

    model = build_sdk_model(Short, {}, ".")
    requests = [model.validate(InferenceRequest(f"r{n}", params={"n": n})) for n in (1, 2)]
    out = model.run_batch(requests, [RunContext(), RunContext()])
    assert all("returned 1 entries for 2 items" in str(e) for e in out)


def test_setup_failures_and_bad_targets_are_load_errors(tmp_path) -> None:
    """setup raising, a missing file or class, a non-ServedModel: clear load errors."""
    from mortred_twisted.model_api.base import ModelLoadError

    class Broken(ServedModel):
        def setup(self) -> None:
            raise OSError("weights.bin missing")

        def predict(self) -> int:
            return 1

    with pytest.raises(ModelLoadError, match=r"setup\(\) failed: OSError: weights\.bin missing"):
        build_sdk_model(Broken, {}, ".")
    with pytest.raises(ModelLoadError, match="file not found"):
        load_served_class(f"{tmp_path}/nope.py:M")
    (tmp_path / "m.py").write_text("class M: pass\nimport sys\n")
    with pytest.raises(ModelLoadError, match=r"not a mortred_twisted\.sdk\.ServedModel"):
        load_served_class(f"{tmp_path}/m.py:M")
    with pytest.raises(ModelLoadError, match="has no 'Z'"):
        load_served_class(f"{tmp_path}/m.py:Z")
    (tmp_path / "s.py").write_text("def broken(:\n")
    with pytest.raises(ModelLoadError, match="SyntaxError"):
        load_served_class(f"{tmp_path}/s.py:M")
    with pytest.raises(ModelLoadError, match="unknown model type 'NOPE'"):
        load_served_class("NOPE")


def test_an_entry_point_named_like_a_built_in_is_refused(monkeypatch) -> None:
    """A package registering 'DDPM' cannot shadow the built-in type."""
    import importlib.metadata

    from mortred_twisted.model_api.base import ModelLoadError
    from mortred_twisted.sdk import loading

    ep = importlib.metadata.EntryPoint("DDPM", "x.y:Z", loading.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep])
    with pytest.raises(ModelLoadError, match="is a built-in type"):
        loading.resolve_target("DDPM")
    other = importlib.metadata.EntryPoint("SHARP", "pkg.mod:Sharp", loading.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [other])
    assert loading.resolve_target("SHARP") == "pkg.mod:Sharp"


def test_a_senders_file_name_lends_only_a_plain_extension_to_the_temporary_path() -> None:
    """File.path keeps a .png suffix, never a NUL, a slash or a long tail from the name."""
    import os

    from mortred_twisted.sdk import File

    assert File(b"x", name="cat.png").path.endswith(".png")
    for hostile in ("a.p\x00ng", "x/../../etc.sh/", "a." + "b" * 50, "../.."):
        path = File(b"x", name=hostile).path
        assert os.path.dirname(path) == os.path.dirname(File(b"y").path)
        assert "\x00" not in path and not path.endswith("/")


def test_an_output_that_is_not_json_fails_the_run_naming_where() -> None:
    """NaN, infinity and objects that are not JSON are the model's error, named."""
    from mortred_twisted.sdk.outputs import OutputEncoder

    encoder = OutputEncoder(None)
    with pytest.raises(ValueError, match="output score: nan is not a JSON number"):
        encoder.encode({"score": float("nan")})
    with pytest.raises(TypeError, match="output output-1: object is not a JSON value"):
        encoder.encode([1, object()])
