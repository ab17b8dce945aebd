"""The sha256 manifest of a diffusers pipeline directory (write it, check it).

A pipeline directory (``model_index.json`` + one folder per component) is served only
when its ``manifest.json`` lists every file the loader reads with its sha256 and size:
a truncated download, a replaced weights file or a file nobody vetted is refused at
start-up with a message naming the file. The manifest may carry more keys (how the
weights were trained, measured figures); ``write_manifest`` keeps them.

    .venv/bin/python -m mortred_twisted.models.diffusion.manifest weights/diffusion/ddpm

writes (or refreshes) the manifest of a directory whose files you trust. Pure: no
torch, no diffusers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mortred_twisted.models.weights import sha256_file

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2


class ManifestError(ValueError):
    """A pipeline directory's files do not match its manifest (the message says which)."""


def pipeline_files(directory: Path) -> list[str]:
    """Relative POSIX paths of every file under ``directory`` except the manifest."""
    return sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME and "__pycache__" not in p.parts
    )


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed manifest of ``directory``; ``ManifestError`` when absent or unreadable."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: missing sha256 manifest; after vetting the files run "
            f".venv/bin/python -m mortred_twisted.models.diffusion.manifest {directory}"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ManifestError(f"{path}: not a manifest (no 'files' table)")
    return data


def write_manifest(directory: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file of ``directory`` into its manifest; keep or update other keys."""
    path = directory / MANIFEST_NAME
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    data.update(extra or {})
    data["format"] = MANIFEST_FORMAT
    data["files"] = {
        rel: {"sha256": sha256_file(directory / rel), "bytes": (directory / rel).stat().st_size}
        for rel in pipeline_files(directory)
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def verify_files(directory: Path, manifest: dict[str, Any], needed: list[str]) -> None:
    """Check that each of ``needed`` (relative paths) exists, is listed, and matches.

    Raises ``ManifestError`` naming the first file that is missing, unlisted or whose
    size or sha256 differs from the manifest.
    """
    listed = manifest["files"]
    for rel in needed:
        path = directory / rel
        if not path.is_file():
            raise ManifestError(f"{path}: missing file (listed in model_index.json/config)")
        entry = listed.get(rel)
        if not isinstance(entry, dict):
            raise ManifestError(
                f"{path}: not listed in {directory / MANIFEST_NAME}; refresh the manifest "
                "after vetting the file"
            )
        if entry.get("bytes") != path.stat().st_size or entry.get("sha256") != sha256_file(path):
            raise ManifestError(
                f"{path}: sha256 mismatch with {directory / MANIFEST_NAME} (corrupt or replaced)"
            )


def main(argv: list[str] | None = None) -> int:
    """CLI: write the manifest of each directory given."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__)
        return 2
    for name in args:
        directory = Path(name)
        if not (directory / "model_index.json").is_file():
            print(f"{directory}: no model_index.json (not a diffusers pipeline directory)")
            return 1
        data = write_manifest(directory)
        print(f"{directory / MANIFEST_NAME}: {len(data['files'])} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
