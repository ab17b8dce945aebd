"""ModelTestCase under trial: harness runs, validation, the in-memory server and the
conformance check, each a Deferred."""

from __future__ import annotations

from mortred_twisted.model_api.base import InvalidRequest, RunCancelled
from mortred_twisted.testing.conformance import ConformanceError, tiny_png
from mortred_twisted.testing.harness import RunResult
from mortred_twisted.testing.trial import ModelTestCase
from tests.testing import models

PNG = tiny_png()


class HarnessTests(ModelTestCase):
    model = "tests.testing.models:Inverts"
    options = {"scale": 2.0}

    async def test_a_run_fires_with_its_result(self) -> None:
        """run_model runs predict off the reactor thread and fires with the result."""
        result = await self.run_model(image=PNG, steps=2)
        self.assertIsInstance(result, RunResult)
        self.assertEqual(result.progress, [(1, 2), (2, 2)])
        self.assertEqual(result.events, [("preview", {"step": 1, "amount": 2.0})])
        self.assertIn("output.png", result.files)

    def test_validation_fails_with_the_422_message(self) -> None:
        """validate's Deferred fails with the server's InvalidRequest."""
        d = self.assertFailure(self.validate(image=PNG, amount=9), InvalidRequest)
        d.addCallback(lambda exc: self.assertEqual(exc.field, "params.amount"))
        return d

    def test_cancel_at_a_step_fails_with_run_cancelled(self) -> None:
        """The cancelled run's Deferred fails with RunCancelled after step 1."""
        d = self.assertFailure(self.run_model(image=PNG, steps=5, cancel_at_step=1), RunCancelled)
        d.addCallback(lambda exc: self.assertEqual(exc.run.progress, [(1, 5)]))
        return d

    async def test_the_in_memory_server_answers_through_the_real_routes(self) -> None:
        """submit, wait and result, each a Deferred."""
        server = self.serve()
        answer = await server.submit(image=PNG, steps=1)
        self.assertEqual(answer.code, 202)
        status = await server.wait(answer.json()["job_id"])
        self.assertEqual(status["state"], "done")
        doc = await server.result(answer.json()["job_id"])
        self.assertEqual(doc["data"]["content_type"], "image/png")

    async def test_the_conformance_check_passes(self) -> None:
        """The contract holds for the model under test."""
        report = await self.check_conformance(isolated=False)
        self.assertTrue(report.ok, str(report))

    def test_a_broken_model_fails_the_conformance_check(self) -> None:
        """A model that ignores cancel fails with the problem listed."""
        d = self.check_conformance(models.IgnoresCancel, isolated=False, options=None)
        return self.assertFailure(d, ConformanceError)


class BatchTests(ModelTestCase):
    model = models.Batches

    async def test_a_batch_fires_with_one_result_per_item(self) -> None:
        """Per-item outputs and errors, through predict_batch."""
        results = await self.run_batch([{"x": 1}, {"x": 13}])
        self.assertEqual([r.output for r in results], [2, None])
        self.assertIsInstance(results[1].error, ValueError)


class OtherTargetTests(ModelTestCase):
    model = models.Inverts

    def test_a_harness_of_another_target_with_options(self) -> None:
        """harness(target, options={...}) is made once per test and reused."""
        first = self.harness(models.Inverts, options={"scale": 3.0})
        self.assertIs(self.harness(models.Inverts, options={"scale": 3.0}), first)
        self.assertEqual(first.options, {"scale": 3.0})
        self.assertIsNot(self.harness(), first)
