"""conformance.check: the model contract, checked on any declaration."""

from __future__ import annotations

import pytest

from mortred_twisted.sdk import Context, Input, ServedModel, declare
from mortred_twisted.testing import conformance
from mortred_twisted.testing.conformance import ConformanceError, sample_inputs
from tests.testing import models


def names(report: conformance.ConformanceReport, ok: bool | None) -> list[str]:
    return [c.name for c in report.checks if c.ok is ok]


def test_a_model_that_keeps_the_contract_passes_every_check() -> None:
    """Validation without setup, no torch, monotone progress, cancel, batch: all ok."""
    report = conformance.check("tests.testing.models:Inverts")
    assert report.ok, str(report)
    assert names(report, True) == [
        "declaration", "validation", "validation-imports", "run", "progress", "output",
        "cancel", "batch",
    ]  # fmt: skip
    assert "items equal single runs" in report.checks[-1].detail


def test_a_model_that_ignores_cancel_is_reported() -> None:
    """It goes on to the end after the cancel: the problem says so."""
    with pytest.raises(ConformanceError) as failed:
        conformance.check(models.IgnoresCancel, isolated=False)
    assert failed.value.report.problems == [
        "cancel: cancelled at step 1, predict went on to the end (5 steps)"
    ]


def test_progress_that_goes_back_and_a_lying_output_are_listed_together() -> None:
    """Every problem is listed in one error."""
    report = conformance.check(models.ProgressGoesBack, isolated=False, raise_on_problem=False)
    assert report.problems == [
        "progress: progress went back: [(2, 4), (1, 4)]",
        "cancel: cancelled at step 2, predict went on to the end (2 steps)",
    ]
    report = conformance.check(models.LiesAboutItsOutput, isolated=False, raise_on_problem=False)
    assert [p.split(":")[0] for p in report.problems] == ["output", "batch"]
    assert "declared image, got 'x'" in report.problems[0]


def test_streams_dataclasses_and_batches_pass() -> None:
    """A streaming model, a dataclass output and predict_batch keep the contract."""
    for model in (models.Frames, models.Structured, models.Batches, models.TakesFiles):
        report = conformance.check(model, isolated=False)
        assert report.ok, str(report)
    assert conformance.check(models.Batches, isolated=False).checks[-1].ok


def test_an_undeclarable_model_and_a_failing_setup_are_problems() -> None:
    """A bad declaration stops the check; a setup error is a problem of its own."""

    class Bad(ServedModel):
        def predict(self, x: int = Input(20, le=10)) -> int:
            return x

    report = conformance.check(Bad, isolated=False, raise_on_problem=False)
    assert report.problems == [
        "declaration: model Bad.predict(x): default 20: must be <= 10 (got 20)"
    ]
    report = conformance.check(models.SetupFails, isolated=False, raise_on_problem=False)
    assert [p.split(":")[0] for p in report.problems] == ["setup"]


def test_sample_inputs_satisfy_the_declaration() -> None:
    """Required inputs get values within their bounds and choices."""

    class Needs(ServedModel):
        def predict(self, a: int = Input(ge=3), b: str = Input(choices=["x", "y"]),
                    c: float = Input(le=-2.0), d: str = Input(min_length=4)) -> int:  # fmt: skip
            return a

    assert sample_inputs(declare(Needs)) == {"a": 3, "b": "x", "c": -2.0, "d": "aaaa"}


def test_a_validation_that_imports_torch_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """In a fresh interpreter, a model whose validation pulls torch in fails the check
    (a stand-in module named torch, put there by validation, in that interpreter only)."""
    (tmp_path / "heavy.py").write_text(
        "import sys\n"
        "from mortred_twisted.sdk import ServedModel, Input\n"
        "class Heavy(ServedModel):\n"
        "    def predict(self, x: int = Input(1)) -> int:\n"
        "        return x\n"
        "class Imports(ServedModel):\n"
        "    def predict(self, x: int = Input(1)) -> int:\n"
        "        return x\n"
        "import mortred_twisted.sdk.validation as v\n"
        "_real = v.validate_inputs\n"
        "def _heavy(*a, **k):\n"
        "    import types; sys.modules.setdefault('torch', types.ModuleType('torch'))\n"
        "    return _real(*a, **k)\n"
        "if sys.argv[0] == '-c':  # only in the check's fresh interpreter\n"
        "    v.validate_inputs = _heavy\n"
        "    import mortred_twisted.sdk.adapter as ad; ad.validate_inputs = _heavy\n"
    )
    report = conformance.check(str(tmp_path / "heavy.py") + ":Heavy", raise_on_problem=False)
    assert report.problems == ["validation-imports: validating imported torch"]


def test_a_model_that_reports_step_zero_first_is_cancelled_after_a_real_step() -> None:
    """progress(0, n) at the start is no step done: the cancel comes after step 1."""

    class StartsAtZero(ServedModel):
        def predict(self, ctx: Context, n: int = Input(3, ge=1)) -> int:
            ctx.progress(0, n)
            for i in range(n):
                ctx.check_cancelled()
                ctx.progress(i + 1, n)
            return n

    report = conformance.check(StartsAtZero, raise_on_problem=False)
    assert report.ok, str(report)
    assert [c.detail for c in report.checks if c.name == "cancel"] == ["stopped after step 1 of 3"]


def test_a_class_that_cannot_be_imported_by_name_skips_the_fresh_interpreter_check() -> None:
    """A test's local class: the import check says why it did not run."""

    class Local(ServedModel):
        def predict(self, x: int = Input(1)) -> int:
            return x

    report = conformance.check(Local)
    skipped = [c for c in report.checks if c.name == "validation-imports"]
    assert skipped[0].ok is None and "cannot be imported by name" in skipped[0].detail


def test_the_fresh_interpreter_gets_large_inputs_and_the_options() -> None:
    """A 300 kB input (more than one command-line argument may hold) and the model's
    options reach the fresh interpreter's validation."""
    report = conformance.check(
        "tests.testing.models:TakesFiles",
        inputs={"files": [b"x" * 300_000]},
        options={"max_pixels": 64},
    )
    assert report.ok, str(report)
    assert report.checks[2].name == "validation-imports" and report.checks[2].ok
