#!/usr/bin/env bash
# Makes a base image from Debian's own packages, for machines that cannot pull from an image
# registry: Debian 12 (minbase) with Python 3.11, venv and CA certificates, imported as
# ${1:-kvledger-base:bookworm}. Nothing happens when that image already exists.
#   bash deploy/debian-base.sh && docker build -f deploy/Dockerfile.cpu \
#       --build-arg BASE=kvledger-base:bookworm ...
# Needs root, debootstrap (Debian package) and a running Docker engine; reaches the Debian
# archive ($DEBIAN_MIRROR). Takes 2-3 minutes.
set -euo pipefail
name=${1:-kvledger-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$name" >/dev/null 2>&1; then
  exit 0
fi
root=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$root" "$log"' EXIT
echo "debian-base: debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$mirror" >"$log" 2>&1 || { tail -n 20 "$log" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' \
  --message "debootstrap --variant=minbase bookworm (deploy/debian-base.sh)" - "$name" >/dev/null
echo "debian-base: imported $name" >&2
