"""The contract every served model keeps, checked on one declaration.

:func:`check` loads a target (a class, ``module:Class`` or ``file.py:Class``) with a
:class:`~mortred_twisted.testing.harness.ModelHarness` and checks, in order:

* ``declaration``: the SDK can serve it (else nothing else is checked);
* ``validation``: sample inputs (yours, or made from the declaration: defaults, the
  lower bound or first choice of a required input, a small PNG for an image) pass
  the server's validation without ``setup`` running; an unknown key and a missing
  required input are refused naming ``params.<input>``;
* ``validation-imports``: (``isolated=True``) in a fresh interpreter, validating
  imports no torch beyond what importing your module did (a module that imports
  torch itself is noted, not failed: a process-isolated server never imports it);
* ``run``: one run succeeds; ``progress``: every ``(step, total)`` is monotone
  (the fraction done never goes back); ``output``: the output has the declared kind
  (files described, their bytes captured and matching size and sha256; a streaming
  model's ``output`` events are its result's items);
* ``cancel``: cancelled after its first progress report, the run ends with
  ``RunCancelled`` raised by ``predict`` within one more step (not checked, and
  said so, for a model that reports fewer than two steps);
* ``batch``: a batch of three answers three results, each of the declared kind, an
  invalid item fails alone, and (for a model whose output does not vary between two
  runs) each item's output equals the same input's single run: exactly in its keys,
  lengths, strings, integers and booleans, and within float noise in its floats
  (:mod:`~mortred_twisted.testing.closeness`: a batch runs other kernels than one
  item, and which ones depends on the CPU).

:func:`check` returns a :class:`ConformanceReport`; with ``raise_on_problem`` (the
default) it raises :class:`ConformanceError` listing every problem at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import InvalidRequest, ModelLoadError
from mortred_twisted.sdk.declaration import Declaration
from mortred_twisted.testing.closeness import json_close
from mortred_twisted.testing.harness import ModelHarness, RunResult, Target, target_name
from mortred_twisted.testing.output_checks import monotone, output_problems, result_problems
from mortred_twisted.testing.samples import sample_inputs, tiny_png


@dataclass(frozen=True)
class Check:
    """One check: ``ok`` True (passed), False (a problem) or None (not applicable)."""

    name: str
    ok: bool | None
    detail: str = ""


@dataclass
class ConformanceReport:
    """What :func:`check` found (``problems``: the failed checks' lines)."""

    target: str
    declaration: Declaration | None = None
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool | None, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, detail))
        return bool(ok)

    @property
    def problems(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.ok is False]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ok": self.ok,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }

    def __str__(self) -> str:
        marks = {True: "ok  ", False: "FAIL", None: "skip"}
        lines = [f"conformance of {self.target}: {'ok' if self.ok else 'FAILED'}"]
        lines += [f"  {marks[c.ok]} {c.name}" + (f": {c.detail}" if c.detail else "")
                  for c in self.checks]  # fmt: skip
        return "\n".join(lines)


class ConformanceError(AssertionError):
    """A declaration that breaks the contract; ``report`` has every check."""

    def __init__(self, report: ConformanceReport) -> None:
        listed = "\n".join(f"  - {p}" for p in report.problems)
        super().__init__(f"{report.target} breaks the model contract:\n{listed}")
        self.report = report


# -- the isolated validation check ------------------------------------------------------

_PROBE = r"""
import json, sys
job = json.loads(sys.stdin.read())
from mortred_twisted.testing.harness import ModelHarness
h = ModelHarness(job["target"], job["options"], base=job["base"])
after_import = "torch" in sys.modules
h.validate(job["params"])
print(json.dumps({"after_import": after_import, "after_validate": "torch" in sys.modules,
                  "setups": h.setups}))
"""


def _probe_imports(
    target: str, base: str | None, sample: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate ``sample`` in a fresh interpreter (the job on its stdin: inputs may
    be larger than a command-line argument may be); what it imported."""
    from mortred_twisted.testing.server import json_value

    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, os.getcwd(), env.get("PYTHONPATH", "")) if p
    )
    job = {"target": target, "base": base, "params": json_value(dict(sample)),
           "options": dict(options)}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the check ---------------------------------------------------------------------------


def check(
    target: Target,
    inputs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    base: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] | None = None,
    isolated: bool = True,
    raise_on_problem: bool = True,
) -> ConformanceReport:
    """See the module docstring. ``inputs``: the inputs to run with (default: made
    from the declaration); ``options``: the model's options; ``isolated``: also
    check in a fresh interpreter that validation imports no torch (a class target
    must then be importable by name)."""
    report = ConformanceReport(target_name(target))
    try:
        harness = ModelHarness(target, options, base=base, root=root)
    except ModelLoadError as exc:
        report.add("declaration", False, str(exc))
        return _finish(report, raise_on_problem)
    declaration = report.declaration = harness.declaration
    report.add(
        "declaration", True, f"{len(declaration.inputs)} input(s), output {declaration.output.kind}"
    )
    sample = dict(inputs) if inputs is not None else sample_inputs(declaration)
    try:
        _check_validation(report, harness, sample)
        if isolated:
            _check_imports(report, target, base, sample, dict(options or {}))
        with harness:
            _check_runs(report, harness, sample)
    except ModelLoadError as exc:
        report.add("setup", False, str(exc))
    return _finish(report, raise_on_problem)


def _finish(report: ConformanceReport, raise_on_problem: bool) -> ConformanceReport:
    if raise_on_problem and not report.ok:
        raise ConformanceError(report)
    return report


def _check_validation(
    report: ConformanceReport, harness: ModelHarness, sample: dict[str, Any]
) -> None:
    declaration = harness.declaration
    try:
        harness.validate(sample)
    except Exception as exc:
        report.add(
            "validation",
            False,
            f"the sample inputs {sorted(sample)} are refused: {exc} (give inputs=)",
        )
        return
    if harness.setups:
        report.add("validation", False, "validating ran setup()")
        return
    wrong: list[str] = []
    seed = declaration.contract == "mortred-v1"
    bogus = "no_such_input_" + "x" * 3
    try:
        harness.validate({**sample, bogus: 1})
        wrong.append(f"an unknown input {bogus!r} was accepted")
    except InvalidRequest as exc:
        if exc.field != f"params.{bogus}":
            wrong.append(f"an unknown input was refused as {exc.field!r}")
    for decl in declaration.inputs:
        if not decl.required:
            continue
        try:
            harness.validate({k: v for k, v in sample.items() if k != decl.name})
            wrong.append(f"the required input {decl.name!r} was not required")
        except InvalidRequest as exc:
            # the seed envelope names its pictures "images" (T1-T16), not params.<input>
            expected = "images" if seed and decl.binary else f"params.{decl.name}"
            if exc.field != expected:
                wrong.append(f"a missing {decl.name!r} was refused as {exc.field!r}")
    detail = "; ".join(wrong) or "sample inputs pass without setup(); 422s name params.<input>"
    report.add("validation", not wrong, detail)


def _check_imports(
    report: ConformanceReport,
    target: Target,
    base: Any,
    sample: dict[str, Any],
    options: Mapping[str, Any],
) -> None:
    name = target_name(target)
    if isinstance(target, type) and (
        target.__module__ == "__main__" or "<locals>" in target.__qualname__
    ):
        report.add("validation-imports", None, f"not checked: {name} cannot be imported by name")
        return
    try:
        found = _probe_imports(name, str(base) if base is not None else None, sample, options)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        report.add("validation-imports", False, f"validating in a fresh interpreter failed: {exc}")
        return
    if found["after_validate"] and not found["after_import"]:
        report.add("validation-imports", False, "validating imported torch")
    elif found["after_import"]:
        report.add(
            "validation-imports",
            True,
            "validation imports nothing; the module itself imports torch",
        )
    else:
        report.add("validation-imports", True, "no torch imported")


def _check_runs(report: ConformanceReport, harness: ModelHarness, sample: dict[str, Any]) -> None:
    declaration = harness.declaration
    harness.model  # noqa: B018 - set up now: a setup error is a problem of its own
    first = harness.attempt(**sample)
    if not report.add(
        "run",
        first.ok,
        f"{type(first.error).__name__}: {first.error}"
        if first.error
        else f"{len(first.progress)} progress report(s), {len(first.files)} file(s), "
        f"{len(first.events)} event(s)",
    ):
        return
    went_back = monotone(first.progress)
    report.add(
        "progress",
        went_back is None,
        went_back or f"{first.progress[-1] if first.progress else 'none reported'}",
    )
    problems = result_problems(declaration, first)
    report.add("output", not problems, "; ".join(problems) or f"matches {_describe(declaration)}")
    _check_cancel(report, harness, sample, first)
    _check_batch(report, harness, sample, first)


def _describe(declaration: Declaration) -> str:
    out = declaration.output
    kind = f"list[{out.kind}]" if out.is_list else out.kind
    return f"stream of {kind}" if declaration.streams else kind


def _check_cancel(
    report: ConformanceReport, harness: ModelHarness, sample: dict[str, Any], first: RunResult
) -> None:
    steps = [step for step, _total in first.progress if step > 0]
    if len(steps) < 2:
        report.add("cancel", None, "not checked: predict reports fewer than two progress steps")
        return
    at = steps[0]  # cancelled once the first step is done: work remains
    run = harness.attempt(cancel_at_step=at, **sample)
    if not run.cancelled:
        report.add(
            "cancel",
            False,
            f"cancelled at step {at}, the run ended {'done' if run.ok else run.error!r}",
        )
    elif run.returned_after_cancel:
        report.add(
            "cancel",
            False,
            f"cancelled at step {at}, predict went on to the end ({len(run.progress)} steps)",
        )
    elif run.progress_after_cancel > 1:
        report.add(
            "cancel",
            False,
            f"cancelled at step {at}, predict reported {run.progress_after_cancel} more "
            "steps before stopping",
        )
    else:
        step, total = run.progress[-1]
        report.add("cancel", True, f"stopped after step {step} of {total}")


def _without_urls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_urls(v) for k, v in value.items() if k != "url"}
    if isinstance(value, list):
        return [_without_urls(v) for v in value]
    return value


def _comparable(result: RunResult) -> Any:
    """The output without its file URLs (each batch item is its own job), as plain
    JSON values with sorted keys."""
    return json.loads(json.dumps(_without_urls(result.output), sort_keys=True))


def _same(a: RunResult, b: RunResult) -> bool:
    """Equal outputs up to float noise (``closeness.json_close``): a batch runs other
    kernels than a single item, so unrounded floats may differ in their last bits."""
    return json_close(_comparable(a), _comparable(b)) is None


def _check_batch(
    report: ConformanceReport, harness: ModelHarness, sample: dict[str, Any], first: RunResult
) -> None:
    declaration = harness.declaration
    results = harness.run_batch([sample, sample, sample])
    problems = []
    if len(results) != 3:
        problems.append(f"a batch of 3 answered {len(results)} results")
    for i, result in enumerate(results):
        if not result.ok:
            problems.append(f"item {i} failed: {type(result.error).__name__}: {result.error}")
        else:
            problems += [f"item {i}: {p}" for p in result_problems(declaration, result)]
    mixed = harness.run_batch([sample, {**sample, "no_such_input_xxx": 1}, sample])
    if mixed[1].ok or not (mixed[0].ok and mixed[2].ok):
        problems.append(
            "an invalid item did not fail alone: "
            + ", ".join("ok" if r.ok else type(r.error).__name__ for r in mixed)
        )
    again = harness.attempt(**sample)
    deterministic = again.ok and _same(again, first)
    if deterministic and all(r.ok for r in results):
        differs = [i for i, r in enumerate(results) if not _same(r, first)]
        if differs:
            problems.append(f"items {differs} differ from the same input run alone")
    detail = "; ".join(problems) or (
        "3 items, 3 results; an invalid item fails alone"
        + (
            "; items equal single runs"
            if deterministic
            else "; output varies between runs (not compared)"
        )
    )
    report.add("batch", not problems, detail)


__all__ = [
    "Check",
    "ConformanceError",
    "ConformanceReport",
    "check",
    "output_problems",
    "sample_inputs",
    "tiny_png",
]
