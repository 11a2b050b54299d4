#!/usr/bin/env bash
# Starts a Docker engine in the background where none answers: for machines without systemd
# (a CI container, a build VM) that have Debian's docker.io installed (deploy/ci-deps.sh).
# Storage drivers are tried in order, overlay2 first; vfs (no kernel support needed, but every
# layer a full copy: slow and large) only if overlay2 does not start. The engine keeps running
# after this script (like the system service it stands in for), so its layers are reused by the
# next build. Log: /var/log/kvledger-dockerd.log. Needs root. Exit 0 once `docker info` answers.
set -uo pipefail
answers() { docker info >/dev/null 2>&1; }
answers && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "start-dockerd: no Docker engine answers, and only root can start one" >&2
  exit 2
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "start-dockerd: no dockerd: install Debian's docker.io (bash deploy/ci-deps.sh)" >&2
  exit 1
fi
log=/var/log/kvledger-dockerd.log
for driver in ${KVLEDGER_DOCKER_STORAGE_DRIVERS:-overlay2 vfs}; do
  echo "start-dockerd: starting dockerd --storage-driver $driver (log: $log)" >&2
  setsid dockerd --storage-driver "$driver" </dev/null >>"$log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do
    answers && { echo "start-dockerd: engine up (pid $pid, $driver)" >&2; exit 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
done
# Another caller may have started one at the same moment (ours then exits: the pid file).
for _ in $(seq 20); do
  answers && exit 0
  sleep 0.5
done
tail -n 30 "$log" >&2
echo "start-dockerd: no storage driver worked" >&2
exit 1
