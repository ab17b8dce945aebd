"""The shipped diffusion configs and committed weights load and sample."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tomllib
from pathlib import Path

import pytest
from PIL import Image

from mortred_twisted.config.server import load_server_config
from mortred_twisted.model_api.base import InferenceRequest, RunContext
from mortred_twisted.models.registry import create_model

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = {
    "DDPM": ("ddpm", 18110, "ddpm"),
    "DDIM": ("ddim", 18111, "ddpm"),
    "CLS_COND_DDIM": ("cls_cond_ddim", 18112, "cls_cond_ddim"),
    "LDM": ("ldm", 18113, "ldm"),
}
PIPELINES = ("ddpm", "cls_cond_ddim", "ldm")
WEIGHTS = ROOT / "weights" / "diffusion"


@pytest.mark.parametrize("model_id", sorted(FAMILIES))
def test_server_config_loads_with_async_defaults(model_id: str) -> None:
    """Each shipped server TOML validates with the seed's async defaults for diffusion."""
    name, port, _ = FAMILIES[model_id]
    cfg = load_server_config(ROOT / f"conf/server/diffusion/{name}.toml", env={})
    assert (cfg.id, cfg.category, cfg.host, cfg.port) == (
        model_id,
        "diffusion",
        "127.0.0.1",
        port,
    )
    assert cfg.model_type == model_id and cfg.server_uri == f"/mortred/diffusion/{name}"
    assert cfg.async_enabled and cfg.async_timeout == 600000 and cfg.async_max_queue == 8
    assert cfg.worker_nums == 1
    assert cfg.async_job_ttl == 300000 and cfg.async_max_completed == 100


def test_every_shipped_server_port_is_unique() -> None:
    """No two server TOMLs under conf/server share a port (the C++ tree's bug)."""
    seen: dict[int, str] = {}
    for path in sorted((ROOT / "conf/server").rglob("*.toml")):
        port = tomllib.loads(path.read_text())["server"]["port"]
        assert port not in seen, f"{path} reuses port {port} of {seen[port]}"
        seen[port] = str(path)


def test_judge_manifest_matches_committed_weights() -> None:
    """The judge (the only loose weights file left) is listed with its sha256 and command."""
    manifest = json.loads((WEIGHTS / "manifest.json").read_text())["files"]
    assert {p.name for p in WEIGHTS.glob("*.pt")} == set(manifest) == {"judge.pt"}
    entry = manifest["judge.pt"]
    assert hashlib.sha256((WEIGHTS / "judge.pt").read_bytes()).hexdigest() == entry["sha256"]
    assert entry["training"]["command"].startswith(".venv/bin/python -m training.")


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_manifests_match_committed_files(name: str) -> None:
    """Each shipped pipeline's manifest lists exactly its files, with sha256 and training
    command, and the weights stay small enough for git."""
    folder = WEIGHTS / name
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert on_disk == set(manifest["files"])
    for rel, entry in manifest["files"].items():
        assert hashlib.sha256((folder / rel).read_bytes()).hexdigest() == entry["sha256"]
        assert (folder / rel).stat().st_size < 8 * 1024 * 1024
    command = manifest["training"]["denoiser"]["command"]
    assert command.startswith(".venv/bin/python -m training.diffusion.train_pipeline")


@pytest.mark.parametrize("model_id", sorted(FAMILIES))
def test_shipped_model_samples(model_id: str) -> None:
    """The shipped model config builds on the trained pipeline and samples PNGs."""
    name, _, pipeline = FAMILIES[model_id]
    options = tomllib.loads((ROOT / f"conf/model/diffusion/{name}.toml").read_text())
    assert options["pretrained"] == f"weights/diffusion/{pipeline}"
    model = create_model(model_id, {**options, "device": "cpu"}, ROOT)
    params = {"sample_steps": 3, "seed": 0, "num_images": 2}
    request = model.validate(InferenceRequest(req_id="t", params=params))
    data = model.run(request, RunContext())
    for b64 in data["images"]:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            assert (img.size, img.mode) == ((16, 16), "L")
