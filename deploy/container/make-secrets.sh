#!/bin/sh
# Create the token files of docker-compose.redis.yml (once; existing files are kept):
#   var/secrets/gateway_token   clients' bearer token (MORTRED_GATEWAY_AUTH_TOKEN_FILE)
#   var/secrets/internal_token  gateway -> replicas (MORTRED_INTERNAL_TOKEN_FILE and the
#                               replicas' MORTRED_AUTH_TOKEN_FILE)
# The folder is private to you (0700); the files are 0644 because compose bind-mounts
# them into containers that run as uid 10001.
set -eu
dir=${1:-var/secrets}
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
for name in gateway_token internal_token; do
  if [ ! -s "$dir/$name" ]; then
    python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$dir/$name.tmp"
    chmod 0644 "$dir/$name.tmp"
    mv "$dir/$name.tmp" "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
