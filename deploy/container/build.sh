#!/bin/sh
# Build the llmgw images offline with podman (`make image`; docs/install.md, "Container image"):
#
#   localhost/llmgw:<version>        the control plane (deploy/container/Containerfile), also tagged :latest
#   localhost/llmgw-agent:<version>  an agent on a GPU node (deploy/container/Containerfile.agent)
#
# 1. the base: a Debian bookworm minbase root (debootstrap, with python3, python3-venv, git, ca-certificates),
#    made once per machine by base.sh and kept as a tarball in $LLMGW_CACHE/container/ (default ~/.cache/llmgw), imported
#    with `podman import` as localhost/llmgw-base:bookworm;
# 2. the build context (a temporary directory): llmgw's wheel built from this tree and its dependencies' wheels,
#    downloaded here with pip under constraints.txt; or, with LLMGW_WHEELS=DIR, the wheels of DIR (a release's
#    wheels/, `llmgw release build`: the image then holds exactly what nodes install);
# 3. `podman build --pull=never --network none`: pip installs from those wheels only (--no-index).
#
# Environment: PYTHON (default python3: its pip builds and downloads the wheels, so its version is the image's,
# 3.11 as bookworm's), LLMGW_IMAGE_STORAGE (a directory: podman's --root/--runroot go under it instead of the
# user's storage; what the tests use), LLMGW_BASE_STORE (a directory: the base is imported there once and read from
# there, not imported per build; the test gives $LLMGW_CACHE/container/stores), LLMGW_WHEELS (above), CONTAINERS_CONF (default:
# deploy/container/containers.conf, runc and ulimits that fit this machine), DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root for debootstrap
# (the first time) and the Debian packages podman, buildah, runc, debootstrap (`make system-packages`).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}

for tool in podman debootstrap runc; do
    command -v "$tool" > /dev/null || { echo "error: $tool is missing: run \`make system-packages\` (Debian packages podman buildah runc debootstrap)" >&2; exit 1; }
done

set -- podman
if [ -n "${LLMGW_IMAGE_STORAGE:-}" ]; then
    set -- podman --root "$LLMGW_IMAGE_STORAGE/root" --runroot "$LLMGW_IMAGE_STORAGE/run" --storage-driver overlay
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base_tar=$("$here/base.sh")
if [ -n "${LLMGW_BASE_STORE:-}" ]; then
    # the base imported once into a podman storage of its own under LLMGW_BASE_STORE (one per base tarball: its path,
    # size and mtime), then read from there by every build as an additional image store (read-only): no import per
    # build (the import of the 277 MB base is about 10 s of CPU); its runroot, which podman records, under /tmp
    key=$(stat -c '%n %s %Y' "$base_tar" | cksum | cut -d' ' -f1)
    store="$LLMGW_BASE_STORE/$key"
    mkdir -p "$store"
    podman --root "$store/root" --runroot "/tmp/llmgw-base-$key" --storage-driver overlay image exists localhost/llmgw-base:bookworm \
        || podman --root "$store/root" --runroot "/tmp/llmgw-base-$key" --storage-driver overlay import --quiet "$base_tar" \
            localhost/llmgw-base:bookworm > /dev/null
    set -- "$@" --storage-opt "additionalimagestore=$store/root"
else
    "$@" import --quiet "$base_tar" localhost/llmgw-base:bookworm > /dev/null
fi

mkdir -p "$work/context/wheels" "$work/source"
if [ -n "${LLMGW_WHEELS:-}" ]; then
    # a release's wheels/ (llmgw's wheel and every dependency's, `llmgw release build`): the image holds exactly them
    ls "$LLMGW_WHEELS"/llmgw-*.whl > /dev/null 2>&1 \
        || { echo "error: LLMGW_WHEELS=$LLMGW_WHEELS holds no llmgw-*.whl (give a release's wheels/ directory)" >&2; exit 1; }
    cp "$LLMGW_WHEELS"/*.whl "$work/context/wheels/"
    wheel=$(ls "$work/context/wheels"/llmgw-*.whl)
else
    # the wheel is built from a copy: setuptools builds in the source tree, and files left in an old build/ would go in
    tar -C "$tree" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' --exclude=./.state \
        --exclude=__pycache__ -cf - . | tar -C "$work/source" -xf -
    "$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/context/wheels" "$work/source" > /dev/null
    wheel=$(ls "$work/context/wheels"/llmgw-*.whl)
    "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: -c "$tree/constraints.txt" \
        -d "$work/context/wheels" "$wheel" 2> "$work/download.log" \
        || { grep -v "^WARNING" "$work/download.log" >&2; echo "error: pip download of llmgw's dependencies failed" >&2; exit 1; }
fi
version=$(basename "$wheel" | cut -d- -f2)

cp "$here/Containerfile" "$here/Containerfile.agent" "$work/context/"
"$@" build --quiet --pull=never --network none -f "$work/context/Containerfile" \
    -t "localhost/llmgw:$version" -t localhost/llmgw:latest "$work/context" > /dev/null
"$@" build --quiet --pull=never --network none -f "$work/context/Containerfile.agent" \
    --build-arg BASE="localhost/llmgw:$version" -t "localhost/llmgw-agent:$version" "$work/context" > /dev/null
echo "localhost/llmgw:$version localhost/llmgw-agent:$version"
