#!/usr/bin/env bash
# Debian packages the deployment tests (tests/deploy) need, installed only when missing:
#   docker-compose  `docker-compose config -q` validates docker-compose.yml offline
#   prometheus      `promtool` and a real Prometheus server for the live dashboard test
#   docker.io       the Docker engine (dockerd, started by deploy/start-dockerd.sh where no
#                   systemd does) for the compose test, tests/deploy/test_compose_live.py
#   debootstrap     the Debian-built base image (deploy/debian-base.sh)
# Idempotent and quiet. Needs root or sudo. When an install fails it prints why and still exits
# 0: the rest of the suite runs, and the tests that need the tool fail saying it is missing.
# (On a machine run by systemd, the prometheus package also enables a system Prometheus on
# :9090; the tests never use it: they start their own on a free port.)
set -uo pipefail

missing=()
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "ci-deps: not root and no sudo: cannot install ${missing[*]}" >&2
    exit 0
  fi
  sudo=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
echo "ci-deps: installing ${missing[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
install() {
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$log" 2>&1
}
# A missing or stale package list is the usual cause of a failed install: refresh, retry once.
if ! install; then
  "${sudo[@]}" apt-get update -qq >>"$log" 2>&1
  if ! install; then
    tail -n 20 "$log" >&2
    echo "ci-deps: could not install ${missing[*]}; tests/deploy will fail without them" >&2
  fi
fi
exit 0
