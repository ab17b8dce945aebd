"""Read deploy/kubernetes/ and the Containerfile for the deploy tests (pure helpers).

:func:`documents` yields every object of every manifest file (not the kustomization);
:func:`containerfile` parses the runtime stage's metadata (``USER``, ``EXPOSE``,
``HEALTHCHECK``, ``ENV``, ``VOLUME``, ``WORKDIR``) the way a builder reads it, from
the last ``FROM`` on. Nothing here starts a process or touches the network.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
CONTAINERFILE = ROOT / "Containerfile"
IN_CI = os.environ.get("CI", "").lower() == "true"
#: the roles of the image's entry point that the manifests run (entrypoint.sh's modes)
ROLES = ("model", "gateway", "supervisor")


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path, doc


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text(encoding="utf-8"))


def find(kind: str, name: str) -> dict[str, Any]:
    hits = [d for _p, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return hits[0]


def workloads() -> list[dict[str, Any]]:
    """Every Deployment and StatefulSet."""
    return [d for _p, d in documents() if d["kind"] in ("Deployment", "StatefulSet")]


def mortred_workloads() -> list[dict[str, Any]]:
    """The workloads that run the mortred-twisted image."""
    return [w for w in workloads() if containers(w)[0]["image"].startswith("mortred-twisted")]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_spec(workload)["containers"]


def role(workload: dict[str, Any]) -> str:
    """The entry point's mode a mortred container runs (its first argument)."""
    (container,) = containers(workload)
    return container["args"][0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """Literal environment values (the manifests hold no valueFrom: secrets are files)."""
    return {e["name"]: e["value"] for e in container.get("env", [])}


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    (hit,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return hit


def mounts(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume mounted there."""
    (container,) = containers(workload)
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def secret_file_paths(workload: dict[str, Any]) -> dict[str, str]:
    """Path inside the container -> the Secret key it holds, for every Secret volume."""
    found: dict[str, str] = {}
    for path, volume in mounts(workload).items():
        if "secret" in volume:
            for item in volume["secret"]["items"]:
                found[f"{path}/{item['path']}"] = item["key"]
    return found


@dataclass
class ImageMetadata:
    user: str = ""
    expose: list[int] = field(default_factory=list)
    healthcheck: str = ""
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    workdir: str = ""
    entrypoint: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse_containerfile(text: str) -> ImageMetadata:
    """The final stage's metadata (instructions after the last ``FROM``)."""
    lines = _logical_lines(text)
    starts = [i for i, line in enumerate(lines) if line.split()[0].upper() == "FROM"]
    assert starts, "no FROM in the Containerfile"
    meta = ImageMetadata()
    for line in lines[starts[-1] + 1 :]:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word == "USER":
            meta.user = rest
        elif word == "EXPOSE":
            meta.expose = [int(p.split("/")[0]) for p in rest.split()]
        elif word == "HEALTHCHECK":
            meta.healthcheck = rest
        elif word == "WORKDIR":
            meta.workdir = rest
        elif word == "VOLUME":
            meta.volumes = json.loads(rest) if rest.startswith("[") else rest.split()
        elif word == "ENTRYPOINT":
            meta.entrypoint = json.loads(rest)
        elif word == "ENV":
            for pair in shlex.split(rest):
                name, sep, value = pair.partition("=")
                assert sep, f"ENV without '=' is not parsed here: {pair!r}"
                meta.env[name] = value
    return meta


def containerfile() -> ImageMetadata:
    """The image's metadata; skips without the file, fails under ``CI=true``."""
    if not CONTAINERFILE.exists():
        if IN_CI:
            pytest.fail("CI=true but the Containerfile is missing", pytrace=False)
        pytest.skip("no Containerfile yet")
    return parse_containerfile(CONTAINERFILE.read_text(encoding="utf-8"))
