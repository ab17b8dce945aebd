#!/bin/sh
# The files kustomization.yaml's secretGenerator turns into the Secret mortred-secrets:
#   secrets/gateway_token   clients -> gateway (MORTRED_GATEWAY_AUTH_TOKEN)
#   secrets/internal_token  gateway -> models (the gateway's MORTRED_INTERNAL_TOKEN,
#                           the models' MORTRED_AUTH_TOKEN)
#   secrets/api_token       the supervisor's API, i.e. Prometheus' scrape of
#                           /api/v1/metrics (MORTRED_API_TOKEN)
#   secrets/redis_url       MORTRED_REDIS_URL (put a password here: redis://:pw@host:6379/0)
# Existing files are kept (run with --force to replace them). Each is one line.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir="$here/secrets"
force=0
[ "${1:-}" = "--force" ] && force=1
umask 077
mkdir -p "$dir"
token() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }
write() {
  if [ "$force" = 1 ] || [ ! -s "$dir/$1" ]; then
    printf '%s\n' "$2" > "$dir/$1"
    echo "wrote $dir/$1"
  else
    echo "kept $dir/$1"
  fi
}
write gateway_token "$(token)"
write internal_token "$(token)"
write api_token "$(token)"
write redis_url "redis://mortred-redis:6379/0"
