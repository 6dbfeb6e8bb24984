#!/usr/bin/env bash
# Builds the fabricscope container image from the Dockerfile with buildah: no Docker engine
# and no container registry needed (CI has neither). Run as root on Debian 12.
#
#   scripts/image.sh                       # the agent image (target runtime)
#   scripts/image.sh --target runtime-probe  # the probe image (CUDA torch: several GB, not in CI)
#
# The Dockerfile's base is Debian 12 (`ARG BASE=debian:bookworm-slim`). With no registry to
# pull it from, this script makes the same base from Debian's own packages: a
# `debootstrap --variant=minbase bookworm` from the machine's apt mirror, slimmed the way the
# official slim image is, committed as localhost/fabricscope-base:bookworm-<recipe hash>. It is
# cached in the storage below, so only the first run on a machine pays for it (166 s on the
# 2-core CI machine when it was quiet; the image on top of it took 170 s then, with one stage
# cached, which this script no longer keeps; both took 20+ min at a load average of 20-30);
# a change to the recipe (this file's BASE_* settings) changes the hash and rebuilds it.
#
# Storage: buildah with --storage-driver vfs (plain directories: needs no overlay mount) under
# $FABRICSCOPE_IMAGE_CACHE (default /var/cache/fabricscope-ci), kept between runs, and
# $FABRICSCOPE_IMAGE_RUNROOT (default /run/fabricscope-ci).
# Prints the image name on the last line of stdout; the log goes to stderr. Each run tags its
# own image (localhost/fabricscope:ci-<target>-<pid>), so runs from several checkouts on one
# machine never test each other's build; remove it when done:
#   scripts/image.sh --rm NAME
# Runs on one storage take turns (flock on $FABRICSCOPE_IMAGE_CACHE/lock): buildah's storage
# locks cover single operations, not a build's intermediate images against another run's
# clean-up, and two runs would both bootstrap the base.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=runtime
TAG=""
REMOVE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --rm) REMOVE=$2; shift 2 ;;
    *) echo "usage: $0 [--target runtime|runtime-probe] [--tag NAME] | --rm NAME" >&2; exit 2 ;;
  esac
done
TAG=${TAG:-localhost/fabricscope:ci-$TARGET-$$}

CACHE=${FABRICSCOPE_IMAGE_CACHE:-/var/cache/fabricscope-ci}
RUNROOT=${FABRICSCOPE_IMAGE_RUNROOT:-/run/fabricscope-ci}
STORE=(--root "$CACHE/containers" --runroot "$RUNROOT" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
log() { echo "== image: $*" >&2; }

if [ -n "$REMOVE" ]; then
  mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
if ! flock -n 9; then
  log "waiting for another image build on $CACHE"
  flock 9
fi
  exec 9>"$CACHE/lock"
  flock 9
  buildah "${STORE[@]}" rmi "$REMOVE" >/dev/null
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "scripts/image.sh: needs root (buildah with chroot isolation, debootstrap)" >&2
  exit 1
fi
missing=()
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    buildah debootstrap >/dev/null
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
if ! flock -n 9; then
  log "waiting for another image build on $CACHE"
  flock 9
fi

# --- the base: Debian 12 minbase from the apt mirror this machine uses -----------------------
BASE_SUITE=bookworm
BASE_MIRROR=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
BASE_MIRROR=${BASE_MIRROR:-http://deb.debian.org/debian}
# what debian:bookworm-slim leaves out (debuerreotype's slimification), so apt in the build
# installs no docs, man pages or translations either
BASE_DPKG_EXCLUDES='path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*'
recipe_hash=$(printf '%s\n' "$BASE_SUITE" "$BASE_MIRROR" "minbase" "$BASE_DPKG_EXCLUDES" v1 |
  sha256sum | cut -c1-12)
BASE=localhost/fabricscope-base:$BASE_SUITE-$recipe_hash

if buildah "${STORE[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  log "base $BASE (cached)"
else
  log "bootstrapping base $BASE from $BASE_MIRROR (debootstrap minbase $BASE_SUITE)"
  start=$SECONDS
  ctr=$(buildah "${STORE[@]}" from scratch)
  # shellcheck disable=SC2064  # expand now: the container's name is known here
  trap "buildah ${STORE[*]} rm $ctr >/dev/null 2>&1 || true" EXIT
  mnt=$(buildah "${STORE[@]}" mount "$ctr")
  debootstrap --variant=minbase "$BASE_SUITE" "$mnt" "$BASE_MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
    tail -20 "$CACHE/debootstrap.log" >&2
    echo "scripts/image.sh: debootstrap failed (log: $CACHE/debootstrap.log)" >&2
    exit 1
  }
  printf '%s\n' "$BASE_DPKG_EXCLUDES" >"$mnt/etc/dpkg/dpkg.cfg.d/docker"
  rm -f "$mnt/etc/apt/sources.list"
  cat >"$mnt/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $BASE_MIRROR
Suites: $BASE_SUITE $BASE_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${BASE_MIRROR%/debian}/debian-security
Suites: $BASE_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # as the slim image: no docs, man pages, locales, apt lists or downloaded packages
  find "$mnt/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$mnt"/usr/share/{man,groff,info,lintian,linda,locale}/* \
    "$mnt"/var/lib/apt/lists/* "$mnt"/var/cache/apt/*.bin "$mnt"/var/cache/apt/archives/*.deb \
    "$mnt"/var/log/*.log "$mnt"/var/log/apt/*
  buildah "${STORE[@]}" umount "$ctr" >/dev/null
  buildah "${STORE[@]}" config --cmd /bin/bash \
    --label org.opencontainers.image.description="Debian $BASE_SUITE minbase (debootstrap, $BASE_MIRROR)" \
    "$ctr"
  buildah "${STORE[@]}" commit --quiet --rm "$ctr" "$BASE" >/dev/null
  trap - EXIT
  log "base built in $((SECONDS - start)) s"
fi

# --- the image --------------------------------------------------------------------------------
# pip inside the build trusts the CA bundle this machine trusts (a TLS-inspecting proxy may sit
# between CI and PyPI): a copy and a pip.conf naming it, mounted read-only for the build only,
# never baked into the image (not over /etc/ssl/certs: Debian's ca-certificates writes there).
build_mounts=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$CACHE/pip"
  cp /etc/ssl/certs/ca-certificates.crt "$CACHE/pip/host-ca.crt"
  printf '[global]\ncert = /etc/pip-host-ca.crt\n' >"$CACHE/pip/pip.conf"
  build_mounts+=(-v "$CACHE/pip/host-ca.crt:/etc/pip-host-ca.crt:ro"
    -v "$CACHE/pip/pip.conf:/etc/pip.conf:ro")
fi
log "building $TAG (target $TARGET) on $BASE"
start=$SECONDS
# no --layers: with vfs every cached layer is a full copy of the tree, and the apt steps it
# would save take seconds
buildah "${STORE[@]}" bud --isolation chroot --pull-never \
  --build-arg "BASE=$BASE" --target "$TARGET" "${build_mounts[@]}" -t "$TAG" . \
  >"$CACHE/build.log" 2>&1 || {
  tail -40 "$CACHE/build.log" >&2
  echo "scripts/image.sh: the image build failed (log: $CACHE/build.log)" >&2
  exit 1
}
log "built $TAG in $((SECONDS - start)) s"
# untagged images an interrupted build left behind (under the lock: no build is running; the
# tagged images other runs are testing stay)
buildah "${STORE[@]}" rmi --prune >/dev/null 2>&1 || true
size=$(buildah "${STORE[@]}" images --format '{{.Size}}' "$TAG")
layers=$(buildah "${STORE[@]}" inspect --type image --format '{{len .OCIv1.RootFS.DiffIDs}}' "$TAG")
log "$TAG: $size, $layers layers"
echo "$TAG"
