"""``mortredctl model …``: write, check and run a served model without a server.

* ``mortredctl model new NAME [DIR] [--catalog PATH]`` writes a working model
  folder: ``<name>.py`` (a :class:`~mortred_twisted.sdk.ServedModel` with progress
  and cancel), ``server.toml`` naming it by file path, with an id, a port and a
  ``server_uri`` no other server file of its catalog uses (and a port nothing
  listens on: :mod:`~mortred_twisted.cli.catalog_room`), and ``test_<name>.py`` (the
  harness and the conformance check; it passes as written). Existing files are
  never overwritten.
* ``mortredctl model check TARGET`` prints the derived schema (JSON: inputs, output,
  streaming) and runs :func:`~mortred_twisted.testing.conformance.check`; exit 1
  when the contract is broken.
* ``mortredctl model run TARGET -i amount=2 -i image=@cat.png -o out/`` runs it once
  in process (:class:`~mortred_twisted.testing.ModelHarness`): the output's JSON on
  stdout, result files written to ``-o``.

``TARGET`` is ``package.module:Class``, ``path/to/file.py:Class`` or a server TOML
(its ``[model]`` type and options). ``-i NAME=VALUE`` gives an input
(``NAME=@FILE`` a file's bytes; see :func:`~mortred_twisted.testing.harness.
inputs_from_pairs`), ``--option KEY=VALUE`` a model option (JSON values, else text).

:func:`submit_with_inputs` is ``mortredctl jobs submit -i …``: inputs by name in
``params`` (files base64-encoded), no ``images`` unless ``--image`` is given.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
from pathlib import Path
from typing import Any, TextIO

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class ModelUsageError(ValueError):
    """A command line that cannot be acted on (exit 2)."""


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ModelUsageError(f"--option {pair!r}: give KEY=VALUE")
        out[key.strip()] = _value(text)
    return out


def _harness(args: argparse.Namespace) -> Any:
    """The harness of ``args.target`` (a class path, a file or a server TOML)."""
    from mortred_twisted.testing import ModelHarness

    target = args.target
    options = _options(args.option)
    if target.endswith(".toml"):
        from mortred_twisted.config.server import load_server_config

        config = load_server_config(target, env={})
        return ModelHarness(
            config.model_type, {**config.model_options, **options}, root=config.root
        )
    return ModelHarness(target, options)


def schema_of(declaration: Any) -> dict[str, Any]:
    """A declaration as the JSON ``model check`` prints."""
    return {
        "name": declaration.name,
        "description": declaration.description,
        "inputs": declaration.inputs_schema(),
        "output": declaration.output_schema or declaration.output.json_schema(),
        "streams": declaration.streams,
        "max_batch_size": declaration.max_batch_size,
        "contract": declaration.contract,
    }


def _print(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def _fail(message: str, err: TextIO) -> int:
    err.write(f"mortredctl: {message}\n")
    return EXIT_FAILED


def cmd_model_check(args: argparse.Namespace, out: TextIO) -> int:
    import sys

    from mortred_twisted.model_api.base import ModelLoadError
    from mortred_twisted.testing import conformance
    from mortred_twisted.testing.harness import inputs_from_pairs

    try:
        harness = _harness(args)
    except ModelLoadError as exc:
        return _fail(str(exc), sys.stderr)
    inputs = inputs_from_pairs(harness.declaration, args.input) if args.input else None
    report = conformance.check(
        harness.target if args.target.endswith(".toml") else args.target,
        inputs,
        harness.options,
        root=harness.root,
        isolated=not args.no_isolated,
        raise_on_problem=False,
    )
    if args.json:
        _print({"schema": schema_of(harness.declaration), "conformance": report.to_json()}, out)
    else:
        _print(schema_of(harness.declaration), out)
        out.write(str(report) + "\n")
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_model_run(args: argparse.Namespace, out: TextIO) -> int:
    import sys

    from mortred_twisted.model_api.base import InputDecodeError, InvalidRequest, ModelError
    from mortred_twisted.testing.harness import inputs_from_pairs

    try:
        harness = _harness(args)
        inputs = inputs_from_pairs(harness.declaration, args.input)
        result = harness.attempt(cancel_at_step=args.cancel_at_step, **inputs)
    except ModelError as exc:
        return _fail(str(exc), sys.stderr)
    with harness:
        if result.error is not None:
            error = result.error
            if isinstance(error, InputDecodeError):  # the server's 400 (before InvalidRequest:
                return _fail(f"invalid input: {error}", sys.stderr)  # UnreadableImage is both)
            if isinstance(error, InvalidRequest):  # the server's 422 message
                return _fail(f"invalid request: {error}", sys.stderr)
            return _fail(f"{type(error).__name__}: {error}", sys.stderr)
        if args.output:
            folder = Path(args.output)
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in result.files.items():
                (folder / name).write_bytes(data)
        elif result.files:
            sys.stderr.write(
                f"mortredctl: {len(result.files)} result file(s); -o DIR writes them\n"
            )
        if args.events:
            for name, data in result.events:
                sys.stderr.write(f"event {name}: {json.dumps(data)}\n")
        _print(result.output, out)
    return EXIT_OK


# -- model new ----------------------------------------------------------------------------

_MODEL = '''"""{title}: a model served with mortred-twisted (docs/models/your-own.md)."""

from __future__ import annotations

from mortred_twisted.sdk import Context, Input, ServedModel


class {cls}(ServedModel):
    """Counts to ``steps``, then says hello (replace with your model)."""

    def setup(self) -> None:
        # Load weights here (once per worker, off the reactor thread); the [model]
        # options of server.toml are in self.options, relative paths via self.path().
        self.greeting = str(self.options.get("greeting", "hello"))

    def predict(
        self,
        ctx: Context,
        name: str = Input("world", max_length=100, description="who to greet"),
        steps: int = Input(5, ge=1, le=1000, description="work steps (progress per step)"),
    ) -> dict:
        for i in range(steps):
            ctx.check_cancelled()  # a cancelled job stops here
            ctx.progress(i + 1, steps)
        return {{"message": f"{{self.greeting}}, {{name}}", "steps": steps}}
'''

_SERVER = """# {cls} as a model server: make run-model RUN_CONFIG={folder}/server.toml
[server]
id = "{id}"
host = "127.0.0.1"
port = {port}                      # ids, ports and server_uris are unique in a catalog:
server_uri = "{uri}"  # these were free in it when written
worker_nums = 1
async_enabled = true

[model]
type = "{module}.py:{cls}"       # relative to this file
greeting = "hello"
"""

_TEST = '''"""{cls}'s tests: the harness in process and the model contract."""

from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InvalidRequest, RunCancelled
from mortred_twisted.testing import MemoryServer, ModelHarness, conformance

HERE = Path(__file__).resolve().parent
TARGET = f"{{HERE / '{module}.py'}}:{cls}"


def test_it_greets_with_progress() -> None:
    result = ModelHarness(TARGET, {{"greeting": "hi"}}).run(name="Ada", steps=3)
    assert result.output == {{"message": "hi, Ada", "steps": 3}}
    assert result.progress == [(1, 3), (2, 3), (3, 3)]


def test_a_cancel_stops_it() -> None:
    with pytest.raises(RunCancelled):
        ModelHarness(TARGET).run(steps=10, cancel_at_step=2)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InvalidRequest) as bad:
        ModelHarness(TARGET).validate(steps=0)
    assert bad.value.field == "params.steps"


def test_it_keeps_the_model_contract() -> None:
    conformance.check(TARGET)


def test_its_server_file_serves_it() -> None:
    with MemoryServer.from_config(HERE / "server.toml") as server:
        assert server.run(name="Bob")["data"]["message"] == "hello, Bob"
'''


def _names(name: str) -> tuple[str, str]:
    """``my-model`` → (``my_model``, ``MyModel``)."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    if not words or not words[0][0].isalpha():
        raise ModelUsageError(f"model name {name!r}: start with a letter (e.g. sharpen)")
    module = "_".join(w.lower() for w in words)
    cls = "".join(w[:1].upper() + w[1:] for w in words)
    return module, cls


def cmd_model_new(args: argparse.Namespace, out: TextIO) -> int:
    from mortred_twisted.cli import catalog_room

    module, cls = _names(args.name)
    folder = Path(args.dir or module)
    catalog = Path(args.catalog) if args.catalog else None
    if catalog is not None and not catalog.exists():
        raise ModelUsageError(f"--catalog {catalog}: no such file or folder")
    taken = catalog_room.taken_by(catalog, folder)
    try:
        port = catalog_room.pick_port(taken)
    except catalog_room.NoRoom as exc:
        raise ModelUsageError(str(exc)) from None
    server_id, uri = catalog_room.pick_id(module, taken), catalog_room.pick_uri(module, taken)
    files = {
        folder / f"{module}.py": _MODEL.format(title=cls, cls=cls),
        folder / "server.toml": _SERVER.format(
            cls=cls,
            module=module,
            folder=str(folder).replace("\n", " "),  # a TOML comment stays one line
            id=server_id,
            port=port,
            uri=uri,
        ),
        folder / f"test_{module}.py": _TEST.format(cls=cls, module=module),
    }
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise ModelUsageError(f"not overwriting {', '.join(existing)}")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
        out.write(f"wrote {path}\n")
    out.write(
        f"id {server_id}, port {port}, server_uri {uri}: used by none of "
        f"{taken.where}, and nothing listens on the port\n"
    )
    out.write(
        f"next: .venv/bin/python -m pytest {folder}; "
        f"mortredctl model run {folder}/{module}.py:{cls} -i name=you\n"
    )
    return EXIT_OK


# -- registration and jobs submit -i -------------------------------------------------------


def _guarded(fn: Any) -> Any:
    def run(args: argparse.Namespace, out: TextIO) -> int:
        import sys

        from mortred_twisted.config.errors import ConfigErrors

        try:
            return fn(args, out)
        except ModelUsageError as exc:
            sys.stderr.write(f"mortredctl: {exc}\n")
            return EXIT_USAGE
        except ConfigErrors as exc:
            sys.stderr.write(f"mortredctl: {exc}\n")
            return EXIT_USAGE

    return run


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add ``model new|check|run`` to mortredctl's sub-commands."""
    model = sub.add_parser("model", help="write, check and run a served model in process")
    cmds = model.add_subparsers(dest="model_command", required=True, parser_class=parser_class)
    new = cmds.add_parser("new", help="write a working model folder (model, server.toml, test)")
    new.add_argument("name", help="the model's name, e.g. sharpen")
    new.add_argument("dir", nargs="?", help="the folder (default: the name)")
    new.add_argument(
        "--catalog", metavar="PATH",
        help="the catalog it joins, for a free port and its own id and server_uri: a "
        "mortred.toml (its catalog_dir) or a folder of server files (default: the "
        "server files beside the new folder)",
    )  # fmt: skip
    new.set_defaults(fn=_guarded(cmd_model_new))

    def target_args(a: argparse.ArgumentParser) -> None:
        a.add_argument("target", help="pkg.module:Class, path/file.py:Class or a server TOML")
        a.add_argument("-i", "--input", action="append", default=[], metavar="NAME=VALUE",
                       help="an input (NAME=@FILE: a file); repeat a name for a list")  # fmt: skip
        a.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a [model] option (JSON value, else text)")  # fmt: skip

    check = cmds.add_parser("check", help="print the derived schema and run the conformance check")
    target_args(check)
    check.add_argument(
        "--no-isolated", action="store_true",
        help="skip the fresh-interpreter check that validation imports no torch",
    )  # fmt: skip
    check.set_defaults(fn=_guarded(cmd_model_check))
    run = cmds.add_parser("run", help="run the model once in process")
    target_args(run)
    run.add_argument("-o", "--output", metavar="DIR", help="write the result files here")
    run.add_argument("--cancel-at-step", type=int, help="cancel once it reports this step")
    run.add_argument("--events", action="store_true", help="print its events on stderr")
    run.set_defaults(fn=_guarded(cmd_model_run))


def input_params(pairs: list[str]) -> dict[str, Any]:
    """``-i`` pairs as JSON ``params``: ``NAME=@FILE`` base64, else JSON or text; a
    repeated name makes a list."""
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ModelUsageError(f"-i {pair!r}: give NAME=VALUE (or NAME=@FILE)")
        if text.startswith("@"):
            value: Any = base64.b64encode(Path(text[1:]).expanduser().read_bytes()).decode()
        else:
            value = _value(text)
        if name in params:
            previous = params[name]
            params[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            params[name] = value
    return params


def submit_with_inputs(client: Any, args: argparse.Namespace) -> Any:
    """``jobs submit -i …``: a job whose inputs go by name (see the module docstring);
    returns the client's ``Job``."""
    from mortred_client import Job
    from mortred_client.images import encode_images
    from mortred_client.protocol import envelope, new_idempotency_key

    params: dict[str, Any] = {}
    if args.params:
        loaded = json.loads(args.params)
        if not isinstance(loaded, dict):
            raise ModelUsageError("--params must be a JSON object")
        params.update(loaded)
    params.update(input_params(args.inputs))
    images = encode_images([Path(args.image)]) if args.image else []
    doc = envelope(
        images, params, req_id=args.req_id, webhook=args.webhook,
        webhook_events=args.webhook_events.split(",") if args.webhook_events else None,
    )  # fmt: skip
    if not images:
        doc.pop("images", None)  # older clients send an empty list
    key = args.idempotency_key or new_idempotency_key()
    submitted = client.api.read_submitted(client.call(client.api.submit(doc, key)))
    return Job(client, submitted.status, replayed=submitted.replayed)
