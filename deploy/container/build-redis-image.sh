#!/usr/bin/env bash
# localhost/mortred-redis:bookworm from deploy/container/redis.Containerfile (skips when it
# exists; --force rebuilds). For docker-compose.redis.yml where no registry serves redis.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${MORTRED_REDIS_IMAGE:-localhost/mortred-redis:bookworm}
if [ "${1:-}" != "--force" ] && podman image exists "$IMAGE"; then
  echo "$IMAGE exists"; exit 0
fi
deploy/container/build-base.sh
podman build --format docker --network host -q -f deploy/container/redis.Containerfile \
  -t "$IMAGE" deploy/container >/dev/null
echo "built $IMAGE"
