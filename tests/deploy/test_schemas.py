"""Every manifest of deploy/kubernetes/ validates offline against Kubernetes' schemas.

``kubernetes-validate`` bundles the OpenAPI schemas of each Kubernetes release (no
network, no API server): every object is checked in strict mode (unknown fields are
errors) against :data:`KUBERNETES_VERSIONS`. The KEDA ``ScaledObject`` is checked
against the pydantic models that ``cloudcoil-models-keda`` generates from KEDA's CRD
(KEDA 2.16): a field of the wrong type fails, and a round trip that loses a field
means the CRD has no such field. Each check also rejects a broken copy (negative
controls), so none can pass by validating nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cloudcoil.models.keda import v1alpha1 as keda

from tests.deploy.manifests import KUBE, documents, find, kustomization, manifest_files

#: the oldest Kubernetes minor still supported upstream when written, and the newest
#: schema kubernetes-validate 1.37.0 bundles
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")

CORE = [(p, d) for p, d in documents() if not d["apiVersion"].startswith("keda.sh/")]
KEDA = [(p, d) for p, d in documents() if d["apiVersion"].startswith("keda.sh/")]


def test_the_bundled_schemas_are_there() -> None:
    """Validation runs from the package's own files (offline)."""
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    for version in KUBERNETES_VERSIONS:
        assert (base / f"v{version}-local-strict").is_dir(), version


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "doc", [d for _p, d in CORE], ids=[f"{p.name}:{d['kind']}" for p, d in CORE]
)
def test_manifest_validates(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_validation_rejects_broken_objects() -> None:
    deployment = find("Deployment", "mortred-gateway")
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    for broken in (unknown, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def keda_check(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` is a ScaledObject by KEDA's CRD (types and field names)."""
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    model = keda.ScaledObject.model_validate(doc)
    back = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert back == doc, f"fields KEDA's CRD does not have were dropped: {back} != {doc}"


def test_keda_objects_exist() -> None:
    assert [d["kind"] for _p, d in KEDA] == ["ScaledObject"]


@pytest.mark.parametrize("doc", [d for _p, d in KEDA], ids=[p.name for p, _d in KEDA])
def test_keda_scaled_object_validates(doc: dict[str, Any]) -> None:
    keda_check(doc)


def test_keda_check_rejects_broken_objects() -> None:
    doc = KEDA[0][1]
    unknown = copy.deepcopy(doc)
    unknown["spec"]["maxReplicas"] = 4  # maxReplicaCount is the field
    wrong_type = copy.deepcopy(doc)
    wrong_type["spec"]["minReplicaCount"] = "one"
    missing = copy.deepcopy(doc)
    del missing["spec"]["triggers"]
    for broken in (unknown, wrong_type, missing):
        with pytest.raises((AssertionError, ValueError)):
            keda_check(broken)


def test_kustomization_names_every_file_and_only_those() -> None:
    kust = kustomization()
    assert sorted(kust["resources"]) == sorted(p.name for p in manifest_files())
    for generator in kust["configMapGenerator"]:
        for name in generator["files"]:
            assert (KUBE / name).is_file(), name


def test_make_secrets_writes_the_secret_generators_files(tmp_path: Path) -> None:
    """make-secrets.sh writes every file the secretGenerator names (one line each),
    keeps them on a second run, and nothing else."""
    import shutil
    import subprocess

    shutil.copy(KUBE / "make-secrets.sh", tmp_path / "make-secrets.sh")
    subprocess.run(["sh", str(tmp_path / "make-secrets.sh")], check=True, capture_output=True)
    (secrets,) = kustomization()["secretGenerator"]
    wanted = sorted(Path(f).name for f in secrets["files"])
    assert sorted(p.name for p in (tmp_path / "secrets").iterdir()) == wanted
    first = {name: (tmp_path / "secrets" / name).read_text() for name in wanted}
    for name, text in first.items():
        assert text.endswith("\n") and text.count("\n") == 1 and len(text) > 10, name
        assert (tmp_path / "secrets" / name).stat().st_mode & 0o077 == 0, name
    subprocess.run(["sh", str(tmp_path / "make-secrets.sh")], check=True, capture_output=True)
    assert first == {name: (tmp_path / "secrets" / name).read_text() for name in wanted}
    assert first["gateway_token"] != first["internal_token"] != first["api_token"]
