#!/usr/bin/env bash
# Build the mortred-twisted image with podman (`make image`): tags mortred-twisted:<version>
# and mortred-twisted:latest, and mortred-twisted:inputs-<hash> by the hash of its build
# inputs (deploy/container/build_inputs.py), which tests/containers uses to reuse an image.
#
#   deploy/container/build-image.sh [extra podman build arguments]
#
# Environment:
#   BASE_IMAGE     the base (default: python:3.11-slim when a registry serves it; with
#                  MORTRED_LOCAL_BASE=1, or when no registry answers, the Debian base of
#                  deploy/container/build-base.sh, built first if missing)
#   WHEELS_DIR     a folder of wheels (default /opt/wheels if it holds the torch CPU wheel):
#                  mounted read-only and given to pip as PIP_FIND_LINKS
#   IMAGE          the repository name (default mortred-twisted)
#   MORTRED_SKIP_IF_BUILT=1  do nothing when an image with the same inputs exists
# The last line names the image built: "image: mortred-twisted:inputs-<16 hex of the hash>".
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-mortred-twisted}
LOCAL_BASE=localhost/mortred-base:bookworm
PY=$(command -v python3)
VERSION=$("$PY" deploy/container/build_inputs.py version)

args=(--format docker --network host)
if [ -z "${BASE_IMAGE:-}" ]; then
  BASE_IMAGE=$LOCAL_BASE
  if [ "${MORTRED_LOCAL_BASE:-0}" != 1 ]; then
    if podman image exists docker.io/library/python:3.11-slim \
       || timeout 30 podman pull -q docker.io/library/python:3.11-slim >/dev/null 2>&1; then
      BASE_IMAGE=docker.io/library/python:3.11-slim
    fi
  fi
fi
if [ "$BASE_IMAGE" = "$LOCAL_BASE" ]; then
  deploy/container/build-base.sh
fi
args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
hash_args=("BASE_IMAGE=$BASE_IMAGE")

WHEELS_DIR=${WHEELS_DIR:-}
if [ -z "$WHEELS_DIR" ] && compgen -G "/opt/wheels/torch-*+cpu-*.whl" >/dev/null; then
  WHEELS_DIR=/opt/wheels
fi
if [ -n "$WHEELS_DIR" ]; then
  # the CPU wheel from the folder; the PyTorch index is not asked (it may be unreachable)
  # mounted on /mnt, a folder every Debian base has: a mount point that does not
  # exist would be left in the image as an empty placeholder
  args+=(-v "$WHEELS_DIR:/mnt:ro" --build-arg PIP_FIND_LINKS=/mnt
         --build-arg PIP_EXTRA_INDEX_URL=)
  hash_args+=("PIP_FIND_LINKS=/mnt" "PIP_EXTRA_INDEX_URL=")
fi
# pip trusts what this machine trusts, for the build only: the bundle is mounted over
# the base's own (/etc/ssl/certs/ca-certificates.crt, which both bases have), so nothing
# of it, not even an empty mount point, stays in the image
for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  if [ -f "$ca" ]; then
    args+=(-v "$ca:/etc/ssl/certs/ca-certificates.crt:ro"
           --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
    break
  fi
done

HASH=$("$PY" deploy/container/build_inputs.py hash "${hash_args[@]}")
INPUTS_TAG="$IMAGE:inputs-${HASH:0:16}"
if [ "${MORTRED_SKIP_IF_BUILT:-0}" = 1 ] && podman image exists "$INPUTS_TAG"; then
  echo "$IMAGE: an image of these inputs exists"
  echo "image: $INPUTS_TAG"
  exit 0
fi

REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null | head -1)" ]; then
  REVISION="$REVISION-dirty"
fi
SOURCE=${SOURCE:-$(git remote get-url origin 2>/dev/null || echo unknown)}
start=$(date +%s)
podman build "${args[@]}" \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" \
  --build-arg "SOURCE=$SOURCE" --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --label "mortred.build-inputs=$HASH" \
  -f Containerfile -t "$IMAGE:$VERSION" -t "$IMAGE:latest" -t "$INPUTS_TAG" "$@" .
echo "built $IMAGE:$VERSION ($IMAGE:latest) in $(( $(date +%s) - start )) s," \
  "$(podman image inspect --format '{{.Size}}' "$IMAGE:$VERSION") bytes; inputs $HASH"
# keep the newest three images by inputs (older ones are freed unless a container uses them)
podman images --sort created --format '{{.Repository}}:{{.Tag}}' "$IMAGE" \
  | grep ":inputs-" | grep -v -x "localhost/$INPUTS_TAG" | tail -n +3 \
  | xargs -r podman rmi >/dev/null 2>&1 || true
# and the build stages of older builds (this build's stay: they are the layer cache)
for id in $(podman images -q --filter dangling=true --filter label=mortred.build-inputs); do
  label=$(podman image inspect --format '{{index .Labels "mortred.build-inputs"}}' "$id" 2>/dev/null || true)
  [ "$label" = "$HASH" ] || podman rmi "$id" >/dev/null 2>&1 || true
done
echo "image: $INPUTS_TAG"
