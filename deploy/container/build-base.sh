#!/usr/bin/env bash
# Build the base image where no registry serves one: Debian bookworm (minbase) with
# Python 3.11 from Debian's own packages, imported into podman.
#
#   deploy/container/build-base.sh [--force]   -> localhost/mortred-base:bookworm
#
# The Containerfile takes it with --build-arg BASE_IMAGE=localhost/mortred-base:bookworm
# (users elsewhere keep the default, python:3.11-slim). The apt sources are this
# machine's (deb822 file in $APT_SOURCES), so the base sees the same archive snapshot.
# Skips the work when the image exists (--force rebuilds). Needs root, mmdebstrap, podman.
set -euo pipefail

IMAGE=${MORTRED_BASE_IMAGE:-localhost/mortred-base:bookworm}
SUITE=${SUITE:-bookworm}
APT_SOURCES=${APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}
force=0
[ "${1:-}" = "--force" ] && force=1

if [ "$force" = 0 ] && podman image exists "$IMAGE"; then
  echo "base image $IMAGE exists (--force rebuilds)"
  exit 0
fi
[ -f "$APT_SOURCES" ] || APT_SOURCES="http://deb.debian.org/debian"

work=$(mktemp -d /var/tmp/mortred-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
# minbase + Python; no docs, man pages or locales (a server image reads none of them)
mmdebstrap --quiet --variant=minbase \
  --include=ca-certificates,python3,python3-venv \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" "$work/rootfs.tar" "$APT_SOURCES"
podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "built $IMAGE in $(( $(date +%s) - start )) s ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
