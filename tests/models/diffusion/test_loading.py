"""Loading refuses, at start-up and naming the file, every pipeline it should not serve."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mortred_twisted.model_api.base import InferenceRequest, ModelLoadError, RunContext
from mortred_twisted.models.diffusion import manifest as manifest_mod
from mortred_twisted.models.registry import create_model
from tests.models.diffusion.conftest import OPTIONS

WEIGHTS = "unet/diffusion_pytorch_model.safetensors"


def load(root: Path, family: str = "DDPM", **overrides: Any) -> Any:
    return create_model(family, {**OPTIONS[family], **overrides}, root)


def refused(root: Path, family: str = "DDPM", **overrides: Any) -> str:
    with pytest.raises(ModelLoadError) as err:
        load(root, family, **overrides)
    return str(err.value)


def test_pretrained_may_be_absolute(tiny_root: Path, tmp_path: Path) -> None:
    """An absolute 'pretrained' path is used as is, whatever the project root."""
    model = load(tmp_path / "elsewhere", pretrained=str(tiny_root / "weights/diffusion/ddpm"))
    assert model.instance.pipe.path == tiny_root / "weights/diffusion/ddpm"


def test_missing_directory_is_named(tiny_root: Path) -> None:
    """A 'pretrained' directory that does not exist is refused with its path."""
    message = refused(tiny_root, pretrained="weights/diffusion/nope")
    assert "weights/diffusion/nope" in message and "not found" in message


@pytest.mark.parametrize(
    "name", ["model_index.json", WEIGHTS, "unet/config.json", "scheduler/scheduler_config.json"]
)
def test_missing_file_is_named(tiny_root: Path, name: str) -> None:
    """Deleting any file the loader reads makes start-up fail naming that file."""
    (tiny_root / "weights/diffusion/ddpm" / name).unlink()
    message = refused(tiny_root)
    assert name in message and "missing" in message


def test_missing_manifest_says_how_to_write_one(tiny_root: Path) -> None:
    """Without manifest.json the error names it and the command that writes it."""
    (tiny_root / "weights/diffusion/ddpm/manifest.json").unlink()
    message = refused(tiny_root)
    assert "manifest" in message and "mortred_twisted.models.diffusion.manifest" in message


def test_tampered_weights_are_refused(tiny_root: Path) -> None:
    """Weights whose bytes differ from the manifest's sha256 are refused."""
    path = tiny_root / "weights/diffusion/ddpm" / WEIGHTS
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "sha256 mismatch" in refused(tiny_root)


def test_unlisted_weights_are_refused(tiny_root: Path) -> None:
    """A weights file the manifest does not list (e.g. dropped in later) is refused."""
    folder = tiny_root / "weights/diffusion/ddpm/unet"
    shutil.copy(folder / "diffusion_pytorch_model.safetensors", folder / "extra.safetensors")
    message = refused(tiny_root)
    assert "unet/extra.safetensors" in message and "not listed" in message


def test_unsupported_component_is_refused(tiny_root: Path) -> None:
    """A pipeline with a text encoder (a text-to-image model) is refused up front."""
    folder = tiny_root / "weights/diffusion/ddpm"
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder"] = ["transformers", "CLIPTextModel"]
    (folder / "model_index.json").write_text(json.dumps(index))
    manifest_mod.write_manifest(folder)
    assert "unsupported components ['text_encoder']" in refused(tiny_root)


def test_unsupported_denoiser_class_is_refused(tiny_root: Path) -> None:
    """A denoiser class outside the supported set is refused before anything is imported."""
    folder = tiny_root / "weights/diffusion/ddpm"
    index = json.loads((folder / "model_index.json").read_text())
    index["unet"] = ["diffusers", "UNet2DConditionModel"]
    (folder / "model_index.json").write_text(json.dumps(index))
    manifest_mod.write_manifest(folder)
    assert "UNet2DConditionModel" in refused(tiny_root)


@pytest.mark.parametrize(
    ("family", "pretrained", "says"),
    [
        ("DDPM", "weights/diffusion/cls_cond_ddim", "serve it as CLS_COND_DDIM"),
        ("CLS_COND_DDIM", "weights/diffusion/ddpm", "needs a class-conditional denoiser"),
        ("LDM", "weights/diffusion/ddpm", "needs an autoencoder"),
    ],
)
def test_family_mismatch_is_refused(
    tiny_root: Path, family: str, pretrained: str, says: str
) -> None:
    """Each catalog id refuses a pipeline of the wrong kind, saying what it needs."""
    assert says in refused(tiny_root, family, pretrained=pretrained)


def test_previous_option_keys_say_what_replaced_them(tiny_root: Path) -> None:
    """The hand-written models' keys are refused, all at once, naming their replacement."""
    message = refused(
        tiny_root,
        weights="weights/diffusion/ddpm_unet.pt",
        beta_schedule="cosine",
        latent_scale=1.2,
        colour="red",
    )
    assert "weights: no longer read; replaced by 'pretrained'" in message
    assert "beta_schedule: no longer read" in message and "latent_scale" in message
    assert "colour: unknown key" in message


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"device": "tpu"}, "device"),
        ({"scheduler": "plms"}, "scheduler"),
        ({"dtype": "float16", "device": "cpu"}, "needs device 'cuda'"),
        ({"sample_steps": 51}, "num_train_timesteps"),
        ({"max_images": 0}, "max_images"),
    ],
)
def test_bad_options_are_refused(tiny_root: Path, overrides: dict[str, Any], says: str) -> None:
    """Ill-typed or impossible options fail at start-up with the key named."""
    assert says in refused(tiny_root, **overrides)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_half_precision_needs_cuda_even_with_auto(tiny_root: Path) -> None:
    """dtype float16 on a machine without CUDA ('auto' resolves to CPU) is a config error."""
    assert "needs CUDA" in refused(tiny_root, device="auto", dtype="float16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", ["DDPM", "CLS_COND_DDIM", "LDM"])
def test_cuda_samples(tiny_root: Path, family: str, dtype: str) -> None:
    """On CUDA every family samples in float32 and float16, deterministically per seed."""
    model = load(tiny_root, family, device="cuda", dtype=dtype)
    params = {"scheduler": "dpmsolver++", "sample_steps": 4, "seed": 2, "num_images": 2}
    request = model.validate(InferenceRequest(req_id="t", params=params))
    first, second = model.run(request, RunContext()), model.run(request, RunContext())
    assert len(first["images"]) == 2 and first["images"] == second["images"]


def test_workers_share_one_loaded_pipeline(tiny_root: Path) -> None:
    """Two instances over the same directory share the same denoiser object."""
    assert load(tiny_root).instance.pipe.denoiser is load(tiny_root, "DDIM").instance.pipe.denoiser


def test_manifest_cli_writes_a_manifest(tiny_root: Path, capsys: pytest.CaptureFixture) -> None:
    """The manifest command hashes every file of a pipeline directory a user vetted."""
    folder = tiny_root / "weights/diffusion/ddpm"
    (folder / "manifest.json").unlink()
    assert manifest_mod.main([str(folder)]) == 0
    files = json.loads((folder / "manifest.json").read_text())["files"]
    assert set(files) == {
        "model_index.json",
        "scheduler/scheduler_config.json",
        "unet/config.json",
        WEIGHTS,
    }
    assert load(tiny_root).instance.pipe.path == folder
    assert manifest_mod.main([str(tiny_root)]) == 1
    assert "not a diffusers pipeline directory" in capsys.readouterr().out


def test_loading_stays_offline(build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading sets HF_HUB_OFFLINE so that nothing reaches the network."""
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from mortred_twisted.models.diffusion import pipeline

    pipeline.clear_cache()
    build("DDPM")
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
