#!/usr/bin/env bash
# Prepare a Debian machine (root) to build and run the mortred-twisted image with
# podman: installs the tools from Debian's archive, then gives rootful podman the
# settings a sandboxed machine needs (see docs/operations.md § Containers).
#
#   deploy/container/host-setup.sh            install what is missing, write the settings
#   deploy/container/host-setup.sh --check    only say what is missing (exit 1 if anything)
#
# Settings (a drop-in, /etc/containers/containers.conf.d/50-mortred.conf, written only
# when neither it nor /etc/containers/containers.conf sets them):
#   runtime = "runc", cgroup_manager = "cgroupfs"   crun fails on hybrid cgroups here
#   default_ulimits = nofile/nproc at this machine's hard limits  (root may lack
#                                                    CAP_SYS_RESOURCE to raise them)
set -euo pipefail

# docker-compose: Debian's 1.29 (the Docker client), tested against podman's Docker API
PACKAGES=(podman buildah mmdebstrap podman-compose docker-compose runc slirp4netns
          fuse-overlayfs uidmap golang-github-containernetworking-plugin-dnsname)
CONF=/etc/containers/containers.conf
DROPIN_DIR=/etc/containers/containers.conf.d
DROPIN=$DROPIN_DIR/50-mortred.conf
check_only=0
[ "${1:-}" = "--check" ] && check_only=1

missing=()
for tool in podman buildah mmdebstrap podman-compose docker-compose runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -x /usr/lib/cni/dnsname ] || missing+=(dnsname)

settings_ok() {
  # every file podman reads; the drop-in counts as set
  [ -f "$DROPIN" ] && return 0
  [ -f "$CONF" ] && grep -Eq '^[[:space:]]*cgroup_manager[[:space:]]*=' "$CONF" \
    && grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=' "$CONF" \
    && grep -Eq '^[[:space:]]*runtime[[:space:]]*=' "$CONF"
}

if [ "$check_only" = 1 ]; then
  status=0
  if [ "${#missing[@]}" -gt 0 ]; then echo "missing: ${missing[*]}"; status=1; fi
  settings_ok || { echo "podman settings: none in $CONF or $DROPIN"; status=1; }
  exit "$status"
fi

if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || { echo "need apt-get to install: ${missing[*]}" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${PACKAGES[@]}" >/dev/null
fi

if ! settings_ok; then
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nproc" = unlimited ] && nproc=32768
  [ "$nproc" -gt 32768 ] && nproc=32768
  mkdir -p "$DROPIN_DIR"
  cat >"$DROPIN" <<CONF
# written by mortred-twisted's deploy/container/host-setup.sh
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
  echo "wrote $DROPIN"
fi
