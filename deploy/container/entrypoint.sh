#!/bin/sh
# The mortred-twisted image's entry point. PID 1 is tini, which runs this script; every
# mode ends in `exec`, so the server process itself receives tini's SIGTERM and drains
# (the supervisor stops its models, then the gateway; a model server gives running jobs
# their grace and, on the Redis store, hands the rest back to the queue).
#
#   serve [twistd options]       (default) what `make run` runs: supervisor, gateway and the
#                                catalog's models; gateway 0.0.0.0:8080, supervisor 0.0.0.0:8787
#                                MORTRED_AUTOSTART=ID,ID  start only these models
#   supervisor [options]         the supervisor and gateway, no model started (--no-autostart)
#   gateway [options]            the gateway alone (its upstreams in the config's
#                                [gateway.upstreams]; MORTRED_INTERNAL_TOKEN for them)
#   model --config FILE [opts]   one model server; listens on 0.0.0.0 unless
#                                MORTRED_LISTEN_HOST says otherwise (then needs
#                                MORTRED_AUTH_TOKEN or MORTRED_AUTH_TOKEN_FILE)
#   mortredctl ARGS              the command-line client
#   help                         this text
#   anything else                run as given (python3, sh, twistd, …)
#
# MORTRED_CONFIG: the control-plane file of serve/supervisor/gateway
# (default conf/container/mortred.toml, i.e. /opt/mortred/conf/container/mortred.toml).
# Tokens: docs/operations.md § Containers (each also as a file: MORTRED_<NAME>_FILE).
set -eu

config=${MORTRED_CONFIG:-conf/container/mortred.toml}
mode=${1:-serve}
[ "$#" -gt 0 ] && shift

case "$mode" in
  serve)
    if [ -n "${MORTRED_AUTOSTART:-}" ]; then
      set -- "--autostart=${MORTRED_AUTOSTART}" "$@"
    fi
    exec twistd --nodaemon --pidfile= mortred-supervisor --config "$config" "$@"
    ;;
  supervisor)
    exec twistd --nodaemon --pidfile= mortred-supervisor --config "$config" --no-autostart "$@"
    ;;
  gateway)
    exec twistd --nodaemon --pidfile= mortred-gateway --config "$config" "$@"
    ;;
  model)
    MORTRED_LISTEN_HOST=${MORTRED_LISTEN_HOST:-0.0.0.0}
    export MORTRED_LISTEN_HOST
    exec twistd --nodaemon --pidfile= mortred-model "$@"
    ;;
  mortredctl)
    exec mortredctl "$@"
    ;;
  help | --help | -h)
    sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'
    ;;
  *)
    exec "$mode" "$@"
    ;;
esac
