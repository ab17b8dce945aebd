"""The weights loader and option checks refuse anything but the trained, verified file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.models.base import ModelLoadError
from mortred_twisted.models.diffusion.unet import UNet, UNetConfig
from mortred_twisted.models.registry import create_model
from tests.models.diffusion.conftest import SCHEDULE, TINY, write_weights


def manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "weights/diffusion/manifest.json").read_text())


def test_missing_file_is_a_load_error(build: Callable[..., Any]) -> None:
    """A weights path that does not exist raises ModelLoadError naming the path."""
    with pytest.raises(ModelLoadError, match=r"nope\.pt is missing"):
        build("DDPM", weights="weights/diffusion/nope.pt")


def test_tampered_file_fails_the_checksum(build: Callable[..., Any], tiny_root: Path) -> None:
    """A file whose bytes differ from the manifest's sha256 is refused."""
    path = tiny_root / "weights/diffusion/unet.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        build("DDPM")


def test_file_without_manifest_entry_is_refused(build: Callable[..., Any], tiny_root: Path) -> None:
    """A weights file the manifest does not list is refused."""
    (tiny_root / "weights/diffusion/stray.pt").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match=r"no entry for stray\.pt"):
        build("DDPM", weights="weights/diffusion/stray.pt")


def test_no_manifest_is_refused(build: Callable[..., Any], tiny_root: Path) -> None:
    """Without a manifest the weights cannot be verified and are refused."""
    (tiny_root / "weights/diffusion/manifest.json").unlink()
    with pytest.raises(ModelLoadError, match=r"no manifest\.json"):
        build("DDPM")


def test_wrong_architecture_is_refused(build: Callable[..., Any], tiny_root: Path) -> None:
    """Weights of another shape than the manifest's architecture are refused."""
    other = UNet(UNetConfig(base_channels=16, channel_mults=(1, 2), groups=4))
    write_weights(
        tiny_root / "weights/diffusion",
        "unet.pt",
        other,
        {"kind": "unet", "arch": TINY, "schedule": SCHEDULE},
    )
    with pytest.raises(ModelLoadError, match="do not match the architecture"):
        build("DDPM")


def test_not_a_state_dict_is_refused(build: Callable[..., Any], tiny_root: Path) -> None:
    """A file that is not a torch state dict is refused (checksum right, content wrong)."""
    folder = tiny_root / "weights/diffusion"
    (folder / "unet.pt").write_bytes(b"not a torch file")
    data = manifest(tiny_root)
    data["files"]["unet.pt"]["sha256"] = hashlib.sha256(b"not a torch file").hexdigest()
    (folder / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        build("DDPM")


def test_conditional_weights_refused_by_ddpm(build: Callable[..., Any]) -> None:
    """DDPM refuses a class-conditional UNet, CLS_COND_DDIM an unconditional one."""
    with pytest.raises(ModelLoadError, match="unconditional"):
        build("DDPM", weights="weights/diffusion/cond.pt")
    with pytest.raises(ModelLoadError, match="class-conditional"):
        build("CLS_COND_DDIM", weights="weights/diffusion/unet.pt")


def test_autoencoder_file_is_not_a_unet(build: Callable[..., Any]) -> None:
    """A weights file of another kind is refused."""
    with pytest.raises(ModelLoadError, match="expected 'unet'"):
        build("DDPM", weights="weights/diffusion/ae.pt")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"timesteps": 40}, "does not match the one the weights were trained with"),
        ({"beta_schedule": "linear"}, "beta_schedule 'linear'"),
        ({"beta_schedule": "sigmoid"}, "beta_schedule: must be one of"),
        ({"unknown_key": 1}, r"unknown keys \['unknown_key'\]"),
        ({"device": "tpu"}, "device"),
        ({"max_images": 0}, "max_images: must be >= 1"),
    ],
)
def test_bad_options_are_load_errors(
    build: Callable[..., Any], overrides: dict[str, Any], message: str
) -> None:
    """Bad or mismatched model options raise ModelLoadError with a clear message."""
    with pytest.raises(ModelLoadError, match=message):
        build("DDPM", **overrides)


def test_every_option_problem_is_reported_at_once(build: Callable[..., Any]) -> None:
    """Several bad options are listed together in one error."""
    with pytest.raises(ModelLoadError) as err:
        build("DDIM", eta=2.0, sample_steps=0, bogus=True)
    text = str(err.value)
    assert "eta" in text and "sample_steps" in text and "bogus" in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"latent_scale": 2.0}, "latent_scale"),
        ({"latent_dims": 3}, "latent_dims"),
        ({"latent_clip": -1.0}, "latent_clip: must be >= 0.0"),
        ({"autoencoder": "weights/diffusion/unet.pt"}, "expected 'autoencoder'"),
    ],
)
def test_ldm_checks_its_latent_space(
    build: Callable[..., Any], overrides: dict[str, Any], message: str
) -> None:
    """The LDM refuses a latent configuration that differs from its training."""
    with pytest.raises(ModelLoadError, match=message):
        build("LDM", **overrides)


def test_ldm_refuses_a_different_autoencoder(build: Callable[..., Any], tiny_root: Path) -> None:
    """A latent UNet is only decoded by the autoencoder it was trained on."""
    from mortred_twisted.models.diffusion.autoencoder import AutoencoderConfig, KLAutoencoder

    arch = {"in_channels": 1, "base_channels": 8, "latent_dims": 2, "downscale": 2, "groups": 4}
    write_weights(
        tiny_root / "weights/diffusion",
        "ae2.pt",
        KLAutoencoder(AutoencoderConfig.from_dict(dict(arch))),
        {"kind": "autoencoder", "arch": arch},
    )
    with pytest.raises(ModelLoadError, match="trained on autoencoder"):
        build("LDM", autoencoder="weights/diffusion/ae2.pt")


def test_unknown_type_is_a_load_error(tiny_root: Path) -> None:
    """The registry refuses a type it does not know."""
    with pytest.raises(ModelLoadError, match="unknown model type"):
        create_model("DDPMX", {}, tiny_root)
