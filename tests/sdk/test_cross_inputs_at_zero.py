"""``renamed_inputs`` and ``only_when`` at the gateway's admission at zero replicas
(issue 36 item 3), against a real redis-server: the published twin admits under an
old name, refuses a conditional input whose condition is false, stores no default
for it, and answers every bad submit with the loaded model's status and bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest_twisted

from mortred_twisted.gateway.routing import RouteKind
from mortred_twisted.runtime.validation_twin import twin_document
from mortred_twisted.sdk.loading import build_sdk_model
from tests.gateway.test_admission import Rig, redis  # noqa: F401 (the redis fixture)
from tests.sdk.test_cross_inputs import Sampler, png
from tests.support.redis_server import RedisServer

SAMPLER = "tests.sdk.test_cross_inputs:Sampler"


def body(**params: object) -> bytes:
    return json.dumps({"params": params}).encode()


@pytest_twisted.ensureDeferred
async def test_the_twin_admits_at_zero_as_the_loaded_model_would(
    redis: RedisServer,  # noqa: F811
) -> None:
    loaded = build_sdk_model(Sampler, {}, Path("."))
    rig = Rig(redis, SAMPLER)
    await rig.start(twin_document(loaded, rig.config))
    try:
        answer = await rig.call(RouteKind.SUBMIT, body(timesteps=5, scheduler="ddpm"))
        assert answer is not None and answer.code == 202, answer
        claim = await rig.replica.store.claim_next()
        assert claim is not None
        assert dict(claim.request.params) == {
            "scheduler": "ddpm",
            "sample_steps": 5,
            "init_image": None,
        }  # eta does not apply under ddpm: no default stored
        depth = rig.depth()
        bad = [
            body(scheduler="ddpm", eta=0.5),
            body(timesteps=99),
            body(timesteps=5, sample_steps=5),
            body(picture=base64.b64encode(b"text, not a picture").decode()),
            body(picture=base64.b64encode(png()[:20]).decode()),
        ]
        twin_answers = [await rig.call(RouteKind.SUBMIT, b) for b in bad]
        rig.jobs.runtime.models = [loaded]  # the replica's own validator, same handler
        model_answers = [await rig.call(RouteKind.SUBMIT, b) for b in bad]
        assert [(a.code, a.body) for a in twin_answers if a] == [
            (a.code, a.body) for a in model_answers if a
        ]
        codes = [a.code for a in twin_answers if a]
        assert codes == [422, 422, 422, 400, 400]
        assert b"applies only to scheduler 'ddim'" in twin_answers[0].body  # type: ignore[union-attr]
        assert b"(timesteps is now sample_steps)" in twin_answers[1].body  # type: ignore[union-attr]
        assert rig.depth() == depth  # nothing more admitted
    finally:
        await rig.stop()
