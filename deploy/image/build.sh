#!/usr/bin/env bash
# Build shoal's container image without any container registry:
#   1. a Debian 12 root filesystem from Debian's own mirror (mmdebstrap), imported as
#      $BASE_IMAGE (skipped when it exists, or when BASE is given);
#   2. shoal's wheel and all its dependencies as wheels (pip, from PyPI), so the build
#      itself needs no network;
#   3. `buildah bud` (or podman build) of deploy/image/Containerfile.
# Usage: deploy/image/build.sh [IMAGE]   (default localhost/shoal:$VERSION)
# Environment: BUILDER (buildah|podman, default: whichever is installed), BASE (use this
# base image instead of making one), DEBIAN_MIRROR, PYTHON (a Python 3.11 with pip).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-$root/.venv/bin/python}
version=$("$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$root/pyproject.toml")
image=${1:-localhost/shoal:$version}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_image=localhost/shoal-base:bookworm
ctx="$here/context"

if [ -z "${BUILDER:-}" ]; then
  if command -v buildah >/dev/null; then BUILDER=buildah
  elif command -v podman >/dev/null; then BUILDER=podman
  else echo "build.sh: install buildah or podman (apt-get install buildah podman)" >&2; exit 1
  fi
fi
# rootful builds inside a container: no overlay mounts, no new network namespace
driver=${STORAGE_DRIVER:-vfs}
isolation=${BUILDAH_ISOLATION:-chroot}
B=("$BUILDER" --storage-driver "$driver")
step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

if [ -z "${BASE:-}" ]; then
  BASE=$base_image
  if ! "${B[@]}" images --quiet "$base_image" 2>/dev/null | grep -q .; then
    step "base root filesystem: mmdebstrap bookworm from $mirror"
    command -v mmdebstrap >/dev/null || { echo "build.sh: apt-get install mmdebstrap" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # bookworm with its updates and security suites, so the image gets their fixes
    mmdebstrap --variant=minbase --include=ca-certificates \
      --aptopt='Acquire::Retries "3"' bookworm "$tmp/rootfs.tar" \
      "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
      "deb ${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security} bookworm-security main"
    step "import the root filesystem as $base_image"
    if [ "$BUILDER" = buildah ]; then
      ctr=$("${B[@]}" from scratch)
      "${B[@]}" add "$ctr" "$tmp/rootfs.tar" /
      "${B[@]}" commit --rm "$ctr" "$base_image"
    else
      "${B[@]}" import "$tmp/rootfs.tar" "$base_image"
    fi
  fi
fi

step "wheels: shoal and its dependencies for CPython 3.11 (manylinux x86_64)"
rm -rf "$ctx" && mkdir -p "$ctx/wheels"
[ -e "$root/build" ] && had_build=1 || had_build=0
"$PYTHON" -m pip wheel -q --no-deps -w "$ctx/wheels" "$root"
[ "$had_build" = 1 ] || rm -rf "$root/build"  # setuptools' scratch directory
wheel=$(ls "$ctx"/wheels/shoal-*.whl)
# the versions of the project's tested environment: no resolver backtracking across
# platforms, and the image runs what the tests ran
"$PYTHON" -m pip freeze --exclude-editable | grep -v -e '^shoal' -e ' @ ' > "$ctx/constraints.txt"
"$PYTHON" -m pip download -q -d "$ctx/wheels" --only-binary=:all: -c "$ctx/constraints.txt" \
  --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  "shoal[s3,k8s] @ file://$wheel"
cp "$here/Containerfile" "$ctx/Containerfile"

step "image $image from $BASE with $BUILDER"
if [ "$BUILDER" = buildah ]; then
  "${B[@]}" bud --isolation "$isolation" --network host --layers=false \
    --build-arg "BASE=$BASE" -t "$image" -f "$ctx/Containerfile" "$ctx"
else
  "${B[@]}" build --isolation "$isolation" --network host \
    --build-arg "BASE=$BASE" -t "$image" -f "$ctx/Containerfile" "$ctx"
fi
step "done: $image"
"${B[@]}" images "$image"
